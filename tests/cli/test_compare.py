"""``headscope compare``: saved runs side by side, the table printed and written, bad input
refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from headscope.apps.compare import load_runs, summary
from headscope.cli.main import main

TEXT = "The river bank flooded."


@pytest.fixture(scope="module")
def cli():
    return main


def invoke(cli, *args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("headscope: error: "), result.stderr
    assert result.stderr.splitlines()[-1] == errors[0]  # only progress lines before it
    assert result.stdout == ""
    return errors[0]


# ------------------------------------------------------------------------------ show --layer


def test_compare_prints_and_writes_the_table(cli, runs, tmp_path, no_model):
    out = tmp_path / "cmp"
    result = invoke(cli, "compare", runs["gpt2"], runs["bert"], "--out", out)
    assert result.exit_code == 0, result.output
    table = summary(load_runs([runs["gpt2"], runs["bert"]]))
    lines = result.stdout.splitlines()
    for r in table.itertuples():  # one line per (metric, run) with the numbers of the table
        row = next(line for line in lines if line.split()[:2] == [r.metric, r.run])
        fields = row.split()
        for got, want in zip(fields[2:4], (r.max, r.mean), strict=True):
            assert got == ("NaN" if np.isnan(want) else f"{want:.3f}")
        assert fields[4] == f"{r.labelled}/{r.heads}"
    assert any(line.startswith("largest per-head differences") for line in lines)  # both 2 x 4
    written = [Path(line) for line in lines if line.startswith(str(out))]
    # tables first
    assert [p.name for p in written] == [
        "compare.csv",
        "head_diffs.csv",
        "distributions.png",
        "difference.png",
    ]
    back = pd.read_csv(out / "compare.csv", keep_default_na=False, na_values=["NaN"])
    pd.testing.assert_frame_equal(back, table, check_dtype=False, rtol=1e-7)


def test_compare_default_out(cli, runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(cli, "compare", runs["gpt2"], runs["bert"], "--top", "0")
    assert result.exit_code == 0, result.output
    labels = list(load_runs([runs["gpt2"], runs["bert"]]))
    assert (tmp_path / f"compare-{labels[0]}-vs-{labels[1]}" / "compare.csv").is_file()
    assert "largest per-head differences" not in result.stdout


@pytest.mark.parametrize("case", ["missing", "same", "one", "not-a-run", "out-is-a-file"])
def test_compare_bad_input(cli, runs, tmp_path, case):
    (tmp_path / "plain").mkdir()
    (tmp_path / "file.txt").write_text("x")
    out = tmp_path / ("file.txt" if case == "out-is-a-file" else "cmp")
    args = {
        "missing": [runs["gpt2"], tmp_path / "nope"],
        "same": [runs["gpt2"], runs["gpt2"]],
        "one": [runs["gpt2"]],
        "not-a-run": [runs["gpt2"], tmp_path / "plain"],
        "out-is-a-file": [runs["gpt2"], runs["bert"]],
    }[case]
    line = one_error_line(invoke(cli, "compare", *args, "--out", out))
    assert {
        "missing": "does not exist",
        "same": "are the same run directory",
        "one": "at least two run directories, got 1",
        "not-a-run": "no scores.csv",
        "out-is-a-file": "exists and is not a directory",
    }[case] in line
    assert not (tmp_path / "cmp").exists()
