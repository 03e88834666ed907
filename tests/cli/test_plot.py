"""``headscope plot``: a saved run's figures redrawn without the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.image import imread

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


def test_plot_redraws_the_run_figures(cli, runs, tmp_path, no_model):
    run = runs["gpt2"]
    original = sorted(p.name for p in run.glob("*.png"))
    assert len(original) == 10  # 8 metrics + summary + thresholds
    result = invoke(cli, "plot", run, "--out", tmp_path / "again")
    assert result.exit_code == 0, result.output
    written = [Path(line) for line in result.stdout.splitlines()]
    assert sorted(p.name for p in written) == original
    assert all(p.parent == tmp_path / "again" for p in written)
    # same pixels: same data, same titles (n included)
    for name in ("induction.png", "summary.png"):
        a, b = imread(run / name), imread(tmp_path / "again" / name)
        assert a.shape == b.shape and np.abs(a - b).mean() < 1e-3


def test_plot_into_the_run_directory(cli, runs, no_model):
    run = runs["bert"]  # saved without figures
    assert not list(run.glob("*.png"))
    result = invoke(cli, "plot", run)
    assert result.exit_code == 0, result.output
    assert sorted(Path(p).name for p in result.stdout.splitlines()) == sorted(
        p.name for p in run.glob("*.png")
    )
    assert len(list(run.glob("*.png"))) == 10


def test_plot_missing_run(cli, tmp_path):
    line = one_error_line(invoke(cli, "plot", tmp_path / "nope"))
    assert "does not exist; give a directory written by `headscope scan`" in line
