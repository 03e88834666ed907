"""induction (headscope/metrics/induction.py): on BOS+R+R, f(A, q) = A[q, q-L+1] over queries
L+1..2L."""

from __future__ import annotations

import pytest

from headscope.errors import HeadscopeError
from headscope.metrics import get_metric, uniform_pattern
from tests.metrics.patterns import batch, repeat_pattern

METRIC = get_metric("induction")


def test_definition():
    assert (METRIC.probe, METRIC.label, METRIC.threshold, METRIC.below) == (
        "repeat",
        "induction head",
        0.4,
        False,
    )


def test_perfect_induction_head():
    L = 4
    r = METRIC(repeat_pattern(L, -(L - 1)), batch(2 * L + 1, repeat_len=L))
    assert r.count.item() == L  # queries L+1..2L
    assert r.score().item() == pytest.approx(1.0)


def test_duplicate_head_is_not_induction():
    L = 4
    assert METRIC(
        repeat_pattern(L, -L), batch(2 * L + 1, repeat_len=L)
    ).score().item() == pytest.approx(0.0)


def test_encoder_trailing_sep_is_not_a_query():
    """[CLS] + R + R + [SEP]: the final [SEP] query (q = 2L+1) is not a qualifying query."""
    L = 3
    n = 2 * L + 2
    r = METRIC(repeat_pattern(L, -(L - 1), n), batch(n, causal=False, repeat_len=L))
    assert r.count.item() == L and r.score().item() == pytest.approx(1.0)


def test_causal_chance():
    L = 3
    b = batch(2 * L + 1, repeat_len=L)
    U = uniform_pattern((1, 1, 2 * L + 1, 2 * L + 1), b)
    expected = sum(1 / (q + 1) for q in range(L + 1, 2 * L + 1)) / L
    assert METRIC(U, b).score().item() == pytest.approx(expected)


@pytest.mark.parametrize("repeat_len", [None, 0])
def test_needs_repeat_len(repeat_len):
    with pytest.raises(
        HeadscopeError,
        match=r"^Repeat-probe metrics need PatternBatch\.repeat_len "
        r"\(L >= 1\)\.$",
    ):
        METRIC(repeat_pattern(2, -1), batch(5, repeat_len=repeat_len))
