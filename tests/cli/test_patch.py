"""``headscope patch`` as a user meets it: the run directory, --scan beside it, and one line
(exit 2, nothing left behind) for every bad input."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from headscope.apps.settings import PatchSettings
from headscope.cli.main import main
from tests.conftest import write_task

FAST = ["--bootstrap", "50", "--quiet"]


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_writes_a_patching_run_and_prints_its_summary(tmp_path, tiny_gpt2_dir, good_task, runs):
    out = tmp_path / "run"
    res = run(
        "patch",
        str(tiny_gpt2_dir),
        "--task",
        good_task,
        "--activations",
        "z,v",
        "--positions",
        "all,A",
        "--estimator",
        "both",
        "--scan",
        str(runs["gpt2"]),
        "--out",
        str(out),
        "--figure-format",
        "png,svg",
        *FAST,
    )
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.iterdir()}
    assert {"z-all-denoising-exact.svg", "dla.svg"} <= names  # every figure in each format
    assert {
        "patching.csv",
        "baseline.csv",
        "dla.csv",
        "tokens.jsonl",
        "pattern_scores.csv",
        "metadata.json",
        "report.html",
        "z-all-denoising-exact.png",
        "dla.png",
    } <= names
    table = pd.read_csv(out / "patching.csv")
    assert set(table["activation"]) == {"z", "v"} and set(table["position"]) == {"all", "A"}
    assert set(table["kv_mode"]) == {
        "group",
        "head",
    }  # GPT-2 has no GQA: group rows = head rows, both kept
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["task_provenance"]["path"].endswith("mine.jsonl") and meta["scan"]["model"]
    assert (
        meta["settings"]["activations"] == ["z", "v"]
        and meta["settings_changed"]["estimator"] == "both"
    )
    page = (out / "report.html").read_text()
    assert "<th>induction</th>" in page and "<th>previous_token</th>" in page
    assert (
        "mine on" not in res.stdout
        and "clean - corrupt" in res.stdout
        and "z denoising at all" in res.stdout
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_help_lists_every_setting_of_the_config():
    res = run("patch", "--help")
    assert res.exit_code == 0
    for f in dataclasses.fields(PatchSettings):
        flag = "--" + f.name.replace("_", "-")
        assert flag in res.output, flag
    assert "--no-dla" in res.output and "--scan" in res.output and "--task" in res.output
    text = " ".join(res.output.split())
    assert "One of: auto, exact, attribution, both." in text and "[default: z]" in text


def _refused(res, *words):
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("headscope: error:"), line
    for w in words:
        assert w in line, (w, line)


@pytest.mark.parametrize(
    "case",
    [
        "lengths",
        "multi_token",
        "same",
        "kit",
        "metric",
        "activation",
        "encoder",
        "not_a_scan",
        "other_model_scan",
        "exists",
        "position",
    ],
)
def test_bad_input_exits_2_with_one_line_and_leaves_nothing(
    case, tmp_path, tiny_gpt2_dir, tiny_bert_dir, words, good_task, runs, tiny_gemma3_dir
):
    a, b, c = words[:3]
    out = tmp_path / "run"
    model, task, extra, expect = str(tiny_gpt2_dir), good_task, [], []
    if case == "lengths":
        task = write_task(
            tmp_path / "t.jsonl",
            [
                {
                    "clean": f"the {a}",
                    "corrupt": f"the {a} {a} {a}",
                    "answer": " " + a,
                    "wrong": " " + b,
                }
            ],
        )
        expect = ["Pair 0", "different lengths"]
    elif case == "multi_token":
        task = write_task(
            tmp_path / "t.jsonl",
            [
                {
                    "clean": f"the {a}",
                    "corrupt": f"the {b}",
                    "answer": f" {a}{b}zq",
                    "wrong": " " + b,
                }
            ],
        )
        expect = ["single token", "tokens for this tokenizer"]
    elif case == "same":
        task = write_task(
            tmp_path / "t.jsonl",
            [{"clean": f"the {a}", "corrupt": f"the {b}", "answer": " " + c, "wrong": " " + c}],
        )
        expect = ["same token"]
    elif case == "kit":
        task, expect = "ioj", ["Unknown task kit 'ioj'", "Did you mean: ioi?"]
    elif case == "metric":
        extra, expect = ["--metric", "logit_dif"], ["Did you mean: logit_diff?"]
    elif case == "activation":
        extra, expect = ["--activations", "z,vv"], ["Unknown activation 'vv'", "Did you mean: v?"]
    elif case == "position":
        extra, expect = ["--positions", "B"], ["Unknown position 'B'", "A, END"]
    elif case == "encoder":
        model, expect = str(tiny_bert_dir), ["encoder", "decoder with an LM head"]
    elif case == "not_a_scan":
        extra, expect = ["--scan", str(tmp_path)], ["not a headscope scan run"]
    elif case == "other_model_scan":
        other = tmp_path / "gemma-scan"
        assert (
            run(
                "scan",
                str(tiny_gemma3_dir),
                "--out",
                str(other),
                "--n-prompts",
                "2",
                "--repeat-len",
                "6",
                "--bootstrap",
                "0",
                "--quiet",
                "--no-figures",
            ).exit_code
            == 0
        )
        extra, expect = ["--scan", str(other)], ["is a run of", "give a scan of the same model"]
    elif case == "exists":
        out.mkdir()
        (out / "mine.txt").write_text("keep")
        expect = ["already exists", "--force"]
    before = sorted(p.name for p in tmp_path.iterdir())
    res = CliRunner().invoke(
        main, ["patch", model, "--task", task, "--out", str(out), *extra, *FAST]
    )
    _refused(res, *expect)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, nothing removed
    if case == "exists":
        assert (out / "mine.txt").read_text() == "keep"
