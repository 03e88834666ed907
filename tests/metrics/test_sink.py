"""sink (headscope/metrics/sink.py): f(A, q) = A[q, 0] over queries 1..n-1."""

from __future__ import annotations

import pytest
import torch

from headscope.metrics import PatternBatch, get_metric, uniform_pattern
from tests.metrics.patterns import batch

METRIC = get_metric("sink")


def test_definition():
    assert (METRIC.probe, METRIC.label, METRIC.threshold, METRIC.below, METRIC.fused) == (
        "text",
        "sink head",
        0.5,
        False,
        True,
    )


def test_perfect_and_query_zero_excluded():
    A = torch.zeros(1, 1, 5, 5)
    A[..., 0] = 1.0
    A[0, 0, 0] = 0  # query 0 is excluded, whatever it does
    A[0, 0, 0, 3] = 1.0
    r = METRIC(A, batch(5, causal=False))
    assert r.count.item() == 4 and r.score().item() == pytest.approx(1.0)


def test_docstring_case():
    A = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.25, 0.25, 0.5]])[None, None]
    assert METRIC(A, batch(3)).score().item() == pytest.approx(0.375)


@pytest.mark.parametrize("causal", [True, False])
def test_uniform_head_is_chance(causal):
    n = 6
    b = batch(n, causal=causal)
    expected = sum(1 / (q + 1) for q in range(1, n)) / (n - 1) if causal else 1 / n
    assert METRIC(uniform_pattern((1, 1, n, n), b), b).score().item() == pytest.approx(expected)


def test_a_one_token_sequence_has_no_query():
    r = METRIC(torch.ones(1, 1, 3, 3) / 3, PatternBatch(lengths=torch.tensor([1]), causal=False))
    assert r.count.item() == 0 and torch.isnan(r.score()).all()
