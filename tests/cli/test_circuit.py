"""``headscope circuit`` as a user meets it: a run directory and its summary, and one line (exit 2,
nothing left behind) for every bad input."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from headscope.apps.settings import CircuitSettings
from headscope.cli.main import main
from tests.conftest import write_task

FAST = ["--bootstrap", "50", "--n-null", "4", "--quiet"]


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_writes_a_circuit_run_and_prints_its_summary(tmp_path, tiny_gpt2_dir, good_task):
    out = tmp_path / "run"
    res = run(
        "circuit",
        str(tiny_gpt2_dir),
        "--task",
        good_task,
        "--receivers",
        "logits,L1H0.k@A,L1H1.v",
        "--out",
        str(out),
        "--figure-format",
        "png,svg",
        *FAST,
    )
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.iterdir()}
    assert {"path.csv", "composition.csv", "agreement.csv", "report.html", "circuit.png"} <= names
    assert {"circuit.svg", "agreement.svg"} <= names  # every figure in each format
    assert "classes.csv" not in names  # not an IOI task: no classes
    path = pd.read_csv(out / "path.csv")
    assert set(path["receiver"]) == {"logits", "L1H0.k@A", "L1H1.v"}
    assert set(path["estimator"]) == {"exact", "attribution"}
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["run_format"] == "headscope-circuit/1" and meta["settings_changed"]["n_null"] == 4
    assert "into L1H0.k@A:" in res.stdout and "wrote" in res.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_help_lists_every_setting_of_the_config():
    res = run("circuit", "--help")
    assert res.exit_code == 0
    for f in dataclasses.fields(CircuitSettings):
        flag = "--" + f.name.replace("_", "-")
        assert flag in res.output, flag


def _refused(res, *words):
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("headscope: error:"), line
    for w in words:
        assert w in line, (w, line)


@pytest.mark.parametrize(
    "case",
    ["below", "kind", "layer0", "position", "outside", "lengths", "encoder", "direction", "exists"],
)
def test_bad_input_exits_2_with_one_line_and_leaves_nothing(
    case, tmp_path, tiny_gpt2_dir, tiny_bert_dir, words, good_task
):
    a, b = words[:2]
    out = tmp_path / "run"
    model, task, extra, expect = str(tiny_gpt2_dir), good_task, [], []
    if case == "below":
        extra = ["--receivers", "L1H0.q", "--senders", "L1H1"]
        expect = ["Sender L1H1 is in layer 1, not below receiver L1H0.q"]
    elif case == "kind":
        extra, expect = ["--receivers", "L1H0.key"], ["Unknown receiver input 'key'"]
    elif case == "layer0":
        extra, expect = ["--receivers", "L0H1.q"], ["in layer 0: no head lies below it"]
    elif case == "position":
        extra, expect = ["--receivers", "L1H0.q@B"], ["No position 'B'", "A, END"]
    elif case == "outside":
        extra, expect = ["--receivers", "L7H0.v"], ["Receiver L7H0.v is outside"]
    elif case == "lengths":
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
    elif case == "encoder":
        model, expect = str(tiny_bert_dir), ["encoder"]
    elif case == "direction":
        extra, expect = ["--direction", "nosing"], ["Did you mean: noising"]
    elif case == "exists":
        out.mkdir()
        (out / "mine.txt").write_text("keep me")
        expect = ["already exists"]
    res = run("circuit", model, "--task", task, "--out", str(out), *extra, *FAST)
    _refused(res, *expect)
    if case == "exists":
        assert (out / "mine.txt").read_text() == "keep me" and len(list(out.iterdir())) == 1
    else:
        assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_an_ioi_shaped_task_reads_its_evidence_from_a_scan(tmp_path, tiny_gpt2_dir, words, runs):
    a, b, c, d, e = words[:5]
    rows = [
        {
            "clean": f"the {x} and the {y} met the {y} and the",
            "corrupt": f"the {z} and the {w} met the {v} and the",
            "answer": " " + x,
            "wrong": " " + y,
            "positions": {"IO": 2, "S1": 5, "S2": 8},
        }
        for x, y, z, w, v in ((a, b, c, d, e), (b, c, d, e, a), (c, d, e, a, b))
    ]
    task = write_task(tmp_path / "ioi.jsonl", rows)
    out = tmp_path / "run"
    res = run(
        "circuit",
        str(tiny_gpt2_dir),
        "--task",
        task,
        "--scan",
        str(runs["gpt2"]),
        "--out",
        str(out),
        "--no-figures",
        *FAST,
    )
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["evidence"] == "given" and meta["scan"]["model"]
    evidence = pd.read_csv(out / "evidence.csv")
    scan = pd.read_csv(runs["gpt2"] / "scores.csv")
    want = scan[scan["metric"] == "induction"].set_index(["layer", "head"])["score"]
    got = evidence.set_index(["layer", "head"])["induction"]
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    assert len(classes) == 2 * 4 and "direct_effect" in classes  # tiny GPT-2: 2 layers x 4 heads
    assert set(pd.read_csv(out / "path.csv")["receiver"]) >= {"logits"}
