"""The cost of attention (lib.cost): the article's arithmetic, the fit shown,
measured time."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lib.cost import (
    cost_table,
    fit_spread,
    format_bytes,
    growth,
    time_one_layer,
    time_scan,
    timing_figure,
    with_fit,
)
from lib.timing import fit_quadratic

# ------------------------------------------------------------------------ counted


def test_cost_table_article_numbers():
    K = 1024
    t = cost_table(
        [4 * K, 128 * K, 1024 * K], d_head=128, n_layers=32, n_heads=32, n_params=8e9
    ).set_index("n")
    # 32x the text, 1,024x the scores
    assert t.loc[128 * K, "scores"] / t.loc[4 * K, "scores"] == 1024
    assert round(t.loc[128 * K, "scores"] / 1e9) == 17  # ~17 billion pairs per head per layer
    assert t.loc[128 * K, "grid_size"] == "34.4 GB"
    assert round(t.loc[128 * K, "model_scores"] / 1e12, 1) == 17.6  # 1,024 grids
    assert round(t.loc[128 * K, "attn_to_weights"]) == 2  # "about twice"
    assert round(t.loc[1024 * K, "attn_to_weights"]) == 17  # "about 17 times"
    assert t.loc[4 * K, "attn_to_weights"] < 0.1  # "a rounding error"
    assert round(t.loc[4 * K, "attn_flops_per_token"] / 1e9, 1) == 2.1
    assert round(t.loc[128 * K, "attn_flops_per_token"] / 1e9) == 69
    assert t.loc[4 * K, "weight_flops_per_token"] == 16e9


def test_cost_table_closed_form():
    t = cost_table([10, 20], d_head=64, causal_half=False)
    assert t["scores"].tolist() == [100, 400]
    assert t["grid_bytes"].tolist() == [200, 800]
    assert t["flops_per_head_layer"].tolist() == [4 * 100 * 64, 4 * 400 * 64]
    # one head, one layer, no halving
    assert t["attn_flops"].tolist() == t["flops_per_head_layer"].tolist()
    # causal: half the pairs
    assert cost_table([10], d_head=64)["attn_flops"].tolist() == [2 * 100 * 64]
    assert "weight_flops" not in t


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(2 * 4096**2) == "33.6 MB"
    assert format_bytes(2 * (1024 * 1024) ** 2) == "2.2 TB"
    assert format_bytes(3e18) == "3000.0 PB"  # the largest unit keeps counting


# ------------------------------------------------------------------------ the fit, shown


def test_with_fit_adds_prediction_and_share():
    n = [100, 200, 400, 800, 1600]
    t = [0.5 + 1e-3 * x + 2e-6 * x * x for x in n]
    table = with_fit(pd.DataFrame({"n": n, "seconds": t}), fit_quadratic(n, t))
    assert table["fit_seconds"].tolist() == pytest.approx(t)
    assert table["quadratic_seconds"].tolist() == pytest.approx([2e-6 * x * x for x in n])
    assert table["quadratic_share"].is_monotonic_increasing
    assert table["quadratic_share"].iloc[-1] == pytest.approx(2e-6 * 1600**2 / t[-1])


def test_timing_figure_draws_measurements_fit_and_terms():
    n = [10, 20, 40]
    table = pd.DataFrame({"n": n, "seconds": [1.2, 2.3, 5.7]})  # 0.5 + 0.05 n + 0.002 n^2
    fit = fit_quadratic(n, table["seconds"])
    assert min(fit.values()) > 0  # every term positive: the split is determined
    fig = timing_figure(
        [
            ("scan", table, fit),
            (
                "one layer",
                table.assign(seconds=table["seconds"] / 2),
                fit_quadratic(n, table["seconds"] / 2),
            ),
        ],
        "timings",
    )
    assert fig.get_suptitle() == "timings"
    ax, ax2 = fig.axes
    assert (ax.get_title(), ax2.get_title()) == ("scan", "one layer")
    measured, fitted, quadratic, linear = ax.lines
    np.testing.assert_array_equal(measured.get_xdata(), n)
    np.testing.assert_array_equal(measured.get_ydata(), [1.2, 2.3, 5.7])
    np.testing.assert_array_equal(ax2.lines[0].get_ydata(), [0.6, 1.15, 2.85])
    grid = fitted.get_xdata()
    assert grid[0] == 10 and grid[-1] == 40  # the measured range only: no extrapolation
    np.testing.assert_allclose(fitted.get_ydata(), fit["a"] + fit["b"] * grid + fit["c"] * grid**2)
    np.testing.assert_allclose(quadratic.get_ydata(), fit["c"] * grid**2)
    np.testing.assert_allclose(linear.get_ydata(), fit["a"] + fit["b"] * grid)
    np.testing.assert_allclose(fitted.get_ydata(), quadratic.get_ydata() + linear.get_ydata())
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0] == "measured" and f"c = {fit['c']:.2e} s/token²" in labels[1]
    assert not ax.texts  # every term positive: the split is drawn, nothing to warn of


def test_timing_figure_does_not_draw_a_split_the_fit_cannot_make():
    """A fit with its linear term at the bound 0 (it wanted a negative one, as notebook 03's
    one-layer timing did): the a + bn / cn² split is not drawn, and the panel says why."""
    n = [10, 20, 40, 80]
    table = pd.DataFrame({"n": n, "seconds": [1.0, 1.0, 1.1, 2.0]})
    fit = {"a": 0.98, "b": 0.0, "c": 1.6e-4}
    fig = timing_figure([("one layer", table, fit)], "t", repeats=3)
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0] == "measured (best of up to 3 runs)" and len(ax.lines) == 2  # points, fit
    assert not any("quadratic term" in t or t == "a + bn" for t in labels)
    (note,) = ax.texts
    assert note.get_text().startswith("split not determined: b at its bound 0")


# ------------------------------------------------------------------------ measured


def test_timing_helpers_tiny_gpt2(tiny_gpt2):
    t = time_scan(tiny_gpt2, [3, 6], repeats=2)
    assert t["repeat_len"].tolist() == [3, 6] and t["n"].tolist() == [7, 13]
    assert (t["seconds"] > 0).all() and t["engine"].notna().all()
    t = time_one_layer(tiny_gpt2, [8, 16], layer=1, repeats=1)
    assert t["n"].tolist() == [8, 16] and (t["seconds"] > 0).all()


@pytest.mark.real
def test_timing_helpers_smollm2(smollm2):
    t = time_scan(smollm2, [4, 8])
    assert t["n"].tolist() == [9, 17] and (t["seconds"] > 0).all()
    t = time_one_layer(smollm2, [16, 32], repeats=1)
    assert t["n"].tolist() == [16, 32] and (t["seconds"] > 0).all()


def test_growth_reads_exponents_off_the_measurements():
    table = pd.DataFrame({"n": [100, 200, 400, 800], "seconds": [1.0, 2.0, 8.0, 16.0]})
    g = growth(table)
    assert np.isnan(g["slope"].iloc[0])
    np.testing.assert_allclose(g["slope"].iloc[1:], [1.0, 2.0, 1.0])
    np.testing.assert_allclose(g["time_ratio"].iloc[1:], [2.0, 4.0, 2.0])
    assert list(g["n"]) == [100, 200, 400, 800]  # the input's columns are kept


def test_fit_spread_is_tight_on_a_clean_quadratic_and_wide_on_noise():
    n = np.array([65, 129, 257, 513, 1025, 1537, 2047], dtype=float)
    clean = 0.1 + 3e-3 * n + 2e-6 * n**2
    f = fit_spread(n, clean)
    share = 2e-6 * 2047**2 / (0.1 + 3e-3 * 2047 + 2e-6 * 2047**2)
    assert f["share"] == pytest.approx(share, rel=1e-6)
    assert f["share_max"] - f["share_min"] < 1e-6 and f["max_residual"] < 1e-9
    noisy = clean * np.array([1.0, 1.0, 1.0, 1.0, 1.25, 1.0, 0.9])  # one slow and one fast run
    g = fit_spread(n, noisy)
    assert g["max_residual"] > 0.05
    assert g["share_max"] - g["share_min"] > 0.05  # leaving a point out moves the split
    with pytest.raises(ValueError, match="at least 4 points"):
        fit_spread(n[:3], clean[:3])
