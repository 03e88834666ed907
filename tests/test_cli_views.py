"""``headscope show / plot / compare`` through click, on a local group wired like the real one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from matplotlib.image import imread

from headscope.cli import _Group
from headscope.cli_views import compare, plot, show
from headscope.compare import load_runs, summary
from headscope.views import head_pattern

TEXT = "The river bank flooded."


@pytest.fixture(scope="module")
def cli():
    group = click.group(cls=_Group)(lambda: None)
    for command in (show, plot, compare):
        group.add_command(command)
    return group


def invoke(cli, *args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("headscope: error: "), result.stderr
    assert result.stderr.splitlines()[-1] == errors[0]  # only progress lines before it
    assert result.stdout == ""
    return errors[0]


# ------------------------------------------------------------------------------ show


def test_show_writes_png_and_html(cli, tiny_gpt2, tiny_gpt2_dir, tmp_path):
    out = tmp_path / "fig.png"
    result = invoke(cli, "show", tiny_gpt2_dir, "--head", "1.3", "--text", TEXT, "--out", out, "--html",
                    "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(out), str(out.with_suffix(".html"))]
    pixels = imread(out)
    assert pixels.ndim == 3 and min(pixels.shape[:2]) > 0 and pixels[..., :3].std() > 0.01  # not blank
    blob = re.search(r'id="hs-data">(.*?)</script>', out.with_suffix(".html").read_text(), re.S).group(1)
    data = json.loads(blob)
    expected = head_pattern(tiny_gpt2, TEXT, 1, 3)  # the same checkpoint, loaded by the fixture
    assert data["tokens"] == expected.tokens and (data["layer"], data["head"]) == (1, 3)
    np.testing.assert_allclose(np.array(data["pattern"]), expected.pattern, atol=1e-6)


def test_show_default_path(cli, tiny_gpt2_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(cli, "show", tiny_gpt2_dir, "--head", "L0H2", "--device", "cpu")
    assert result.exit_code == 0, result.output
    expected = f"{Path(tiny_gpt2_dir).name}-L0H2.png"
    assert result.stdout.strip() == expected and (tmp_path / expected).is_file()
    assert not (tmp_path / expected).with_suffix(".html").exists()


def test_show_malformed_head_fails_before_loading(cli, no_model):
    line = one_error_line(invoke(cli, "show", "smollm2-135m", "--head", "3-2"))
    assert line == "headscope: error: Head '3-2' is not LAYER.HEAD; write it like 3.2 (0-based layer, then head)."


def test_show_head_out_of_range(cli, tiny_gpt2_dir, tmp_path):
    line = one_error_line(invoke(cli, "show", tiny_gpt2_dir, "--head", "2.1", "--out", tmp_path / "x.png",
                                 "--device", "cpu"))
    assert "layers 0..1, heads 0..3; nearest valid: 1.1." in line
    assert not (tmp_path / "x.png").exists()


def test_show_bad_out_fails_before_loading(cli, no_model, tmp_path):
    line = one_error_line(invoke(cli, "show", "smollm2-135m", "--head", "1.1", "--out", tmp_path / "x.jpg"))
    assert "must end in .png, .svg, .pdf" in line


# ------------------------------------------------------------------------------ plot


def test_plot_redraws_the_run_figures(cli, runs, tmp_path, no_model):
    run = runs["gpt2"]
    original = sorted(p.name for p in run.glob("*.png"))
    assert len(original) == 10  # 8 metrics + summary + thresholds
    result = invoke(cli, "plot", run, "--out", tmp_path / "again")
    assert result.exit_code == 0, result.output
    written = [Path(line) for line in result.stdout.splitlines()]
    assert sorted(p.name for p in written) == original
    assert all(p.parent == tmp_path / "again" for p in written)
    for name in ("induction.png", "summary.png"):  # same pixels: same data, same titles (n included)
        a, b = imread(run / name), imread(tmp_path / "again" / name)
        assert a.shape == b.shape and np.abs(a - b).mean() < 1e-3


def test_plot_into_the_run_directory(cli, runs, no_model):
    run = runs["bert"]  # saved without figures
    assert not list(run.glob("*.png"))
    result = invoke(cli, "plot", run)
    assert result.exit_code == 0, result.output
    assert sorted(Path(p).name for p in result.stdout.splitlines()) == sorted(p.name for p in run.glob("*.png"))
    assert len(list(run.glob("*.png"))) == 10


def test_plot_missing_run(cli, tmp_path):
    line = one_error_line(invoke(cli, "plot", tmp_path / "nope"))
    assert "does not exist; give a directory written by `headscope scan`" in line


# ------------------------------------------------------------------------------ compare


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
    assert [p.name for p in written] == ["compare.csv", "distributions.png", "head_diffs.csv", "difference.png"]
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
    args = {"missing": [runs["gpt2"], tmp_path / "nope"], "same": [runs["gpt2"], runs["gpt2"]],
            "one": [runs["gpt2"]], "not-a-run": [runs["gpt2"], tmp_path / "plain"],
            "out-is-a-file": [runs["gpt2"], runs["bert"]]}[case]
    line = one_error_line(invoke(cli, "compare", *args, "--out", out))
    assert {"missing": "does not exist", "same": "are the same run directory",
            "one": "at least two run directories, got 1", "not-a-run": "no scores.csv",
            "out-is-a-file": "exists and is not a directory"}[case] in line
    assert not (tmp_path / "cmp").exists()


# ------------------------------------------------------------------------------ show --layer


def test_show_layer_writes_every_head_of_the_layer(cli, tiny_gpt2, tiny_gpt2_dir, tmp_path):
    out = tmp_path / "layer.png"
    result = invoke(cli, "show", tiny_gpt2_dir, "--layer", "1", "--text", TEXT, "--out", out, "--html",
                    "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(out), str(out.with_suffix(".html"))]
    assert imread(out)[..., :3].std() > 0.01  # not blank
    page = out.with_suffix(".html").read_text()
    data = json.loads(re.search(r'id="hs-data">(.*?)</script>', page, re.S).group(1))
    assert data["layer"] == 1 and data["heads"] == ["L1H0", "L1H1", "L1H2", "L1H3"]
    for h in range(4):  # every head is the one-head view's pattern
        np.testing.assert_allclose(np.array(data["patterns"][h]), head_pattern(tiny_gpt2, TEXT, 1, h).pattern, atol=1e-6)
    assert data["tokens"] == head_pattern(tiny_gpt2, TEXT, 1, 0).tokens


def test_show_layer_default_path_and_refusals(cli, tiny_gpt2_dir, tmp_path, monkeypatch, no_model):
    line = one_error_line(invoke(cli, "show", "smollm2-135m"))
    assert "Give exactly one of --head L.H (one head) or --layer L" in line
    line = one_error_line(invoke(cli, "show", "smollm2-135m", "--head", "1.1", "--layer", "1"))
    assert "Give exactly one of" in line
    assert "Layer -1 is negative" in one_error_line(invoke(cli, "show", "smollm2-135m", "--layer", "-1"))
    assert "must end in .png" in one_error_line(invoke(cli, "show", "smollm2-135m", "--layer", "1", "--out",
                                                       tmp_path / "x.jpg"))
    assert list(tmp_path.iterdir()) == []


def test_show_layer_out_of_range_names_the_layers(cli, tiny_gpt2_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(invoke(cli, "show", tiny_gpt2_dir, "--layer", "7", "--device", "cpu"))
    assert line.endswith("Layer 7 is out of range: the model has layers 0..1; nearest valid: 1.")
    assert list(tmp_path.iterdir()) == []
    result = invoke(cli, "show", tiny_gpt2_dir, "--layer", "0", "--device", "cpu")
    assert result.exit_code == 0 and result.stdout.strip() == f"{Path(tiny_gpt2_dir).name}-L0.png"
