"""The cross-model atlas (lib.atlas): relative depth, depth bins, summaries,
figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgb

import headscope
from headscope.errors import HeadscopeError
from lib.atlas import (
    ATLAS_COLUMNS,
    atlas,
    atlas_figure,
    depth_bins,
    depth_summary,
    layer_profile,
)


def _table(
    model: str,
    n_layers: int,
    n_heads: int = 2,
    metric: str = "induction",
    label: str = "induction head",
    threshold: float = 0.5,
) -> pd.DataFrame:
    rows = []
    for layer in range(n_layers):
        for head in range(n_heads):
            score = (layer + 1) / n_layers * (head + 1) / n_heads  # grows with depth and head
            rows.append(
                dict(
                    model=model,
                    metric=metric,
                    layer=layer,
                    head=head,
                    head_name=f"L{layer}H{head}",
                    score=score,
                    chance=0.01,
                    n=10,
                    label=label if score >= threshold else "",
                )
            )
    return pd.DataFrame(rows)


def test_relative_depth_and_bins_across_models_of_different_depth():
    a = atlas({"six": _table("x", 6), "thirty": _table("y", 30)})
    assert list(a.columns) == list(ATLAS_COLUMNS)
    # the mapping's names win over the tables' model column
    assert set(a["model"]) == {"six", "thirty"}
    six = a[a.model == "six"].drop_duplicates("layer")
    np.testing.assert_allclose(six["depth"], [0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert list(six["depth_bin"]) == ["early", "early", "middle", "middle", "late", "late"]
    thirty = a[a.model == "thirty"].drop_duplicates("layer")
    assert thirty.groupby("depth_bin", observed=True).size().to_dict() == {
        "early": 10,
        "middle": 10,
        "late": 10,
    }
    assert (
        (a["labelled"] == (a["label"] != "")).all()
        and a["labelled"].any()
        and not a["labelled"].all()
    )


def test_depth_summary_fractions_and_means():
    a = atlas([_table("m6", 6), _table("m30", 30)])
    s = depth_summary(a)
    assert list(s[["depth_bin", "model"]].itertuples(index=False, name=None)) == [
        ("early", "m6"),
        ("early", "m30"),
        ("middle", "m6"),
        ("middle", "m30"),
        ("late", "m6"),
        ("late", "m30"),
    ]
    # layers 4, 5: scores 5/6*{.5, 1}, 1*{.5, 1}
    late6 = a[(a.model == "m6") & (a.depth_bin == "late")]
    row = s[(s.model == "m6") & (s.depth_bin == "late")].iloc[0]
    # 5/12 < 0.5
    assert (
        row["heads"] == 4
        and row["frac_labelled"] == pytest.approx(late6["labelled"].mean()) == 0.75
    )
    assert row["mean_score"] == pytest.approx((5 / 12 + 5 / 6 + 0.5 + 1) / 4)
    early6 = s[(s.model == "m6") & (s.depth_bin == "early")].iloc[0]
    assert early6["frac_labelled"] == 0.0 and early6["max_score"] == pytest.approx(2 / 6)
    # deeper bins score higher in these tables, in both models
    for _, g in s.groupby("model"):
        assert g["mean_score"].is_monotonic_increasing


def test_runs_from_disk_use_their_metadata(runs):
    """Saved runs (tiny GPT-2 and BERT, 2 layers each): read by path, named by their model."""
    a = atlas([runs["gpt2"], headscope.load_run(runs["bert"])], metrics=["sink", "next_token"])
    assert set(a["metric"]) == {"sink", "next_token"} and a["model"].nunique() == 2
    assert (a["n_layers"] == 2).all() and set(a["depth"]) == {0.0, 1.0}
    s = depth_summary(a)
    gpt2 = a["model"].iloc[0]
    nxt = s[(s.metric == "next_token") & (s.model == gpt2)]
    assert len(nxt) == 2 and nxt["mean_score"].isna().all()  # causal: NaN kept, not dropped
    prof = layer_profile(a)
    assert len(prof) == 2 * 2 * 2  # model x metric x layer
    fig = atlas_figure(a, stat="frac_labelled")
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 2


def test_bad_input_is_one_line(tmp_path):
    with pytest.raises(HeadscopeError, match="no runs given"):
        atlas([])
    with pytest.raises(HeadscopeError, match="given twice"):
        atlas([_table("m", 2), _table("m", 3)])
    with pytest.raises(HeadscopeError, match="lacks column"):
        atlas([pd.DataFrame({"metric": ["sink"], "layer": [0]})])
    with pytest.raises(HeadscopeError, match="no rows for copying"):
        atlas([_table("m", 2)], metrics=["copying"])
    with pytest.raises(HeadscopeError, match="2 model names"):
        atlas([pd.concat([_table("a", 2), _table("b", 2)])])
    with pytest.raises(HeadscopeError, match="not an atlas table"):
        depth_summary(_table("m", 2))
    with pytest.raises(HeadscopeError, match="unknown stat"):
        atlas_figure(atlas([_table("m", 2)]), stat="median")
    with pytest.raises(
        HeadscopeError, match="not a headscope run directory|No such|does not exist"
    ):
        atlas([tmp_path])
    with pytest.raises(HeadscopeError, match="bins must be at least 1"):
        depth_bins([0.5], 0)


def test_other_bin_counts():
    assert list(depth_bins([0.0, 0.49, 0.5, 1.0], 2)) == ["early", "early", "late", "late"]
    assert list(depth_bins([0.0, 0.26, 0.99, 1.0], 4)) == ["d1", "d2", "d4", "d4"]


def test_figure_keeps_coinciding_chance_lines_apart_and_names_units():
    """Two models with the same chance value: two dash patterns, both values in the title, one
    key below the panels; entropy's axis says nats."""
    ind = atlas([_table("a", 3), _table("b", 4)])
    ent = atlas(
        [
            _table("a", 3, metric="entropy", label="focused head"),
            _table("b", 4, metric="entropy", label="focused head"),
        ]
    )
    fig = atlas_figure(pd.concat([ind, ent], ignore_index=True), metrics=["induction", "entropy"])
    ax_ind, ax_ent = [ax for ax in fig.axes if ax.get_visible()]
    assert ax_ind.get_title() == "induction\nchance 0.010 / 0.010"
    chance = [line for line in ax_ind.lines if set(line.get_ydata()) == {0.01}]
    assert len(chance) == 2 and chance[0]._dash_pattern != chance[1]._dash_pattern
    assert ax_ent.get_ylabel() == "mean over the layer's heads (nats; low = focused)"
    assert ax_ind.get_ylabel() == "mean over the layer's heads"
    assert fig.get_suptitle().startswith("per-layer mean over each layer's heads")
    assert ax_ind.get_legend() is None and len(fig.legends) == 1
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[:4] == ["a", "b", "chance, a", "chance, b"]
    assert fig.legends[0].get_title().get_text().endswith("in the order a / b")
    # the depth thirds named on the axis itself, at the middle of each third
    top = ax_ind.child_axes[0]
    assert [t.get_text() for t in top.get_xticklabels()] == ["early", "middle", "late"]
    assert list(top.get_xticks()) == pytest.approx([1 / 6, 1 / 2, 5 / 6])


