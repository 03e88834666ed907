"""What every metric shares (headscope/metrics/base.py): selectors, pooling, the uniform head, the
registry."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.errors import HeadscopeError
from headscope.metrics import (
    REGISTRY,
    Metric,
    PatternBatch,
    Pooled,
    get_metric,
    register,
    uniform_pattern,
)
from headscope.metrics.base import (
    at_key,
    at_offset,
    key_set_flags,
    key_set_mass,
    pool,
    query_positions,
    query_range,
    row_entropy,
    visible_keys,
)
from tests.metrics.patterns import batch, causal_uniform

# ------------------------------------------------------------------------------ selectors


def test_query_positions_start_at_q_start():
    A = torch.zeros(1, 1, 3, 8)
    assert query_positions(A, batch(8, q_start=5)).tolist() == [5, 6, 7]


def test_query_range_bounds_and_padding():
    A = causal_uniform(4)
    b = batch(4)
    assert query_range(A, b, 1, b.lengths - 1).tolist() == [[False, True, True, True]]
    two = PatternBatch(lengths=torch.tensor([4, 2]), causal=True)
    A2 = torch.zeros(2, 1, 4, 4)
    # per-sequence upper bounds, and padding rows never qualify
    assert query_range(A2, two, 0, torch.tensor([3, 3])).tolist() == [
        [True] * 4,
        [True, True, False, False],
    ]


def test_visible_keys():
    A = causal_uniform(4)
    assert (
        visible_keys(A, batch(4))[0].tolist()
        == torch.tril(torch.ones(4, 4, dtype=torch.bool)).tolist()
    )
    enc = visible_keys(torch.zeros(1, 1, 3, 4), batch(3, causal=False))[0]
    assert enc.tolist() == [[True, True, True, False]] * 3  # key 3 is padding


def test_at_offset_and_at_key():
    A = causal_uniform(4)
    b = batch(4)
    assert at_offset(A, b, -1)[0, 0].tolist() == pytest.approx([0.0, 0.5, 1 / 3, 0.25])
    assert at_offset(A, b, +1)[0, 0].tolist() == [0.0, 0.0, 0.0, 0.0]  # causal: never a later key
    assert at_key(A, b, 0)[0, 0].tolist() == pytest.approx([1.0, 0.5, 1 / 3, 0.25])
    assert at_key(A, b, 9)[0, 0].tolist() == [0.0] * 4  # past the key axis


def test_row_entropy_skips_zeros():
    A = torch.tensor([[1.0, 0], [0.5, 0.5]])[None, None]
    assert row_entropy(A, batch(2))[0, 0].tolist() == pytest.approx([0.0, math.log(2)])


def test_key_set_flags():
    b = batch(4, separator=torch.tensor([[True, True, False, True]]))
    assert key_set_flags(b, "separator", 4)[0].tolist() == [False, True, False, True]  # never k = 0
    assert key_set_flags(b, None, 4)[0].tolist() == [False, True, True, True]
    assert key_set_flags(batch(2), None, 4, from_key=0)[0].tolist() == [True, True, False, False]
    with pytest.raises(HeadscopeError, match="needs key flags 'punctuation'"):
        key_set_flags(b, "punctuation", 4)


def test_key_set_mass_in_a_query_block():
    """A block of rows from q_start on gives the rows of the full result."""
    A = causal_uniform(6)
    flags = torch.tensor([[False, False, True, False, True, False]])
    full = key_set_mass(A, batch(6, separator=flags), "separator")
    block = key_set_mass(A[:, :, 3:], batch(6, q_start=3, separator=flags), "separator")
    # queries 2..5, of which 3..5 in the block
    assert full.count.item() == 4 and block.count.item() == 3
    assert block.total.item() == pytest.approx(1 / 4 + 2 / 5 + 2 / 6)


# ------------------------------------------------------------------------------ pooling and chance


def test_pool_sums_in_float64():
    values = torch.tensor([[[1.0, 2.0, 4.0]], [[8.0, 16.0, 32.0]]])  # [batch=2, head=1, query=3]
    mask = torch.tensor([[True, False, True], [False, False, False]])
    p = pool(values, mask)
    assert p.total.tolist() == [[5.0], [0.0]] and p.count.tolist() == [2.0, 0.0]
    assert p.total.dtype == p.count.dtype == torch.float64
    s = p.score()
    assert s[0, 0].item() == 2.5 and math.isnan(s[1, 0].item())


def test_pooled_is_a_named_pair():
    p = Pooled(torch.ones(1, 2, dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64))
    total, count = p
    assert total is p.total and count is p.count and p.score().tolist() == [[0.5, 0.5]]


@pytest.mark.parametrize("causal", [True, False])
def test_uniform_pattern_rows(causal):
    b = PatternBatch(lengths=torch.tensor([4, 2]), causal=causal)
    U = uniform_pattern((2, 1, 4, 4), b)
    assert U.shape == (2, 1, 4, 4)
    if causal:
        torch.testing.assert_close(U[:1], causal_uniform(4))
    else:
        assert U[0, 0].tolist() == [[0.25] * 4] * 4
    assert U[1, 0, :, 2:].abs().sum() == 0  # padding keys get nothing
    assert U[1, 0, 1].tolist() == [0.5, 0.5, 0.0, 0.0]


# ------------------------------------------------------------------------------ Metric and the
# registry


def test_metric_passes():
    above = Metric(
        name="x", probe="text", fn=lambda A, b: None, definition="d", label="l", threshold=0.5
    )
    below = Metric(
        name="y",
        probe="text",
        fn=lambda A, b: None,
        definition="d",
        label="l",
        threshold=0.5,
        below=True,
    )
    assert above.passes(0.5) and not above.passes(0.49) and above.passes(0.3, threshold=0.2)
    assert below.passes(0.5) and not below.passes(0.51) and not below.passes(0.3, threshold=0.2)
    assert not above.passes(float("nan")) and not below.passes(float("nan"))


def test_metric_calls_its_function():
    seen = []
    m = Metric(
        name="x",
        probe="text",
        fn=lambda A, b: seen.append((A, b)) or "out",
        definition="",
        label="",
        threshold=0.0,
    )
    b = batch(1)
    assert m("A", b) == "out" and seen == [("A", b)]


def test_register_refuses_duplicates_and_bad_probes(monkeypatch):
    # keep the real one clean
    monkeypatch.setattr("headscope.metrics.base.REGISTRY", dict(REGISTRY))
    from headscope.metrics import base

    m = REGISTRY["sink"]
    with pytest.raises(ValueError, match="^A metric named 'sink' is already registered.$"):
        register(Metric(name="sink", probe="text", fn=m.fn, definition="", label="", threshold=0.5))
    with pytest.raises(
        ValueError,
        match=r"^Metric 'new': probe must be one of text, repeat, "
        r"needle, not 'image'\.$",
    ):
        register(Metric(name="new", probe="image", fn=m.fn, definition="", label="", threshold=0.5))
    new = Metric(name="new", probe="repeat", fn=m.fn, definition="", label="", threshold=0.5)
    assert register(new) is new and base.REGISTRY["new"] is new
    assert "new" not in REGISTRY  # the package's registry was not touched


def test_get_metric_suggests_names():
    assert get_metric("sink") is REGISTRY["sink"]
    with pytest.raises(
        HeadscopeError,
        match=r"^Unknown metric 'inductoin'\. Did you mean: "
        r"induction\? Known: "
        r"previous_token, next_token, ",
    ):
        get_metric("inductoin")
    with pytest.raises(HeadscopeError, match=r"^Unknown metric 'zzz'\. Known: "):
        get_metric("zzz")
