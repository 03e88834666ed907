"""``headscope qk``: the run directory holds what the functions compute; bad input exits 2 in one
line with nothing written."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from headscope.apps.qk import qk
from headscope.apps.settings import QKSettings
from headscope.cli.main import main


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_writes_a_qk_run_whose_tables_are_the_functions(tmp_path, tiny_gpt2_dir, tiny_gpt2):
    out = tmp_path / "qk"
    args = ["--heads", "L1H0,L1H1", "--query", "all", "--key", "argmax", "--n-prompts", "3",
            "--seq-len", "12", "--bootstrap", "50", "--top", "5", "--knockouts", "2"]  # fmt: skip
    r = run("qk", str(tiny_gpt2_dir), *args, "--out", str(out), "-q")
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["run_format"] == "headscope-qk/1"
    for f in ("qk.csv", "sides.csv", "knockouts.csv", "subspaces.csv", "heads.csv", "tables.npz",
              "tokens.jsonl",
              "report.html", "map_L1H0.png"):  # fmt: skip
        assert (out / f).exists(), f
    pairs = pd.read_csv(out / "qk.csv")
    want = qk(tiny_gpt2, QKSettings(heads=("L1H0", "L1H1"), query="all", n_prompts=3, seq_len=12,
                                    bootstrap=50, top=5, knockouts=2))  # fmt: skip
    np.testing.assert_allclose(pairs["contribution"], want["pairs"]["contribution"], rtol=1e-6)
    assert len(pairs) == 10 and len(pd.read_csv(out / "knockouts.csv")) == 4
    heads = pd.read_csv(out / "heads.csv")
    tables = np.load(out / "tables.npz")
    for _, h in heads.iterrows():  # the whole table adds up to the mean logit
        assert abs(tables[h["head"]].sum() - h["logit"]) < 1e-4
    assert len((out / "tokens.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize(
    "args,says",
    [
        (["--key", "IO"], "Unknown key rule 'IO'"),
        (["--query", "middle"], "Unknown query rule 'middle'"),
        (["--heads", "L9H0"], "Head L9H0 is outside"),
        (["--heads", "X1"], "Cannot read head 'X1'"),
        (["--probe", "nope"], "Unknown probe (--probe)"),
        (["--query", "2", "--key", "5"], "comes after its query"),
    ],
)
def test_bad_input_exits_2_in_one_line_writing_nothing(tmp_path, tiny_gpt2_dir, args, says):
    out = tmp_path / "qk"
    r = CliRunner().invoke(main, ["qk", str(tiny_gpt2_dir), "--out", str(out), "--n-prompts", "2",
                                  "--seq-len", "10", "-q", *args])  # fmt: skip
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0], r.output
    assert not out.exists()


def test_figure_formats_are_honoured(tmp_path, tiny_gpt2_dir):
    out = tmp_path / "qk"
    r = run("qk", str(tiny_gpt2_dir), "--heads", "L1H0", "--n-prompts", "2", "--seq-len", "8",
            "--bootstrap", "0", "--figure-format", "svg", "--out", str(out), "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert (out / "map_L1H0.svg").exists() and not (out / "map_L1H0.png").exists()
    assert (out / "report.html").exists()


def test_a_head_outside_the_model_is_refused_before_it_loads(tmp_path, tiny_gpt2_dir, monkeypatch):
    import headscope.models.loading as loading

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the heads were checked")

    monkeypatch.setattr(loading, "load_model", no_load)
    out = tmp_path / "qk"
    r = CliRunner().invoke(main, ["qk", str(tiny_gpt2_dir), "--heads", "L1H0,L2H9", "--out",
                                  str(out), "-q"])  # fmt: skip
    assert r.exit_code == 2 and "Head L2H9 is outside" in r.output, r.output
    assert not out.exists()