def test_figure_shades_each_layer_means_interval_where_given():
    """Intervals for model a only: one band for a, none for b, and a key saying what it is."""
    table = atlas([_table("a", 3), _table("b", 4)])
    ci = pd.DataFrame(
        {
            "model": "a",
            "metric": "induction",
            "layer": [0, 1, 2],
            "ci_low": [0.1, 0.2, 0.3],
            "ci_high": [0.2, 0.5, 0.9],
        }
    )
    fig = atlas_figure(table, metrics=["induction"], intervals=ci)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    (band,) = ax.collections  # b has no rows: no band
    ys = band.get_paths()[0].vertices[:, 1]
    assert min(ys) == pytest.approx(0.1) and max(ys) == pytest.approx(0.9)
    assert np.allclose(band.get_facecolor()[0][:3], to_rgb("C0"))  # a's colour
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(t.startswith("shaded: 95% interval of the layer mean") for t in texts)
    plain = atlas_figure(table, metrics=["induction"])
    assert not any(t.get_text().startswith("shaded") for t in plain.legends[0].get_texts())
    with pytest.raises(HeadscopeError, match="use mean_score"):
        atlas_figure(table, metrics=["induction"], stat="max_score", intervals=ci)
    with pytest.raises(HeadscopeError, match="need columns"):
        atlas_figure(table, metrics=["induction"], intervals=ci.drop(columns="ci_high"))
