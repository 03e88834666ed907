"""Per-layer means, labelled heads and side-by-side heatmaps on hand-made score tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from headscope.errors import HeadscopeError
from lib.profiles import labelled_heads, layer_curves, layer_means, side_by_side


def _scores(model="m", n_layers=3, n_heads=2):
    rows = []
    for metric, base in (("sink", 0.5), ("separator", 0.1), ("punctuation", 0.2), ("entropy", 1.0)):
        for layer in range(n_layers):
            for head in range(n_heads):
                score = base + 0.1 * layer + 0.01 * head
                label = {
                    "sink": "sink head" if score >= 0.6 else "",
                    "entropy": "focused head" if head == 0 else "",
                }
                rows.append(
                    {
                        "model": model,
                        "metric": metric,
                        "probe": "text",
                        "layer": layer,
                        "head": head,
                        "head_name": f"L{layer}H{head}",
                        "score": score,
                        "chance": 0.05,
                        "n": 40,
                        "label": label.get(metric, ""),
                    }
                )
    return pd.DataFrame(rows)


def test_layer_means_are_means_over_heads():
    table = layer_means(_scores())
    assert table["metric"].tolist() == ["sink"] * 3 + ["separator"] * 3 + ["punctuation"] * 3
    sink = table[table["metric"] == "sink"]
    assert sink["mean"].tolist() == pytest.approx([0.505, 0.605, 0.705])
    assert sink["max"].tolist() == pytest.approx([0.51, 0.61, 0.71])
    assert (table["heads"] == 2).all() and (table["run"] == "m").all()
    assert (layer_means(_scores(), ["sink"], run="BOS first")["run"] == "BOS first").all()


def test_layer_means_name_the_missing_metric():
    with pytest.raises(HeadscopeError, match="No rows for induction"):
        layer_means(_scores(), ["sink", "induction"])


def test_layer_curves_one_panel_per_run():
    table = pd.concat([layer_means(_scores("a")), layer_means(_scores("b", n_layers=5))])
    fig = layer_curves(table)
    # each line's chance value in the title: the dashed lines of close values hide each other
    chances = "chance: sink 0.050, separator 0.050, punctuation 0.050"
    assert [ax.get_title() for ax in fig.axes] == [f"a\n{chances}", f"b\n{chances}"]
    assert fig.get_suptitle().startswith("mean attention per layer")
    a, b = fig.axes
    # per metric: the mean, then its chance value dashed
    assert len(a.lines) == 6
    sink, sink_chance = a.lines[:2]
    np.testing.assert_array_equal(sink.get_xdata(), [0, 1, 2])
    np.testing.assert_allclose(sink.get_ydata(), [0.505, 0.605, 0.705])
    np.testing.assert_allclose(sink_chance.get_ydata(), [0.05] * 3)
    assert sink_chance.get_linestyle() == "--" and sink_chance.get_color() == sink.get_color()
    np.testing.assert_allclose(a.lines[2].get_ydata(), [0.105, 0.205, 0.305])  # separator
    np.testing.assert_array_equal(b.lines[0].get_xdata(), [0, 1, 2, 3, 4])
    # one key for the figure, below the panels (never over a curve), no band without intervals
    assert a.get_legend() is None and len(fig.legends) == 1
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[:3] == ["sink", "separator", "punctuation"]
    assert texts[3].startswith("chance (a uniform head)") and len(texts) == 4
    assert not a.collections
    with pytest.raises(HeadscopeError, match="no column"):
        layer_curves(table, panels="nope")


def test_layer_curves_shade_the_intervals_when_given():
    table = layer_means(_scores("a"), ["sink"])
    table = table.assign(ci_low=table["mean"] - 0.01, ci_high=table["mean"] + 0.02, level=0.95)
    fig = layer_curves(table)
    (ax,) = fig.axes
    (band,) = ax.collections
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(0.495) and ys.max() == pytest.approx(0.725)
    assert fig.legends[0].get_texts()[-1].get_text() == "shaded: 95% interval (resampled sequences)"


def test_labelled_heads_strongest_first():
    out = labelled_heads(_scores()).set_index("metric")
    assert out.loc["sink", "heads"] == 4
    assert out.loc["sink", "names"] == "L2H1, L2H0, L1H1, L1H0"
    assert out.loc["entropy", "names"] == "L0H0, L1H0, L2H0"  # lowest entropy first
    assert (
        labelled_heads(_scores(), max_names=2).set_index("metric").loc["sink", "names"]
        == "L2H1, L2H0, ... (2 more)"
    )
    assert "stable" not in out.columns  # no bootstrap, no stability


def test_labelled_heads_count_stable_labels_and_name_borderline_heads():
    scores = _scores()
    stability = {"L2H1": 1.0, "L2H0": 0.95, "L1H1": 0.6, "L1H0": 0.9, "L0H1": 0.3, "L0H0": 0.05}
    sink = scores["metric"] == "sink"
    scores["stability"] = np.where(sink, scores["head_name"].map(stability), np.nan)
    out = labelled_heads(scores).set_index("metric")
    # L1H1 passes in only 60%
    assert out.loc["sink", "heads"] == 4 and out.loc["sink", "stable"] == 3
    # an unlabelled head near the cut too
    assert out.loc["sink", "borderline"] == "L1H1 (0.60), L0H1 (0.30)"
    # NaN stability
    assert out.loc["entropy", "stable"] == 0 and out.loc["entropy", "borderline"] == ""


def _grid(n_layers, n_heads, base):
    """The score layout of ``_scores``: layer down, head across."""
    return base + 0.1 * np.arange(n_layers)[:, None] + 0.01 * np.arange(n_heads)[None, :]


def test_side_by_side_draws_each_run():
    fig = side_by_side({"a": _scores("a"), "b": _scores("b", n_layers=6, n_heads=4)}, "sink")
    a, b, _colour_bar = fig.axes
    assert (a.get_title(), b.get_title()) == (
        "a (n = 40 queries; chance 0.050)",
        "b (n = 40 queries; chance 0.050)",
    )
    assert fig.get_suptitle() == "sink"
    np.testing.assert_allclose(a.images[0].get_array(), _grid(3, 2, 0.5))
    np.testing.assert_allclose(b.images[0].get_array(), _grid(6, 4, 0.5))


def test_side_by_side_one_metric_per_panel():
    scores = _scores()
    fig = side_by_side({"first": scores, "then": scores}, {"first": "sink", "then": "separator"})
    first, then, _colour_bar = fig.axes
    assert first.get_title().startswith("first: sink") and then.get_title().startswith(
        "then: separator"
    )
    assert fig.get_suptitle() == "sink, separator"
    np.testing.assert_allclose(first.images[0].get_array(), _grid(3, 2, 0.5))
    np.testing.assert_allclose(then.images[0].get_array(), _grid(3, 2, 0.1))


def test_side_by_side_names_its_colour_scale_and_marks_chance():
    scores = _scores("a")
    fig = side_by_side({"a": scores}, "separator", vmax=0.4)
    bar = fig.axes[-1]
    assert "separator" in bar.get_ylabel()
    assert [line.get_ydata()[0] for line in _bar_lines(bar)] == [0.05]  # the red chance line
    assert [m.get_ydata()[0] for m in _bar_markers(bar)] == [0.05]  # and its marker beside it
    assert not bar.texts  # close chance values written on the bar overprinted each other
    assert fig.axes[0].get_title().endswith("chance 0.050)")
    keys = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "colour bar, red solid line and triangle: chance of a (0.050)" in keys
    assert not any("stability" in k for k in keys)  # nothing hatched, no hatching key
    assert fig.axes[0].images[0].get_clim() == (0.0, 0.4)
    shaky = scores.assign(stability=0.5)
    fig = side_by_side({"a": shaky}, "sink")
    keys = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert any("stability" in k for k in keys) and any("labelled heads" in k for k in keys)
    assert any(
        k.startswith("hatched: label stability < 0.9 (stability: the share of") for k in keys
    )
    assert "numbers: the labelled heads' scores (labelled: sink >= 0.5)" in keys
    fig = side_by_side({"a": shaky}, "sink", thresholds={"sink": 0.3})
    keys = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "numbers: the labelled heads' scores (labelled: sink >= 0.3)" in keys


def test_side_by_side_keeps_two_close_chance_values_apart():
    a, b = _scores("a").assign(chance=0.110), _scores("b").assign(chance=0.112)
    fig = side_by_side({"a": a, "b": b}, "sink")
    titles = [ax.get_title() for ax in fig.axes[:2]]
    assert titles[0].endswith("chance 0.110)") and titles[1].endswith("chance 0.112)")
    bar = fig.axes[-1]
    assert sorted(line.get_ydata()[0] for line in _bar_lines(bar)) == [0.110, 0.112]
    # one line style per value, each named in the key with its panel: they can be told apart
    styles = {line.get_ydata()[0]: line.get_linestyle() for line in _bar_lines(bar)}
    assert styles[0.110] != styles[0.112]
    # and one marker shape per value, each at its own distance left of the bar: two values a
    # line's width apart on a short bar still show as two marks
    fig.canvas.draw()
    marks = {
        m.get_ydata()[0]: (m.get_marker(), m.get_transform().transform([[0.0, 0.1]])[0][0])
        for m in _bar_markers(bar)
    }  # value -> (shape, x in pixels)
    assert marks[0.110][0] != marks[0.112][0]
    assert abs(marks[0.110][1] - marks[0.112][1]) >= 8 * fig.dpi / 72  # >= 8 points apart
    left = bar.get_window_extent().x0
    assert all(x < left for _, x in marks.values())  # outside the bar, on the panels' side
    keys = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "colour bar, red solid line and triangle: chance of a (0.110)" in keys
    assert "colour bar, red dashed line and diamond: chance of b (0.112)" in keys
    flipped = side_by_side({"b": b, "a": a}, "sink")  # styles follow the panels, not the values
    keys = [t.get_text() for leg in flipped.legends for t in leg.get_texts()]
    assert "colour bar, red solid line and triangle: chance of b (0.112)" in keys
    same = side_by_side({"a": a, "c": a}, "sink")  # one value, one line, both panels named
    assert len(_bar_lines(same.axes[-1])) == 1 and len(_bar_markers(same.axes[-1])) == 1
    assert "colour bar, red solid line and triangle: chance of a, c (0.110)" in [
        t.get_text() for leg in same.legends for t in leg.get_texts()
    ]


def test_side_by_side_marks_a_cut_on_the_colour_bar():
    fig = side_by_side(
        {"a": _scores("a")}, "sink", marks={"epsilon = 0.3 (the sink-rate cut)": 0.3}
    )
    bar = fig.axes[-1]
    black = [ln for ln in _bar_lines(bar) if ln.get_color() == "black"]
    assert [ln.get_ydata()[0] for ln in black] == [0.3]
    keys = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "colour bar, black: epsilon = 0.3 (the sink-rate cut)" in keys
    assert bar.get_window_extent().height == pytest.approx(
        fig.axes[0].get_window_extent().height, rel=0.05
    )  # the bar is as tall as the panel


def _bar_lines(bar):
    """The horizontal lines across a colour bar (axhline: x from 0 to 1 in axes units)."""
    return [ln for ln in bar.lines if list(ln.get_xdata()) == [0, 1]]


def _bar_markers(bar):
    return [ln for ln in bar.lines if ln.get_marker() not in (None, "None", "")]


def test_side_by_side_outlines_the_heads_it_is_given_and_keys_them():
    scores = _scores("a")
    fig = side_by_side(
        {"a": scores, "b": scores}, "separator", outline=("above chance", {"a": [(2, 1), (0, 0)]})
    )
    a, b, _bar = fig.axes
    boxes = [p for p in a.patches if p.get_edgecolor()[:3] == (0.0, 0.0, 0.0) and not p.get_fill()]
    assert sorted(tuple(p.get_xy()) for p in boxes) == [
        (-0.5, -0.5),
        (0.5, 1.5),
    ]  # (head, layer) - 0.5
    assert not [p for p in b.patches if not p.get_fill()]  # only the panel named
    keys = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "outlined: above chance" in keys
    plain = side_by_side({"a": scores}, "separator", outline=("above chance", {"a": []}))
    assert "outlined: above chance" not in [
        t.get_text() for leg in plain.legends for t in leg.get_texts()
    ]
