"""Per-layer means, labelled heads and side-by-side heatmaps on hand-made score tables."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.figure import Figure

from headscope.analysis.profiles import labelled_heads, layer_curves, layer_means, side_by_side
from headscope.errors import HeadscopeError


def _scores(model="m", n_layers=3, n_heads=2):
    rows = []
    for metric, base in (("sink", 0.5), ("separator", 0.1), ("punctuation", 0.2), ("entropy", 1.0)):
        for layer in range(n_layers):
            for head in range(n_heads):
                score = base + 0.1 * layer + 0.01 * head
                label = {"sink": "sink head" if score >= 0.6 else "", "entropy": "focused head" if head == 0 else ""}
                rows.append({"model": model, "metric": metric, "probe": "text", "layer": layer, "head": head,
                             "head_name": f"L{layer}H{head}", "score": score, "chance": 0.05, "n": 40,
                             "label": label.get(metric, "")})
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
    assert isinstance(fig, Figure)
    assert len([ax for ax in fig.axes if ax.get_title()]) == 2
    with pytest.raises(HeadscopeError, match="no column"):
        layer_curves(table, panels="nope")


def test_labelled_heads_strongest_first():
    out = labelled_heads(_scores()).set_index("metric")
    assert out.loc["sink", "heads"] == 4
    assert out.loc["sink", "names"] == "L2H1, L2H0, L1H1, L1H0"
    assert out.loc["entropy", "names"] == "L0H0, L1H0, L2H0"  # lowest entropy first
    assert labelled_heads(_scores(), max_names=2).set_index("metric").loc["sink", "names"] == "L2H1, L2H0, ... (2 more)"


def test_side_by_side_draws_each_run():
    fig = side_by_side({"a": _scores("a"), "b": _scores("b", n_layers=6, n_heads=4)}, "sink")
    assert isinstance(fig, Figure)
    assert sum(1 for ax in fig.axes if ax.get_title().startswith(("a", "b"))) == 2


def test_side_by_side_one_metric_per_panel():
    scores = _scores()
    fig = side_by_side({"first": scores, "then": scores}, {"first": "sink", "then": "separator"})
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[0].startswith("first: sink") and titles[1].startswith("then: separator")
