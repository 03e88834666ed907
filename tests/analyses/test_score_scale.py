"""The sqrt(d_k) simulations (lib.score_scale) against theory and the article's
numbers."""

from __future__ import annotations

import math

import pytest

from lib.score_scale import dot_product_stats, peak_stats


def test_dot_product_variance_grows_like_d_k():
    t = dot_product_stats([1, 16, 128], n_pairs=20_000, seed=3)
    assert t["d_k"].tolist() == [1, 16, 128]
    for _, row in t.iterrows():
        assert row["var"] == pytest.approx(row["d_k"], rel=0.06)
        assert abs(row["mean"]) < 4 * math.sqrt(row["d_k"] / 20_000)
        assert row["std_scaled"] == pytest.approx(1.0, rel=0.03)
        assert row["sqrt_d_k"] == math.sqrt(row["d_k"])
    again = dot_product_stats([1, 16, 128], n_pairs=20_000, seed=3)
    assert t.equals(again)  # seeded, no global RNG


def test_dot_product_uneven_chunks():
    """1,001 pairs in chunks of 100 (the last one short) still estimate variance d_k."""
    t = dot_product_stats([8], n_pairs=1_001, chunk=100)
    assert t["d_k"].tolist() == [8]
    assert t.loc[0, "var"] == pytest.approx(8, rel=0.15)  # standard error ~5% at 1,001 pairs


def test_peak_stats_small_trial_count():
    """The article: 51% peaked unscaled, never when scaled, top weight ~36% scaled (d_k 128, 8
    keys)."""
    t = peak_stats(d_k=128, n_keys=8, n_trials=4_000, seed=0).set_index("scores")
    un, sc = t.loc["unscaled"], t.loc["scaled"]
    assert abs(un["frac_peaked"] - 0.51) < 0.035  # SE ~0.008 at 4,000 trials; large-n value ~0.519
    assert un["frac_peaked_se"] == pytest.approx(
        math.sqrt(un["frac_peaked"] * (1 - un["frac_peaked"]) / 4_000)
    )
    assert sc["frac_peaked"] == 0.0
    assert sc["mean_top"] == pytest.approx(0.36, abs=0.01)
    assert un["mean_top"] > 0.85
    assert un["mean_slope"] < sc["mean_slope"] / 3  # peaked softmax: little slope left
    assert t.equals(peak_stats(d_k=128, n_keys=8, n_trials=4_000, seed=0).set_index("scores"))
