"""punctuation (headscope/metrics/punctuation.py): mass on visible punctuation keys k >= 1."""

from __future__ import annotations

import pytest
import torch

from headscope.errors import HeadscopeError
from headscope.metrics import get_metric
from tests.metrics.patterns import batch, causal_uniform

METRIC = get_metric("punctuation")


def test_definition():
    assert (METRIC.probe, METRIC.label, METRIC.threshold, METRIC.below) == (
        "text",
        "punctuation head",
        0.5,
        False,
    )


def test_mass_on_an_encoder():
    n = 4
    punct = torch.tensor([[False, True, False, True]])
    A = torch.zeros(1, 1, n, n)
    A[0, 0, :, 1] = 0.25
    A[0, 0, :, 3] = 0.5
    A[0, 0, :, 0] = 0.25
    r = METRIC(A, batch(n, causal=False, punctuation=punct))
    assert r.count.item() == 4 and r.score().item() == pytest.approx(0.75)


def test_causal_queries_before_the_first_punctuation_do_not_qualify():
    n = 5
    punct = torch.tensor([[False, False, False, True, True]])  # "." at 3 and 4
    r = METRIC(causal_uniform(n), batch(n, punctuation=punct))
    assert r.count.item() == 2  # queries 3 and 4
    assert r.score().item() == pytest.approx((1 / 4 + 2 / 5) / 2)


def test_docstring_case():
    A = torch.tensor([[0.5, 0.5, 0], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]])[None, None]
    punct = torch.tensor([[False, False, True]])
    assert METRIC(A, batch(3, causal=False, punctuation=punct)).score().item() == pytest.approx(
        0.85 / 3
    )


def test_needs_punctuation_flags():
    with pytest.raises(HeadscopeError, match="needs key flags 'punctuation'"):
        METRIC(causal_uniform(3), batch(3, separator=torch.ones(1, 3, dtype=torch.bool)))
