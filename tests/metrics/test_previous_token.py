"""previous_token (headscope/metrics/previous_token.py): f(A, q) = A[q, q-1] over queries 1..n-1."""

from __future__ import annotations

import pytest
import torch

from headscope.metrics import PatternBatch, get_metric, uniform_pattern
from tests.metrics.patterns import batch, causal_uniform, shifted

METRIC = get_metric("previous_token")


def test_definition():
    assert (METRIC.probe, METRIC.label, METRIC.threshold, METRIC.below, METRIC.fused) == (
        "text",
        "previous-token head",
        0.5,
        False,
        True,
    )
    assert METRIC.nan_reason is None


def test_perfect_head_and_first_row_ignored():
    A = shifted(6, -1)  # row 0 cannot look back: it looks at itself and must not count
    r = METRIC(A, batch(6))
    assert r.count.item() == 5  # queries 1..5
    assert r.score().item() == pytest.approx(1.0)


def test_head_on_the_current_token_scores_zero():
    r = METRIC(shifted(5, 0), batch(5, causal=False))
    assert r.score().item() == 0.0 and r.count.item() == 4


@pytest.mark.parametrize("causal", [True, False])
def test_uniform_head_is_chance(causal):
    n = 6
    b = batch(n, causal=causal)
    expected = sum(1 / (q + 1) for q in range(1, n)) / (n - 1) if causal else 1 / n
    assert METRIC(uniform_pattern((1, 1, n, n), b), b).score().item() == pytest.approx(expected)
    if causal:
        assert METRIC(causal_uniform(n), b).score().item() == pytest.approx(expected)


def test_per_sequence_totals_and_counts():
    A = torch.cat([shifted(5, -1), shifted(5, 0)])  # [2, 1, 5, 5]
    r = METRIC(A, PatternBatch(lengths=torch.tensor([5, 3]), causal=True))
    assert r.count.tolist() == [4.0, 2.0]
    assert r.total.tolist() == [[4.0], [0.0]] and r.total.dtype == torch.float64
