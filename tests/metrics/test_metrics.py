"""Closed-form checks of every metric on hand-built patterns.

Each case is small enough to compute on paper: a perfect head scores 1, a uniform head scores its
chance value, padding rows/columns and query 0 are handled as design.md section 4 says.
"""

from __future__ import annotations

import math

import pytest
import torch

from headscope.errors import HeadscopeError
from headscope.metrics import REGISTRY, Metric, PatternBatch, get_metric, register, uniform_pattern
from headscope.metrics.base import at_offset, query_range, visible_keys


def causal_uniform(n: int) -> torch.Tensor:
    """[1, 1, n, n]: row q spreads 1/(q+1) over keys 0..q."""
    A = torch.tril(torch.ones(n, n))
    return (A / A.sum(-1, keepdim=True))[None, None]


def batch(n, causal=True, **kw) -> PatternBatch:
    return PatternBatch(lengths=torch.tensor([n]), causal=causal, **kw)


def shifted(n: int, offset: int, fallback: int = 0) -> torch.Tensor:
    """Row q puts all its weight on key q+offset (or on `fallback` where that key does not exist)."""
    A = torch.zeros(1, 1, n, n)
    for q in range(n):
        k = q + offset
        A[0, 0, q, k if 0 <= k < n else fallback] = 1.0
    return A


# ----------------------------------------------------------------------------- perfect heads


def test_previous_token_perfect_and_first_row_ignored():
    A = shifted(6, -1)  # row 0 cannot look back: it looks at itself and must not count
    r = get_metric("previous_token")(A, batch(6))
    assert r.count.item() == 5  # queries 1..5
    assert r.score().item() == pytest.approx(1.0)


def test_next_token_perfect_on_encoder_and_nan_on_decoder():
    A = shifted(6, +1, fallback=5)
    r = get_metric("next_token")(A, batch(6, causal=False))
    assert r.count.item() == 5  # queries 0..4
    assert r.score().item() == pytest.approx(1.0)
    causal = get_metric("next_token")(causal_uniform(6), batch(6))
    assert math.isnan(causal.score().item()) and causal.count.item() == 5


def test_sink_perfect_and_query_zero_excluded():
    A = torch.zeros(1, 1, 5, 5)
    A[..., 0] = 1.0
    A[0, 0, 0] = 0  # query 0 is excluded, whatever it does
    A[0, 0, 0, 3] = 1.0
    r = get_metric("sink")(A, batch(5, causal=False))
    assert r.count.item() == 4 and r.score().item() == pytest.approx(1.0)


def test_induction_and_duplicate_perfect():
    L = 4
    n = 2 * L + 1
    ind = torch.zeros(1, 1, n, n)
    dup = torch.zeros(1, 1, n, n)
    ind[..., 0] = dup[..., 0] = 1.0
    for q in range(L + 1, 2 * L + 1):
        ind[0, 0, q] = 0
        ind[0, 0, q, q - L + 1] = 1.0
        dup[0, 0, q] = 0
        dup[0, 0, q, q - L] = 1.0
    b = batch(n, repeat_len=L)
    assert get_metric("induction")(ind, b).score().item() == pytest.approx(1.0)
    assert get_metric("induction")(dup, b).score().item() == pytest.approx(0.0)
    assert get_metric("duplicate_token")(dup, b).score().item() == pytest.approx(1.0)
    assert get_metric("induction")(ind, b).count.item() == L  # queries L+1..2L


def test_induction_handles_encoder_trailing_sep():
    """[CLS] + R + R + [SEP]: the final [SEP] query (q = 2L+1) is not a qualifying query."""
    L = 3
    n = 2 * L + 2
    A = torch.zeros(1, 1, n, n)
    A[..., 0] = 1.0
    for q in range(L + 1, 2 * L + 1):
        A[0, 0, q] = 0
        A[0, 0, q, q - L + 1] = 1.0
    r = get_metric("induction")(A, batch(n, causal=False, repeat_len=L))
    assert r.count.item() == L and r.score().item() == pytest.approx(1.0)


def test_separator_mass_and_qualifying_queries():
    # tokens: BOS a SEP b c ; separator at position 2
    n = 5
    sep = torch.tensor([[False, False, True, False, False]])
    A = causal_uniform(n)
    r = get_metric("separator")(A, batch(n, separator=sep))
    # queries 2, 3, 4 see the SEP (k=2 <= q); uniform mass 1/3, 1/4, 1/5
    assert r.count.item() == 3
    assert r.score().item() == pytest.approx((1 / 3 + 1 / 4 + 1 / 5) / 3)


def test_separator_never_counts_position_zero():
    """GPT-2's BOS is its EOS: a separator flag at position 0 must not double-count the sink."""
    n = 4
    sep = torch.tensor([[True, False, False, False]])
    A = torch.zeros(1, 1, n, n)
    A[..., 0] = 1.0
    r = get_metric("separator")(A, batch(n, separator=sep))
    assert r.count.item() == 0  # no separator key at k >= 1
    sep2 = torch.tensor([[True, False, False, True]])
    r2 = get_metric("separator")(A, batch(n, separator=sep2))
    assert r2.count.item() == 1 and r2.score().item() == pytest.approx(0.0)


def test_separator_encoder_query_zero_qualifies():
    """Bidirectional: [CLS] (q = 0) sees the [SEP] keys, so it qualifies."""
    n = 4
    sep = torch.tensor([[False, False, True, True]])
    A = torch.zeros(1, 1, n, n)
    A[..., 2] = 0.5
    A[..., 3] = 0.5
    r = get_metric("separator")(A, batch(n, causal=False, separator=sep))
    assert r.count.item() == 4 and r.score().item() == pytest.approx(1.0)


