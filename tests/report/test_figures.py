"""Figures (headscope/report/figures.py): the drawn data, colour ranges, annotations, titles, files
written."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.image import imread

from headscope.engines.extract import MetricScores
from headscope.metrics import get_metric
from headscope.report import figures as plots
from headscope.report.figures import draw_heatmap, heatmap, save_figures, summary_figure
from headscope.report.tables import relabel, to_frame
from headscope.result import matrix

N_LAYERS, N_HEADS = 3, 2
COUNT = 8.0
SCORES = {  # [layer][head]
    "previous_token": [[0.95, 0.1], [0.5, 0.49], [0.0, 0.7]],
    "entropy": [[0.2, 2.3], [1.0, 0.31], [0.3, 1.7]],
    "next_token": [[math.nan] * 2] * 3,
    "induction": [[0.05, 0.2], [0.6, 0.1], [0.3, 0.99]],
}


@pytest.fixture(scope="module")
def scores() -> pd.DataFrame:
    res = [
        MetricScores(
            get_metric(name), torch.tensor(s, dtype=torch.float64) * COUNT, COUNT, 0.25 * COUNT
        )
        for name, s in SCORES.items()
    ]
    return to_frame("org/tiny-gpt2", N_LAYERS, N_HEADS, res, {})


def main_axes(fig):
    """The heatmap panels (the colour bars have no image)."""
    return [ax for ax in fig.axes if ax.images]


def texts(ax) -> list[tuple[str, tuple[float, float]]]:
    """The values written on the cells, each once (its halo, a stroke-only twin, left out)."""
    return [(t.get_text(), tuple(t.get_position())) for t in ax.texts if not t.get_path_effects()]


# ------------------------------------------------------------------------------ one heatmap


@pytest.mark.parametrize("metric", ["previous_token", "entropy", "induction"])
def test_heatmap_draws_the_matrix(scores, metric):
    fig = heatmap(scores, metric)
    (ax,) = main_axes(fig)
    image = ax.images[0]
    np.testing.assert_array_equal(np.asarray(image.get_array()), matrix(scores, metric).to_numpy())
    np.testing.assert_array_equal(np.asarray(image.get_array()), np.array(SCORES[metric]))
    assert len(fig.axes) == 2  # the heatmap and its colour bar
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"
    assert list(ax.get_xticks()) == [0, 1] and list(ax.get_yticks()) == [0, 1, 2]


def test_colour_range_is_fixed(scores):
    assert heatmap(scores, "previous_token").axes[0].images[0].get_clim() == (0.0, 1.0)
    assert heatmap(scores, "induction").axes[0].images[0].get_clim() == (0.0, 1.0)


def test_entropy_colour_range_is_zero_to_ceil_of_max(scores):
    assert heatmap(scores, "entropy").axes[0].images[0].get_clim() == (0.0, 3.0)  # max 2.3
    low = scores.copy()
    low.loc[low.metric == "entropy", "score"] = 0.4  # below 1: the range stays 0..1
    assert heatmap(low, "entropy").axes[0].images[0].get_clim() == (0.0, 1.0)
    exact = scores.copy()
    exact.loc[exact.metric == "entropy", "score"] = 2.0
    assert heatmap(exact, "entropy").axes[0].images[0].get_clim() == (0.0, 2.0)


def test_below_metric_uses_the_reversed_colour_map(scores):
    assert heatmap(scores, "entropy").axes[0].images[0].get_cmap().name == "viridis_r"
    assert heatmap(scores, "induction").axes[0].images[0].get_cmap().name == "viridis"


def test_annotations_only_on_labelled_cells(scores):
    ax = heatmap(scores, "previous_token").axes[0]
    # labelled = score >= 0.5 (previous_token's threshold), written at (head, layer)
    assert sorted(texts(ax)) == sorted([("0.95", (0, 0)), ("0.50", (0, 1)), ("0.70", (1, 2))])
    ax = heatmap(scores, "induction").axes[0]  # threshold 0.4
    assert sorted(texts(ax)) == sorted([("0.60", (0, 1)), ("0.99", (1, 2))])


def test_annotations_follow_the_runs_thresholds(scores):
    relabelled = relabel(scores, {"induction": 0.25, "entropy": 1.0})
    assert sorted(texts(heatmap(relabelled, "induction").axes[0])) == sorted(
        [("0.60", (0, 1)), ("0.30", (0, 2)), ("0.99", (1, 2))]
    )
    assert sorted(texts(heatmap(relabelled, "entropy").axes[0])) == sorted(
        [("0.20", (0, 0)), ("1.00", (0, 1)), ("0.31", (1, 1)), ("0.30", (0, 2))]
    )


def test_annotations_for_a_below_metric_are_the_low_cells(scores):
    ax = heatmap(scores, "entropy").axes[0]
    # entropy labels heads at or below its threshold 0.3
    assert sorted(texts(ax)) == sorted([("0.20", (0, 0)), ("0.30", (0, 2))])


def test_no_annotations_on_large_grids():
    n_layers, n_heads = 21, 20  # 420 cells > 400
    rows = [
        {
            "model": "m",
            "metric": "sink",
            "probe": "text",
            "layer": la,
            "head": h,
            "score": 0.9,
            "chance": 0.1,
            "n": 3,
            "label": "",
        }
        for la in range(n_layers)
        for h in range(n_heads)
    ]
    ax = heatmap(pd.DataFrame(rows), "sink").axes[0]
    assert len(ax.texts) == 0 and ax.images[0].get_array().shape == (21, 20)


def test_layer_zero_is_at_the_top(scores):
    ax = heatmap(scores, "induction").axes[0]
    assert ax.images[0].origin == "upper"
    bottom, top = ax.get_ylim()
    assert top < bottom and top == pytest.approx(-0.5) and bottom == pytest.approx(N_LAYERS - 0.5)
    assert ax.yaxis_inverted()


def test_title_has_model_metric_and_n(scores):
    assert (
        heatmap(scores, "induction").axes[0].get_title()
        == "org/tiny-gpt2: induction\nn = 8 queries; chance 0.25"
    )
    assert heatmap(scores, "induction", n_sequences=16).axes[0].get_title() == (
        "org/tiny-gpt2: induction\n16 seqs, n = 8 queries; chance 0.25"
    )
    assert (
        heatmap(scores, "entropy", 4).axes[0].get_title()
        == "org/tiny-gpt2: entropy (nats)\n4 seqs, n = 8 queries; chance 0.25"
    )
    # no chance value in the table (or several): none in the title
    assert (
        heatmap(scores.assign(chance=np.nan), "induction").axes[0].get_title().endswith("queries")
    )


def test_all_nan_metric_says_why(scores):
    ax = heatmap(scores, "next_token").axes[0]
    assert np.isnan(np.asarray(ax.images[0].get_array(), dtype=float)).all()
    # nan_reason up to its first ':'
    assert [t.get_text() for t in ax.texts] == ["NaN: causal model"]
    assert ax.texts[0].get_transform() == ax.transAxes and tuple(ax.texts[0].get_position()) == (
        0.5,
        0.5,
    )


def test_all_nan_unregistered_metric(scores):
    t = scores[scores.metric == "next_token"].assign(metric="my_metric")
    import matplotlib.figure

    ax = matplotlib.figure.Figure().add_subplot()
    draw_heatmap(ax, t, "my_metric")
    assert [x.get_text() for x in ax.texts] == ["NaN: not measurable"]
    assert ax.get_title() == ""  # no title unless asked


# ------------------------------------------------------------------------------ summary figure


def test_summary_figure_one_panel_per_metric(scores):
    fig = summary_figure(scores)
    panels = main_axes(fig)
    assert [ax.get_title() for ax in panels] == list(SCORES)
    for ax, metric in zip(panels, SCORES, strict=True):
        np.testing.assert_array_equal(
            np.asarray(ax.images[0].get_array()), matrix(scores, metric).to_numpy()
        )
        expected = ["NaN: causal model"] if metric == "next_token" else []  # no value annotations
        assert [t.get_text() for t in ax.texts] == expected
    assert len(fig.axes) == 2 * len(SCORES)  # a colour bar per panel
    assert fig.get_suptitle() == "org/tiny-gpt2: every head, every behaviour"
    assert panels[1].images[0].get_clim() == (0.0, 3.0)  # entropy keeps its own range


def test_summary_figure_grid_is_at_most_four_wide(scores):
    many = pd.concat([scores.assign(metric=scores.metric + suffix) for suffix in ("", "_b")])
    geometry = [ax.get_subplotspec().get_geometry()[:2] for ax in main_axes(summary_figure(many))]
    assert set(geometry) == {(2, 4)} and len(geometry) == 8


# ------------------------------------------------------------------------------ files


def test_save_figures_writes_one_png_per_metric_and_a_summary(scores, tmp_path):
    paths = save_figures(scores, tmp_path, dpi=40)
    assert paths == [tmp_path / f"{m}.png" for m in SCORES] + [
        tmp_path / "summary.png",
        tmp_path / "thresholds.png",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = imread(p)
        assert pixels.ndim == 3 and pixels.shape[0] > 0 and pixels.shape[1] > 0
        assert pixels[..., :3].std() > 0.01  # not a blank image


def test_save_figures_titles_get_n_sequences_per_probe(scores, tmp_path, monkeypatch):
    seen = []
    original = plots.heatmap

    def spy(table, metric, n_sequences=None, thresholds=None):
        seen.append((metric, n_sequences))
        return original(table, metric, n_sequences, thresholds)

    monkeypatch.setattr(plots, "heatmap", spy)
    save_figures(scores, tmp_path, n_sequences={"text": 12, "repeat": 5}, dpi=20)
    assert seen == [("previous_token", 12), ("entropy", 12), ("next_token", 12), ("induction", 5)]
    seen.clear()
    save_figures(scores, tmp_path, dpi=20)
    assert seen == [(m, None) for m in SCORES]


def test_threshold_sweep_counts_labelled_heads_at_every_cut(scores):
    fig = plots.threshold_sweep(scores, {"induction": 0.25})
    panels = {ax.get_title().split(":")[0]: ax for ax in fig.axes}
    # next_token is all NaN: no panel
    assert set(panels) == {"previous_token", "entropy", "induction"}
    ax = panels["induction"]
    assert ax.get_title() == "induction: 3 at >= 0.25"  # 0.3, 0.6, 0.99 of the six heads
    counts = ax.lines[0].get_ydata()
    # fewer heads as the cut rises
    assert counts[0] == 6 and counts[-1] == 0 and (np.diff(counts) <= 0).all()
    assert ax.lines[1].get_xdata()[0] == 0.25  # the run's threshold, marked
    entropy = panels["entropy"]
    assert (
        entropy.get_title() == "entropy: 2 at <= 0.3"
        and (np.diff(entropy.lines[0].get_ydata()) >= 0).all()
    )
    # axes say which way the count runs and in what unit; one key names the dashed line
    assert ax.get_ylabel() == "heads with score >= t" and ax.get_xlabel() == "threshold t"
    assert entropy.get_ylabel() == "heads with score <= t"
    assert entropy.get_xlabel() == "threshold t (nats)"
    (key,) = fig.legends
    texts = [t.get_text() for t in key.get_texts()]
    assert texts[1].startswith("this run's threshold")
    # a uniform head's score marked where it falls in the swept range, and keyed
    chance = float(scores.loc[scores["metric"] == "induction", "chance"].mean())
    assert any(
        ln.get_linestyle() == ":" and ln.get_xdata()[0] == pytest.approx(chance) for ln in ax.lines
    )
    assert any(t.startswith("chance: a uniform head's score") for t in texts)
    # the behaviour with no panel is named, not silently missing
    assert "not drawn (NaN for every head): next_token" in texts


def test_hatching_has_its_key_below_the_axes_not_over_them(scores):
    shaky = scores.assign(stability=np.where(scores["label"] != "", 0.5, 1.0))
    fig = heatmap(shaky, "induction")
    assert not fig.axes[0].get_legend()  # a key inside the axes sat over the "head" label
    (key,) = fig.legends
    assert [t.get_text() for t in key.get_texts()] == [
        "red line on the colour bar: chance",
        "numbers: the labelled heads (induction head: induction >= 0.4)",
        "label stability < 0.9 (bootstrap)",
    ]
    # the run's own cut, where it has one
    moved = heatmap(shaky, "induction", thresholds={"induction": 0.3}).legends[0].get_texts()
    assert "numbers: the labelled heads (induction head: induction >= 0.3)" in [
        t.get_text() for t in moved
    ]
    bar = fig.axes[-1]
    assert [line.get_ydata()[0] for line in bar.lines] == [0.25]  # the chance line
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)  # the key lies wholly below the panel, "head" label included
    panel = fig.axes[0].get_tightbbox(renderer)
    assert key.get_window_extent().y1 <= panel.y0 + 1
    plain = [t.get_text() for t in heatmap(scores, "induction").legends[0].get_texts()]
    assert not any("stability" in t for t in plain)  # nothing hatched, no hatching key
