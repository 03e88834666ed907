"""entropy (headscope/metrics/entropy.py): -sum_k A ln A in nats over queries 1..n-1; labels low
scores."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.metrics import get_metric, uniform_pattern
from tests.metrics.patterns import batch, causal_uniform, shifted

METRIC = get_metric("entropy")


def test_definition():
    assert (METRIC.probe, METRIC.label, METRIC.threshold, METRIC.below) == (
        "text",
        "focused head",
        0.3,
        True,
    )
    assert METRIC.passes(0.3) and METRIC.passes(0.0) and not METRIC.passes(0.31)


def test_closed_form():
    n = 4
    r = METRIC(causal_uniform(n), batch(n))
    expected = sum(math.log(q + 1) for q in range(1, n)) / (n - 1)
    assert r.score().item() == pytest.approx(expected)


def test_one_hot_rows_score_zero():
    assert METRIC(shifted(4, -1), batch(4)).score().item() == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("causal", [True, False])
def test_uniform_head_is_chance(causal):
    n = 6
    b = batch(n, causal=causal)
    expected = sum(math.log(q + 1) for q in range(1, n)) / (n - 1) if causal else math.log(n)
    assert METRIC(uniform_pattern((1, 1, n, n), b), b).score().item() == pytest.approx(expected)


def test_query_zero_excluded():
    A = torch.full((1, 1, 3, 3), 1 / 3)  # every row uniform over 3 keys
    r = METRIC(A, batch(3, causal=False))
    assert r.count.item() == 2 and r.score().item() == pytest.approx(math.log(3))