def test_punctuation_mass():
    n = 4
    punct = torch.tensor([[False, True, False, True]])
    A = torch.zeros(1, 1, n, n)
    A[0, 0, :, 1] = 0.25
    A[0, 0, :, 3] = 0.5
    A[0, 0, :, 0] = 0.25
    r = get_metric("punctuation")(A, batch(n, causal=False, punctuation=punct))
    assert r.count.item() == 4 and r.score().item() == pytest.approx(0.75)


def test_entropy_closed_form():
    n = 4
    r = get_metric("entropy")(causal_uniform(n), batch(n))
    expected = sum(math.log(q + 1) for q in range(1, n)) / (n - 1)
    assert r.score().item() == pytest.approx(expected)
    one_hot = shifted(n, -1)
    assert get_metric("entropy")(one_hot, batch(n)).score().item() == pytest.approx(0.0, abs=1e-9)


# ----------------------------------------------------------------------------- chance


@pytest.mark.parametrize("causal", [True, False])
def test_uniform_head_scores_its_chance(causal):
    """The chance value is defined as the score of a uniform head; check it against closed forms."""
    n = 6
    b = batch(n, causal=causal)
    U = uniform_pattern((1, 1, n, n), b)
    if causal:
        assert torch.allclose(U, causal_uniform(n))
    expected_prev = (sum(1 / (q + 1) for q in range(1, n)) / (n - 1)) if causal else 1 / n
    assert get_metric("previous_token")(U, b).score().item() == pytest.approx(expected_prev)
    assert get_metric("sink")(U, b).score().item() == pytest.approx(expected_prev)
    expected_h = (sum(math.log(q + 1) for q in range(1, n)) / (n - 1)) if causal else math.log(n)
    assert get_metric("entropy")(U, b).score().item() == pytest.approx(expected_h)


# ----------------------------------------------------------------------------- padding


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["previous_token", "next_token", "sink", "separator", "punctuation", "entropy"])
def test_padding_gives_same_scores_as_unpadded(name, causal):
    """A sequence padded to a longer batch must score exactly as it does alone."""
    g = torch.Generator().manual_seed(1)
    n, pad = 5, 3
    logits = torch.randn(1, 2, n, n, generator=g)
    if causal:
        logits = logits.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), -torch.inf)
    A = logits.softmax(-1)
    flags = torch.tensor([[False, True, False, True, False]])
    alone = get_metric(name)(A, PatternBatch(torch.tensor([n]), causal, separator=flags, punctuation=flags))
    # pad with garbage that must be ignored: rows and columns past n
    big = torch.rand(1, 2, n + pad, n + pad, generator=g)
    big[..., :n, :n] = A
    big[..., :n, n:] = 0.0  # what a masked softmax gives real queries
    flags_big = torch.cat([flags, torch.ones(1, pad, dtype=torch.bool)], 1)  # padded flags ignored too
    padded = get_metric(name)(big, PatternBatch(torch.tensor([n]), causal, separator=flags_big, punctuation=flags_big))
    assert padded.count.item() == alone.count.item()
    torch.testing.assert_close(padded.total, alone.total, equal_nan=True)


def test_blocked_queries_sum_to_the_full_pattern():
    """Splitting the query axis into blocks (q_start) gives the same totals: the long-context path."""
    g = torch.Generator().manual_seed(2)
    n, L = 9, 4
    A = torch.randn(2, 3, n, n, generator=g).masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), -torch.inf).softmax(-1)
    flags = torch.rand(2, n, generator=g) > 0.5
    lengths = torch.tensor([n, n - 2])
    for m in REGISTRY.values():
        full = m(A, PatternBatch(lengths, True, separator=flags, punctuation=flags, repeat_len=L))
        parts = [m(A[:, :, s:s + 4], PatternBatch(lengths, True, q_start=s, separator=flags, punctuation=flags, repeat_len=L))
                 for s in range(0, n, 4)]
        torch.testing.assert_close(sum(p.total for p in parts), full.total, equal_nan=True)
        torch.testing.assert_close(sum(p.count for p in parts), full.count)


def test_metrics_never_write_into_the_pattern():
    A = causal_uniform(6).repeat(1, 2, 1, 1)
    before = A.clone()
    flags = torch.ones(1, 6, dtype=torch.bool)
    for m in REGISTRY.values():
        m(A, PatternBatch(torch.tensor([6]), True, separator=flags, punctuation=flags, repeat_len=2))
    assert torch.equal(A, before)


# ----------------------------------------------------------------------------- selectors & registry


def test_selectors_shapes_and_bounds():
    A = causal_uniform(4)
    b = batch(4)
    assert query_range(A, b, 1, b.lengths - 1).tolist() == [[False, True, True, True]]
    assert visible_keys(A, b)[0].tolist() == torch.tril(torch.ones(4, 4, dtype=torch.bool)).tolist()
    assert at_offset(A, b, -1)[0, 0].tolist() == pytest.approx([0.0, 0.5, 1 / 3, 0.25])


def test_registry_refuses_duplicates_and_suggests_names():
    m = REGISTRY["sink"]
    with pytest.raises(ValueError, match="already registered"):
        register(Metric(name="sink", probe="text", fn=m.fn, definition="", label="", threshold=0.5))
    with pytest.raises(HeadscopeError, match="Did you mean: induction"):
        get_metric("inductoin")


def test_all_required_metrics_are_registered():
    assert set(REGISTRY) == {"previous_token", "next_token", "sink", "separator", "punctuation",
                             "entropy", "induction", "duplicate_token"}
    for m in REGISTRY.values():
        assert m.definition and m.label and m.threshold == m.threshold
