"""Effects as ratios of means, their bootstrap intervals, the baseline table: closed forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.effects.patch_table import (
    baseline_table,
    draw_weights,
    head_name,
    mean_interval,
    ratio_effects,
)

CLEAN = torch.tensor([4.0, 6.0, 5.0, 5.0], dtype=torch.float64)  # mean 5
CORRUPT = torch.tensor([1.0, 0.0, -1.0, 0.0], dtype=torch.float64)  # mean 0


def test_denoising_and_noising_are_the_shares_restored_and_destroyed():
    patched = torch.tensor(
        [
            [2.0, 2.0, 2.0, 2.0],  # denoising: 2 of the gap of 5 restored
            [0.0, 1.0, -1.0, 0.0],  # denoising, nothing restored
            [4.0, 4.0, 4.0, 4.0],  # noising: 1 of 5 destroyed
            [5.0, 6.0, 4.0, 5.0],
        ],  # noising, nothing destroyed
        dtype=torch.float64,
    )
    denoise = torch.tensor([True, True, False, False])
    s = ratio_effects(CLEAN, CORRUPT, patched, denoise, resamples=0)
    np.testing.assert_allclose(s["effect"], [0.4, 0.0, 0.2, 0.0], atol=1e-12)
    np.testing.assert_allclose(s["delta"], [2.0, 0.0, -1.0, 0.0], atol=1e-12)  # m_patched - m_base
    np.testing.assert_allclose(s["m_patched"], [2.0, 0.0, 4.0, 5.0])
    assert np.isnan(s["ci_low"]).all()


def test_an_activation_that_carries_everything_scores_one_both_ways():
    s = ratio_effects(
        CLEAN, CORRUPT, torch.stack([CLEAN, CORRUPT]), torch.tensor([True, False]), resamples=200
    )
    np.testing.assert_allclose(s["effect"], [1.0, 1.0])
    np.testing.assert_allclose(s["ci_low"], [1.0, 1.0])  # every resample: exactly 1
    np.testing.assert_allclose(s["ci_high"], [1.0, 1.0])


def test_interval_is_the_percentile_of_resampled_ratios_of_means():
    g = torch.Generator().manual_seed(1)
    clean = 5 + torch.randn(40, generator=g, dtype=torch.float64)
    corrupt = torch.randn(40, generator=g, dtype=torch.float64)
    patched = (
        0.3 * clean + 0.7 * corrupt + 0.5 * torch.randn(40, generator=g, dtype=torch.float64)
    )[None]
    s = ratio_effects(clean, corrupt, patched, torch.tensor([True]), resamples=500, seed=7)
    w = draw_weights(40, 500, 7)
    ratios = [
        (float(w[r] @ patched[0]) - float(w[r] @ corrupt))
        / (float(w[r] @ clean) - float(w[r] @ corrupt))
        for r in range(500)
    ]
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    assert s["ci_low"][0] == pytest.approx(lo, abs=1e-9) and s["ci_high"][0] == pytest.approx(
        hi, abs=1e-9
    )
    assert s["ci_low"][0] < s["effect"][0] < s["ci_high"][0]
    again = ratio_effects(clean, corrupt, patched, torch.tensor([True]), resamples=500, seed=7)
    assert again["ci_low"][0] == s["ci_low"][0]  # seeded


def test_no_gap_gives_no_ratio():
    same = torch.ones(3, dtype=torch.float64)
    s = ratio_effects(same, same, same[None], torch.tensor([True]), resamples=20)
    assert np.isnan(s["effect"][0]) and np.isnan(s["ci_low"][0]) and s["delta"][0] == 0


def test_baseline_table_and_names():
    base = {
        "clean": CLEAN,
        "corrupt": CORRUPT,
        "clean_logit_diff": CLEAN,
        "corrupt_logit_diff": CORRUPT,
    }
    t = baseline_table("t", "logit_diff", base, 100, 0.95, 0).set_index("prompt")
    assert t.loc["clean", "mean"] == 5.0 and t.loc["corrupt", "share_correct"] == 0.25
    assert t.loc["clean - corrupt", "mean"] == 5.0
    assert mean_interval(CLEAN, 0)[0] == 5.0
    assert head_name(3, 7) == "L3H7" and head_name(3, 1, kv=True) == "L3KV1"
