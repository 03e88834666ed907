"""next_token (headscope/metrics/next_token.py): f(A, q) = A[q, q+1] over queries 0..n-2; NaN on
causal models."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.metrics import PatternBatch, get_metric, uniform_pattern
from headscope.metrics.next_token import CAUSAL_REASON
from tests.metrics.patterns import batch, causal_uniform, shifted

METRIC = get_metric("next_token")


def test_definition():
    assert (METRIC.probe, METRIC.label, METRIC.threshold, METRIC.below) == (
        "text",
        "next-token head",
        0.5,
        False,
    )
    assert METRIC.nan_reason == CAUSAL_REASON and CAUSAL_REASON.startswith("causal model:")


def test_perfect_on_encoder():
    A = shifted(6, +1, fallback=5)
    r = METRIC(A, batch(6, causal=False))
    assert r.count.item() == 5  # queries 0..4; the last token has no next one
    assert r.score().item() == pytest.approx(1.0)


def test_nan_on_decoder_with_the_queries_counted():
    r = METRIC(causal_uniform(6), batch(6))
    assert math.isnan(r.score().item()) and r.count.item() == 5
    assert r.total.shape == (1, 1) and r.total.dtype == torch.float64


def test_encoder_chance_is_one_over_n():
    n = 5
    b = batch(n, causal=False)
    assert METRIC(uniform_pattern((1, 1, n, n), b), b).score().item() == pytest.approx(1 / n)


def test_padding_is_not_a_next_token():
    """A query just before the padding has no next token: it does not qualify."""
    A = shifted(6, +1, fallback=5)
    r = METRIC(A, PatternBatch(lengths=torch.tensor([4]), causal=False))
    assert r.count.item() == 3 and r.score().item() == pytest.approx(1.0)
