"""``headscope icl``: the run directory holds what the functions compute, on a tiny model; bad
input exits 2 in one line with nothing written."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from headscope.apps.icl import icl
from headscope.cli.main import main
from tests.icl_helpers import tiny_settings, write_task


def _args(settings: dict) -> list[str]:
    out = []
    for k, v in settings.items():
        v = ",".join(map(str, v)) if isinstance(v, tuple) else str(v)
        out += [f"--{k.replace('_', '-')}", v]
    return out


def test_writes_an_icl_run_whose_tables_are_the_functions(tmp_path, tiny_gpt2_dir, tiny_gpt2):
    settings = tiny_settings(write_task(tmp_path))
    out = tmp_path / "icl"
    r = CliRunner().invoke(main, ["icl", str(tiny_gpt2_dir), *_args(settings), "--out", str(out),
                                  "-q"], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["run_format"] == "headscope-icl/1"
    for f in ("tasks.csv", "fv_tasks.csv", "fv_heads.csv", "comparison.csv", "ablations.csv",
              "fv_vector.csv", "scores.csv", "prompts.jsonl", "means.pt", "summary.md",
              "report.html", "fv_vs_induction.png", "ablations.png"):  # fmt: skip
        assert (out / f).exists(), f
    want = icl(tiny_gpt2, **settings)
    heads = pd.read_csv(out / "fv_heads.csv")
    np.testing.assert_allclose(heads["fv"], want["heads"]["fv"], rtol=1e-6, atol=1e-9)
    assert heads["fv"].abs().max() > 0  # the heads move the answer at all
    scores = pd.read_csv(out / "scores.csv")
    assert set(scores["metric"]) == {"fv", "fv.opposites"}
    assert len(scores) == 2 * tiny_gpt2.n_layers * tiny_gpt2.n_heads
    # the FV score is the tasks' mean of the prompts' mean indirect effects (one task here)
    per = pd.read_csv(out / "fv_tasks.csv")
    np.testing.assert_allclose(per["aie"], heads["fv"], rtol=1e-9, atol=1e-12)
    prompts = [json.loads(x) for x in (out / "prompts.jsonl").read_text().splitlines()]
    kinds = {p["kind"] for p in prompts}
    assert kinds == {"baseline_few_shot", "baseline_zero_shot", "mean", "shuffled", "test",
                     "zero_shot_test"}  # fmt: skip
    vec = pd.read_csv(out / "fv_vector.csv")
    assert list(vec["task"]) == ["opposites", "all (mean over tasks)"]
    means = torch.load(out / "means.pt")
    assert means["opposites"].shape[:2] == (tiny_gpt2.n_layers, tiny_gpt2.n_heads)
    abl = pd.read_csv(out / "ablations.csv")
    assert {"none", "fv", "induction", "random"} <= set(abl["ranking"])
    n_heads = tiny_gpt2.n_layers * tiny_gpt2.n_heads
    excluding = abl["ranking"].str.contains("_excluding_")
    assert (abl.loc[excluding, "excluded"] == int(0.02 * n_heads)).all()
    assert (abl.loc[~excluding, "excluded"] == 0).all()
    assert (abl.loc[abl["ranking"] == "fv", "k"].tolist()
            == [max(1, int(f * n_heads)) for f in settings["fractions"]])  # fmt: skip


@pytest.mark.parametrize(
    "extra,says",
    [
        (["--tasks", "antonyms"], "Unknown ICL task 'antonyms'"),
        (["--fractions", "0.5,2"], "are shares of the heads in (0, 1]"),
        (["--filter", "some"], "Unknown filter (--filter) 'some'"),
        (["--shots", "0"], "must be at least 1"),
        (["--tasks", "BAD"], "an ICL task is a JSON list"),
        (["--tasks", "BLANK"], "no pair has an answer"),
    ],
)
def test_bad_input_exits_2_in_one_line_writing_nothing(tmp_path, tiny_gpt2_dir, extra, says):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"question": "hot", "answer": "cold"}]))
    blank = tmp_path / "blank.json"
    blank.write_text(json.dumps([{"input": f"w{i}", "output": " "} for i in range(20)]))
    extra = [{"BAD": str(bad), "BLANK": str(blank)}.get(x, x) for x in extra]
    out = tmp_path / "icl"
    r = CliRunner().invoke(main, ["icl", str(tiny_gpt2_dir), "--out", str(out), "-q", *extra])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0], r.output
    assert not out.exists()


def test_an_encoder_is_refused_in_one_line(tmp_path, tiny_bert_dir):
    settings = tiny_settings(write_task(tmp_path))
    out = tmp_path / "icl"
    r = CliRunner().invoke(main, ["icl", str(tiny_bert_dir), *_args(settings), "--out", str(out),
                                  "-q"])  # fmt: skip
    assert r.exit_code == 2 and "is an encoder" in r.output, r.output
    assert len([x for x in r.output.splitlines() if x.strip()]) == 1
    assert not out.exists()
