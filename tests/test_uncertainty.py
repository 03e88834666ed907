"""The bootstrap over sequences: intervals that behave, label stability, and runs that reproduce
them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope
from headscope.errors import HeadscopeError
from headscope.uncertainty import bootstrap


def _sequences(n: int, seed: int = 0):
    """n sequences of 20 queries each; per-query values ~ Bernoulli(0.3): score 0.3 in
    expectation."""
    g = torch.Generator().manual_seed(seed)
    hits = (torch.rand(n, 20, generator=g) < 0.3).double()  # [sequence, query]
    return hits.sum(1)[:, None, None], torch.full((n,), 20.0, dtype=torch.float64)  # [n, 1, 1], [n]


def test_identical_sequences_give_a_point():
    total = torch.full((7, 2, 3), 3.0, dtype=torch.float64)
    count = torch.full((7,), 4.0, dtype=torch.float64)
    b = bootstrap(total, count, lambda s: s >= 0.5)
    assert (b.ci_low == 0.75).all() and (b.ci_high == 0.75).all() and (b.stability == 1.0).all()


def test_more_sequences_narrow_the_interval_around_the_score():
    widths = []
    for n in (20, 80, 320):
        total, count = _sequences(n)
        b = bootstrap(total, count)
        score = float(total.sum() / count.sum())
        assert float(b.ci_low) <= score <= float(b.ci_high)
        widths.append(float(b.ci_high - b.ci_low))
    assert widths[0] > widths[1] > widths[2]
    assert widths[0] / widths[2] == pytest.approx(4.0, rel=0.35)  # ~ 1 / sqrt(n)


def test_seeded_and_stability_is_the_share_of_resamples_passing():
    total, count = _sequences(40)
    a, b = (
        bootstrap(total, count, resamples=300, seed=1),
        bootstrap(total, count, resamples=300, seed=1),
    )
    assert torch.equal(a.ci_low, b.ci_low) and torch.equal(a.ci_high, b.ci_high)
    c = bootstrap(total, count, resamples=300, seed=2)
    assert not torch.equal(a.ci_low, c.ci_low)
    score = float(total.sum() / count.sum())
    near = bootstrap(total, count, lambda s: s >= score).stability.item()
    assert 0.3 < near < 0.7  # the threshold at the score itself: about half the resamples pass
    assert bootstrap(total, count, lambda s: s >= 0.0).stability.item() == 1.0
    assert bootstrap(total, count, lambda s: s >= 0.9).stability.item() == 0.0
    assert bootstrap(total, count, None).stability is None


def test_heads_never_measured_have_no_interval_and_bad_settings_are_one_line():
    total = torch.ones(5, 1, 2, dtype=torch.float64)
    total[:, 0, 1] = float("nan")  # head 1 was not measured (an effect not computed)
    b = bootstrap(total, torch.ones(5, dtype=torch.float64), lambda s: s > 0)
    assert b.ci_low[0, 0] == 1.0 and torch.isnan(b.ci_low[0, 1]) and torch.isnan(b.stability[0, 1])
    with pytest.raises(HeadscopeError, match=r"ci \(--ci\) is a coverage level between 0 and 1"):
        bootstrap(total, torch.ones(5), level=95)
    with pytest.raises(
        HeadscopeError, match=r"bootstrap \(--bootstrap\) must be 0 \(off\) or more"
    ):
        bootstrap(total, torch.ones(5), resamples=-1)


def test_a_saved_run_reproduces_its_intervals_from_its_per_sequence_sums(tiny_gpt2, tmp_path):
    from headscope.catalog import describe
    from headscope.uncertainty import passes_fn

    probes = [
        headscope.text_probe(tiny_gpt2, n_prompts=6),
        headscope.repeat_probe(tiny_gpt2, 5, n_sequences=4),
    ]
    result = headscope.scan(tiny_gpt2, probes, bootstrap=200, ci=0.9, bootstrap_seed=3)
    run = headscope.load_run(headscope.save_run(result, tmp_path / "run", figures=False))
    settings = run.metadata["bootstrap"]
    assert (settings["resamples"], settings["level"], settings["seed"]) == (200, 0.9, 3)
    for name, rec in run.per_sequence.items():
        # 6 text, 4 repeat (and its null)
        n_sequences = {p.name: len(p) for p in result.probes}[rec["probe"]]
        assert rec["total"].shape == (n_sequences, 2, 4)
        b = bootstrap(
            torch.tensor(rec["total"]),
            torch.tensor(rec["count"]),
            passes_fn(describe(name)),
            settings["resamples"],
            settings["level"],
            settings["seed"],
        )
        rows = run.scores[run.scores.metric == name]
        np.testing.assert_allclose(
            rows["ci_low"].to_numpy(), b.ci_low.flatten().numpy(), rtol=1e-7, equal_nan=True
        )
        np.testing.assert_allclose(
            rows["ci_high"].to_numpy(), b.ci_high.flatten().numpy(), rtol=1e-7, equal_nan=True
        )
        # the pooled score is the per-sequence sums pooled
        pooled = rec["total"].sum(0).flatten() / rec["count"].sum()
        np.testing.assert_allclose(rows["score"].to_numpy(), pooled, rtol=1e-7, equal_nan=True)
