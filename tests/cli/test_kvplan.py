"""``headscope kvplan`` end to end on tiny models: refusals write nothing, a run gets its plan,
a model's plan is checked before it is scanned."""

from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

import headscope
from headscope.cli.main import main
from tests.oracles import conformance as conf

LONG = ["sink", "streaming", "retrieval", "retrieval_soft"]


@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama with grouped-query attention (4 query heads, 2 KV heads), 256
    positions."""
    fam = next(f for f in conf.FAMILIES if f.model_type == "llama")
    hf, tok = conf.tiny_model(fam)
    return headscope.load_model(hf, tok, name="tiny-llama")


# ------------------------------------------------------------------------------ the KV plan


def test_kvplan_cli_refuses_bad_input_and_writes_nothing(tmp_path, llama):
    run = tmp_path / "run"
    runner = CliRunner()
    for args, msg in [
        (["--budgets", "0.5,1.5"], "in 0..1"),
        (["--budgets", "a"], "numbers separated by commas"),
        (["--window", "5000", "--seq-len", "256"], "keep every key"),
        (["--needle-tokens", "500", "--seq-len", "256"], "does not fit"),
        (["--seeds", "-1"], "seeds"),
    ]:
        r = runner.invoke(main, ["kvplan", str(run), *args])
        assert r.exit_code == 2 and msg in r.output and len(r.output.strip().splitlines()) == 1, (
            args,
            r.output,
        )
    assert not run.exists()
    (run).mkdir()
    (run / "notes.txt").write_text("mine")
    r = runner.invoke(main, ["kvplan", str(run)])
    assert (
        r.exit_code == 2 and "neither a headscope run directory nor a model checkpoint" in r.output
    )
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]


def test_kvplan_cli_writes_the_plan_into_the_run(tmp_path, tiny_gpt2_dir):
    from headscope.rundir.store import foreign_entries
    from headscope.scanner.config import ScanSettings
    from headscope.scanner.runner import scan_to_dir

    run = tmp_path / "run"
    scan_to_dir(
        str(tiny_gpt2_dir),
        run,
        ScanSettings(
            long_context=True, seq_len=128, n_prompts=2, window=16, needle_tokens=4, bootstrap=0
        ),
        figures=False,
    )
    args = [
        "kvplan",
        str(run),
        "--budgets",
        "0.5",
        "--seeds",
        "1",
        "--window",
        "16",
        "--seq-len",
        "128",
        "--texts",
        "1",
        "--depths",
        "0.5",
        "--needles-per-depth",
        "1",
        "--needle-tokens",
        "4",
        "-q",
    ]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (run / "kvplan").iterdir()) == [
        "kvplan.csv",
        "kvplan.json",
        "kvplan.md",
        "kvplan.png",
    ]
    df = pd.read_csv(run / "kvplan" / "kvplan.csv")
    assert list(df.condition) == [
        "full",
        "streaming_all",
        "window_all",
        "plan",
        "random",
        "random_kv",
    ]
    assert {"loss_delta_low", "loss_delta_high", "needle_low", "needle_high"} <= set(df.columns)
    assert foreign_entries(run) == []  # the plan counts as headscope's own inside the run
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2 and "already exists" in again.output
    assert CliRunner().invoke(main, [*args, "--force"]).exit_code == 0


def test_kvplan_cli_from_a_model_checks_the_plan_before_it_scans(tmp_path, tiny_gpt2_dir):
    out = tmp_path / "planned"
    small = [
        "--budgets",
        "0.5",
        "--seeds",
        "1",
        "--window",
        "16",
        "--seq-len",
        "128",
        "--depths",
        "0.5",
        "--needles-per-depth",
        "1",
        "--needle-tokens",
        "4",
        "-q",
    ]
    # far more held-out text than the corpus holds: refused before the scan writes its run directory
    r = CliRunner().invoke(
        main, ["kvplan", str(tiny_gpt2_dir), "--out", str(out), *small, "--texts", "100000"]
    )
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "distinct" in lines[0], r.output
    assert not out.exists()
    r = CliRunner().invoke(
        main, ["kvplan", str(tiny_gpt2_dir), "--out", str(out), *small, "--texts", "1"]
    )
    assert r.exit_code == 0, r.output
    assert (out / "scores.csv").is_file() and (out / "kvplan" / "kvplan.csv").is_file()
    scores = pd.read_csv(out / "scores.csv")
    assert {"streaming", "retrieval"} <= set(scores["metric"])
