"""The result schema (headscope/result.py): head names, model slugs, score text, the layer x head
matrix."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from headscope.errors import HeadscopeError
from headscope.result import COLUMNS, FLOAT_FORMAT, Probe, fmt, head_name, matrix, model_slug


def test_columns_order():
    assert COLUMNS == [
        "model",
        "metric",
        "probe",
        "layer",
        "head",
        "head_name",
        "score",
        "chance",
        "n",
        "label",
    ]
    assert FLOAT_FORMAT % 0.123456789123 == "0.12345679"  # 8 significant digits


@pytest.mark.parametrize(
    "layer, head, expected", [(0, 0, "L0H0"), (17, 4, "L17H4"), (3.0, 2.0, "L3H2")]
)
def test_head_name(layer, head, expected):
    assert head_name(layer, head) == expected


def test_head_name_of_numpy_ints():
    import numpy as np

    assert head_name(np.int64(11), np.int32(5)) == "L11H5"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("HuggingFaceTB/SmolLM2-135M", "SmolLM2-135M"),  # org/name: the repo's name
        ("gpt2", "gpt2"),
        ("gpt2@step1000", "gpt2-step1000"),  # name@revision: '@' is not file-name safe
        ("EleutherAI/pythia-70m@step3000", "pythia-70m-step3000"),
        ("/tmp/my model/", "my-model"),  # a local folder: its name, spaces replaced
        ("./checkpoints/tiny_gpt2", "tiny_gpt2"),
        ("~/models/bert.base", "bert.base"),
        ("C:\\models\\gpt2", "C-models-gpt2"),  # backslashes are not separators on POSIX: replaced
        ("name@", "name"),  # trailing separators stripped
        # a revision with '/' stays whole (not just its last part)
        ("gpt2@refs/pr/3", "gpt2-refs-pr-3"),
        ("org/m@feature/x", "m-feature-x"),
        ("/", "model"),  # nothing left: a fallback
        ("модель", "model"),
    ],
)
def test_model_slug(name, expected):
    assert model_slug(name) == expected


@pytest.mark.parametrize("name", [".", "..", "a/..", "./", "..."])
def test_model_slug_of_dot_folders_is_a_real_name(name):
    """`headscope scan .` must not write into runs/. (= runs/) nor `show .` a hidden
    './.-L0H0.png'."""
    slug = model_slug(name)
    assert slug.strip(".") != "" and not slug.startswith(".")


def test_model_slug_of_the_current_folder_is_its_name(tmp_path, monkeypatch):
    (tmp_path / "my-ckpt").mkdir()
    monkeypatch.chdir(tmp_path / "my-ckpt")
    assert model_slug(".") == "my-ckpt" and model_slug("./") == "my-ckpt"


@pytest.mark.parametrize(
    "x, digits, expected",
    [
        (0.87961, 3, "0.880"),
        (1.0, 3, "1.000"),
        (0.5, 1, "0.5"),
        (2.0, 0, "2"),
        (-0.0004, 3, "-0.000"),
        (float("nan"), 3, "NaN"),
        (None, 3, "NaN"),
        (3, 2, "3.00"),  # an int is a score too
    ],
)
def test_fmt(x, digits, expected):
    assert fmt(x, digits) == expected


def long_table() -> pd.DataFrame:
    """2 layers x 3 heads of sink and induction, rows shuffled (matrix must not depend on order)."""
    rows = []
    for layer in range(2):
        for head in range(3):
            rows.append(
                {"metric": "sink", "layer": layer, "head": head, "score": layer + head / 10}
            )
            rows.append(
                {"metric": "induction", "layer": layer, "head": head, "score": -(layer * 3 + head)}
            )
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0).reset_index(drop=True)


def test_matrix_is_layers_by_heads():
    t = long_table()
    sink = matrix(t, "sink")
    assert list(sink.index) == [0, 1] and list(sink.columns) == [0, 1, 2]
    assert sink.to_numpy().tolist() == [[0.0, 0.1, 0.2], [1.0, 1.1, 1.2]]
    assert matrix(t, "induction").to_numpy().tolist() == [[0, -1, -2], [-3, -4, -5]]


def test_matrix_keeps_nan_scores():
    t = pd.DataFrame(
        {
            "metric": ["next_token"] * 2,
            "layer": [0, 1],
            "head": [0, 0],
            "score": [math.nan, math.nan],
        }
    )
    m = matrix(t, "next_token")
    assert m.shape == (2, 1) and m.isna().all().all()


def test_matrix_of_a_missing_metric_names_the_ones_there():
    with pytest.raises(
        HeadscopeError,
        match=r"^No rows for metric 'entropy'; this table has: "
        r"sink, induction\.$",
    ):
        matrix(long_table().sort_values("metric", ascending=False, kind="stable"), "entropy")


def test_probe_len_and_defaults():
    p = Probe("repeat", [[0, 1, 2, 1, 2], [0, 3, 4, 3, 4]], repeat_len=2)
    assert len(p) == 2 and p.settings == {} and p.repeat_len == 2
    assert Probe("text", []).settings is not Probe("text", []).settings  # no shared default dict
