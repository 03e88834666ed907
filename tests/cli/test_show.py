"""``headscope show``: one head's or one layer's pattern drawn, refusals before the model loads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.image import imread

from headscope.apps.show import head_pattern
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


def test_show_writes_png_and_html(cli, tiny_gpt2, tiny_gpt2_dir, tmp_path):
    out = tmp_path / "fig.png"
    result = invoke(
        cli,
        "show",
        tiny_gpt2_dir,
        "--head",
        "1.3",
        "--text",
        TEXT,
        "--out",
        out,
        "--html",
        "--device",
        "cpu",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(out), str(out.with_suffix(".html"))]
    pixels = imread(out)
    # not blank
    assert pixels.ndim == 3 and min(pixels.shape[:2]) > 0 and pixels[..., :3].std() > 0.01
    blob = re.search(
        r'id="hs-data">(.*?)</script>', out.with_suffix(".html").read_text(), re.S
    ).group(1)
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
    assert line == (
        "headscope: error: Head '3-2' is not LAYER.HEAD; "
        "write it like 3.2 (0-based layer, then head)."
    )


def test_show_head_out_of_range(cli, tiny_gpt2_dir, tmp_path):
    line = one_error_line(
        invoke(
            cli,
            "show",
            tiny_gpt2_dir,
            "--head",
            "2.1",
            "--out",
            tmp_path / "x.png",
            "--device",
            "cpu",
        )
    )
    assert "layers 0..1, heads 0..3; nearest valid: 1.1." in line
    assert not (tmp_path / "x.png").exists()


def test_show_bad_out_fails_before_loading(cli, no_model, tmp_path):
    line = one_error_line(
        invoke(cli, "show", "smollm2-135m", "--head", "1.1", "--out", tmp_path / "x.jpg")
    )
    assert "must end in .png, .svg, .pdf" in line


def test_show_layer_writes_every_head_of_the_layer(cli, tiny_gpt2, tiny_gpt2_dir, tmp_path):
    out = tmp_path / "layer.png"
    result = invoke(
        cli,
        "show",
        tiny_gpt2_dir,
        "--layer",
        "1",
        "--text",
        TEXT,
        "--out",
        out,
        "--html",
        "--device",
        "cpu",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(out), str(out.with_suffix(".html"))]
    assert imread(out)[..., :3].std() > 0.01  # not blank
    page = out.with_suffix(".html").read_text()
    data = json.loads(re.search(r'id="hs-data">(.*?)</script>', page, re.S).group(1))
    assert data["layer"] == 1 and data["heads"] == ["L1H0", "L1H1", "L1H2", "L1H3"]
    for h in range(4):  # every head is the one-head view's pattern
        np.testing.assert_allclose(
            np.array(data["patterns"][h]), head_pattern(tiny_gpt2, TEXT, 1, h).pattern, atol=1e-6
        )
    assert data["tokens"] == head_pattern(tiny_gpt2, TEXT, 1, 0).tokens


def test_show_layer_default_path_and_refusals(cli, tiny_gpt2_dir, tmp_path, monkeypatch, no_model):
    line = one_error_line(invoke(cli, "show", "smollm2-135m"))
    assert "Give exactly one of --head L.H (one head) or --layer L" in line
    line = one_error_line(invoke(cli, "show", "smollm2-135m", "--head", "1.1", "--layer", "1"))
    assert "Give exactly one of" in line
    assert "Layer -1 is negative" in one_error_line(
        invoke(cli, "show", "smollm2-135m", "--layer", "-1")
    )
    assert "must end in .png" in one_error_line(
        invoke(cli, "show", "smollm2-135m", "--layer", "1", "--out", tmp_path / "x.jpg")
    )
    assert list(tmp_path.iterdir()) == []


def test_show_layer_out_of_range_names_the_layers(cli, tiny_gpt2_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(invoke(cli, "show", tiny_gpt2_dir, "--layer", "7", "--device", "cpu"))
    assert line.endswith("Layer 7 is out of range: the model has layers 0..1; nearest valid: 1.")
    assert list(tmp_path.iterdir()) == []
    result = invoke(cli, "show", tiny_gpt2_dir, "--layer", "0", "--device", "cpu")
    assert result.exit_code == 0 and result.stdout.strip() == f"{Path(tiny_gpt2_dir).name}-L0.png"
