"""ScanSettings: the one home of a scan's defaults and of every check that needs neither the model
nor a file, run once, when the object is made; the CLI's options are its fields."""

from __future__ import annotations

import pytest

from headscope.errors import HeadscopeError
from headscope.metrics import REGISTRY
from headscope.scanner.config import ScanSettings, parse_thresholds


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_prompts": 0}, r"^n_prompts \(--n-prompts\) must be at least 1, got 0\.$"),
        ({"repeat_len": -1}, r"^repeat_len \(--repeat-len\) must be at least 1, got -1\.$"),
        ({"batch_size": 0}, r"^batch_size \(--batch-size\) must be at least 1, got 0\.$"),
        ({"seq_len": 0}, r"^seq_len \(--seq-len\) must be at least 1, got 0\.$"),
        ({"engine": "fsued"}, r"^Unknown engine 'fsued'\. Did you mean: fused\?"),
        ({"metrics": ("sink", "entropi")}, r"^Unknown metric 'entropi'\. Did you mean: entropy\?"),
        ({"metrics": (" ",)}, r"^metrics \(--metrics\) is empty"),
        ({"thresholds": {"inductoin": 0.5}}, r"Did you mean: induction\?"),
        ({"thresholds": {"induction": float("nan")}}, r"must be a number"),
        (
            {"text_join": "chatml"},
            r"^Unknown text_join \(--text-join\) 'chatml'\. Did you mean: chat\? "
            r"Use one of plain, chat\.$",
        ),
        (
            {"text_join": "chat", "seq_len": 64},
            r"^text_join \(--text-join\) chat and token_types "
            r"\(--token-types\) shape "
            r"the pair probe; seq_len \(--seq-len\) packs text "
            r"instead\.",
        ),
        (
            {"token_types": True, "seq_len": 64},
            r"seq_len \(--seq-len\) packs text instead\. Use one or "
            r"the other\.$",
        ),
    ],
)
def test_every_check_is_one_line(kwargs, message):
    with pytest.raises(HeadscopeError, match=message) as exc:
        ScanSettings(**kwargs)
    assert "\n" not in str(exc.value)


def test_the_file_checks_run_where_the_probes_are_built(tmp_path):
    """Reading the prompts file is not a side effect of making the settings: it happens (still
    before
    any model loads) when the probes' size is worked out."""
    from headscope.probes.defaults import n_prompts

    assert ScanSettings(prompts="/nonexistent/pairs.tsv").prompts == "/nonexistent/pairs.tsv"
    with pytest.raises(HeadscopeError, match=r"does not exist"):
        n_prompts(ScanSettings(prompts="/nonexistent/pairs.tsv"))
    with pytest.raises(
        HeadscopeError,
        match=r"^n_prompts \(--n-prompts\) 1000 asks for more pairs "
        r"than the built-in "
        r"corpus holds \(68\); use at most 68\.$",
    ):
        n_prompts(ScanSettings(n_prompts=1000))
    two = tmp_path / "two.tsv"
    two.write_text("# a comment\nA one.\tB one.\n\nA two.\tB two.\n")
    heard = []
    # the default: at most 64, the file's 2
    assert n_prompts(ScanSettings(prompts=str(two)), heard.append) == 2
    assert heard and "holds 2 pairs: scanning 2" in heard[0]
    assert n_prompts(ScanSettings()) == 64
    assert n_prompts(ScanSettings(n_prompts=1000, seq_len=64)) == 1000
    # no text probe, no pair limit
    assert n_prompts(ScanSettings(n_prompts=1000, metrics=("induction",))) == 1000


def test_names_match_without_case():
    config = ScanSettings(
        metrics=("Induction", "SINK"), thresholds={"Induction": 0.3}, engine="Blocked"
    )
    assert config.metrics == ("induction", "sink") and config.thresholds == {"induction": 0.3}
    assert config.engine == "blocked"


def test_a_config_that_exists_is_valid_and_replace_checks_again():
    from dataclasses import replace

    with pytest.raises(HeadscopeError, match="must be at least 1"):
        replace(ScanSettings(), repeat_len=0)


def test_what_passes_and_what_it_means():
    assert [m.name for m in ScanSettings().metric_objects()] == [
        m.name for m in REGISTRY.values() if m.default
    ]
    assert [m.name for m in ScanSettings(metrics=(" sink", "induction ")).metric_objects()] == [
        "sink",
        "induction",
    ]
    assert ScanSettings(metrics=("induction",)).probe_names() == ["repeat"]
    assert ScanSettings(metrics=("induction", "sink")).probe_names() == ["text", "repeat"]
    record = ScanSettings(metrics=("sink",), thresholds={"sink": 0.2}).record()
    assert record == {
        "n_prompts": None,
        "repeat_len": 50,
        "seed": 0,
        "seq_len": None,
        "prompts": None,
        "text_join": "plain",
        "token_types": False,
        "long_context": False,
        "sinks": 4,
        "window": 64,
        "needle_tokens": 8,
        "metrics": ["sink"],
        "thresholds": {"sink": 0.2},
        "engine": "auto",
        "batch_size": None,
        "null": True,
        "examples": True,
        "effects": None,
        "ablation": "mean",
        "effects_sequences": 16,
        "effects_batch_size": None,
        "bootstrap": 1000,
        "ci": 0.95,
        "device": "auto",
        "device_map": None,
        "max_memory": None,
        "dtype": None,
        "threads": None,
        "ray": None,
        "workers": None,
    }


def test_every_setting_is_an_option_of_scan_and_back():
    """The scan command's options are made from the fields: one per field, with the field's help,
    and
    what was typed comes back as the same settings."""
    from click.testing import CliRunner

    from headscope.cli.main import main
    from headscope.cli.options import config_from, option_name
    from headscope.cli.scan import scan

    params = {p.name: p for p in scan.params}
    from dataclasses import fields

    for f in fields(ScanSettings):
        assert f.name in params, f"no --option for {f.name}"
        assert f.metadata["help"].split(" [")[0][:40] in (params[f.name].help or "")
        assert option_name(f) in params[f.name].opts or any(
            o.startswith(option_name(f)) for o in params[f.name].opts
        )
    typed = {
        "metrics": "Sink,induction",
        "thresholds": ("sink=0.2",),
        "max_memory": None,
        "effects": "exact",
        "n_prompts": 3,
        "null": False,
    }
    assert config_from(ScanSettings, typed) == ScanSettings(
        metrics=("sink", "induction"),
        thresholds={"sink": 0.2},
        effects="exact",
        n_prompts=3,
        null=False,
    )
    help_text = CliRunner().invoke(main, ["scan", "--help"]).output
    assert (
        "--no-null" in help_text
        and "--threshold METRIC=VALUE" in help_text
        and "--effects [MODE]" in help_text
    )


def test_parse_thresholds():
    assert parse_thresholds(["induction=0.6", " sink = 0.25"]) == {"induction": 0.6, "sink": 0.25}
    with pytest.raises(HeadscopeError, match=r"^Threshold 'induction' must look like METRIC=VALUE"):
        parse_thresholds(["induction"])
    with pytest.raises(HeadscopeError, match="'high' is not a number"):
        parse_thresholds(["induction=high"])
