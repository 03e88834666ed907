"""duplicate_token (headscope/metrics/duplicate_token.py): on BOS+R+R, f(A, q) = A[q, q-L] over
queries L+1..2L."""

from __future__ import annotations

import pytest

from headscope.errors import HeadscopeError
from headscope.metrics import get_metric, uniform_pattern
from tests.metrics.patterns import batch, repeat_pattern

METRIC = get_metric("duplicate_token")


def test_definition():
    assert (METRIC.probe, METRIC.label, METRIC.threshold, METRIC.below) == (
        "repeat",
        "duplicate-token head",
        0.4,
        False,
    )


def test_perfect_duplicate_head():
    L = 4
    r = METRIC(repeat_pattern(L, -L), batch(2 * L + 1, repeat_len=L))
    assert r.count.item() == L and r.score().item() == pytest.approx(1.0)


def test_induction_head_is_not_duplicate():
    L = 4
    assert METRIC(
        repeat_pattern(L, -(L - 1)), batch(2 * L + 1, repeat_len=L)
    ).score().item() == pytest.approx(0.0)


def test_encoder_chance():
    L = 3
    n = 2 * L + 2
    b = batch(n, causal=False, repeat_len=L)
    assert METRIC(uniform_pattern((1, 1, n, n), b), b).score().item() == pytest.approx(1 / n)


def test_needs_repeat_len():
    with pytest.raises(HeadscopeError, match="repeat_len"):
        METRIC(repeat_pattern(2, -2), batch(5))
