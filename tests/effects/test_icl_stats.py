"""The ICL run's statistics (headscope.effects.icl_stats) against closed forms."""

from __future__ import annotations

import math

import torch

from headscope.effects import icl_stats as st


def test_spearman_and_ranks_with_ties():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert float(st.spearman(a, a * 10 + 3)) == 1.0
    assert abs(float(st.spearman(a, -a)) + 1.0) < 1e-12
    tied = torch.tensor([10.0, 20.0, 20.0, 30.0])
    assert st.ranks(tied).tolist() == [1.0, 2.5, 2.5, 4.0]
    # by hand: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4): Pearson of the ranks
    r = torch.tensor([1, 2.5, 2.5, 4], dtype=torch.float64) - 2.5
    s = torch.tensor([1.0, 2, 3, 4], dtype=torch.float64) - 2.5
    want = float((r * s).sum() / ((r**2).sum() * (s**2).sum()).sqrt())
    assert abs(float(st.spearman(tied, torch.tensor([1.0, 2, 3, 4]))) - want) < 1e-12
    # batched along the first dimension
    both = st.spearman(torch.stack([a, a]), torch.stack([a, -a]))
    torch.testing.assert_close(both, torch.tensor([1.0, -1.0], dtype=torch.float64))


def test_overlap_and_its_chance():
    a = torch.tensor([5.0, 4, 3, 2, 1])
    b = torch.tensor([5.0, 1, 4, 2, 3])
    assert int(st.overlap(a, b, 2)) == 1 and int(st.overlap(a, b, 3)) == 2
    # two random 2-sets of 4 heads: expected overlap 1, both the same with chance 1 / C(4, 2)
    mean, tail = st.overlap_chance(4, 2, 2)
    assert mean == 1.0 and abs(tail - 1 / math.comb(4, 2)) < 1e-12
    assert st.overlap_chance(4, 2, 0)[1] == 1.0


def test_means_over_tasks_and_their_intervals():
    t1 = torch.tensor([[1.0], [3.0]])  # task mean 2
    t2 = torch.tensor([[10.0], [10.0], [10.0], [10.0]])  # task mean 10: tasks weigh equally
    m, lo, hi = st.over_tasks([t1, t2], resamples=2000, seed=0)
    assert float(m[0]) == 6.0
    assert 1.0 <= float(lo[0]) < 6.0 < float(hi[0]) <= 10.0
    m0, lo0, _ = st.over_tasks([t1, t2], resamples=0)
    assert float(m0[0]) == 6.0 and math.isnan(float(lo0[0]))
    # a constant has a zero-width interval
    c = torch.full((5, 2), 0.25)
    _, lo, hi = st.over_tasks([c, c], resamples=200, seed=1)
    assert torch.equal(lo, hi) and float(lo[0]) == 0.25
