"""separator (headscope/metrics/separator.py): mass on visible separator keys k >= 1."""

from __future__ import annotations

import pytest
import torch

from headscope.errors import HeadscopeError
from headscope.metrics import get_metric
from tests.metrics.patterns import batch, causal_uniform

METRIC = get_metric("separator")


def test_definition():
    assert (METRIC.probe, METRIC.label, METRIC.threshold, METRIC.below) == (
        "text",
        "separator head",
        0.5,
        False,
    )


def test_mass_and_qualifying_queries():
    # tokens: BOS a SEP b c ; separator at position 2
    n = 5
    sep = torch.tensor([[False, False, True, False, False]])
    r = METRIC(causal_uniform(n), batch(n, separator=sep))
    # queries 2, 3, 4 see the SEP (k=2 <= q); uniform mass 1/3, 1/4, 1/5
    assert r.count.item() == 3
    assert r.score().item() == pytest.approx((1 / 3 + 1 / 4 + 1 / 5) / 3)


def test_never_counts_position_zero():
    """GPT-2's BOS is its EOS: a separator flag at position 0 must not double-count the sink."""
    n = 4
    sep = torch.tensor([[True, False, False, False]])
    A = torch.zeros(1, 1, n, n)
    A[..., 0] = 1.0
    r = METRIC(A, batch(n, separator=sep))
    assert r.count.item() == 0  # no separator key at k >= 1
    sep2 = torch.tensor([[True, False, False, True]])
    r2 = METRIC(A, batch(n, separator=sep2))
    assert r2.count.item() == 1 and r2.score().item() == pytest.approx(0.0)


def test_encoder_query_zero_qualifies():
    """Bidirectional: [CLS] (q = 0) sees the [SEP] keys, so it qualifies."""
    n = 4
    sep = torch.tensor([[False, False, True, True]])
    A = torch.zeros(1, 1, n, n)
    A[..., 2] = 0.5
    A[..., 3] = 0.5
    r = METRIC(A, batch(n, causal=False, separator=sep))
    assert r.count.item() == 4 and r.score().item() == pytest.approx(1.0)


def test_needs_separator_flags():
    with pytest.raises(
        HeadscopeError,
        match=r"^This metric needs key flags 'separator' in its "
        r"PatternBatch\.$",
    ):
        METRIC(causal_uniform(3), batch(3))
