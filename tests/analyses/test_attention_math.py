"""Attention by hand (lib.attention_math) against closed forms and the article's
numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headscope.errors import HeadscopeError
from lib.attention_math import (
    ARTICLE_TOKENS,
    article_example,
    attention,
    causal_mask,
    permutation_gap,
    repeat_kv,
    softmax_slope,
    weights_figure,
)


def _qkv(*, seed: int = 0, n: int = 6, d_k: int = 5, d_v: int = 3, lead: tuple[int, ...] = ()):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*lead, *shape, generator=gen, dtype=torch.float64)

    return r(n, d_k), r(n, d_k), r(n, d_v)


def _article():
    ex = article_example()
    return tuple(ex["X"] @ ex[w] for w in ("WQ", "WK", "WV"))


# ------------------------------------------------------------------------ the article's example


def test_article_queries_keys_values():
    Q, K, V = _article()
    assert Q.tolist() == [[0, 1], [1, 0], [2, 0], [1, 1]]
    assert K.tolist() == [[0, 1], [2, 0], [0, 1], [2, 1]]
    assert V.tolist() == [[0, 0], [1, 0], [0, 1], [1, 0]]
    assert (Q @ K.T)[2].tolist() == [0, 4, 0, 4]  # "bank" against every key


def test_article_bank_row():
    Q, K, V = _article()
    out, w = attention(Q, K, V)
    scaled = (Q @ K.T / math.sqrt(2))[2]
    assert scaled.round(decimals=2).tolist() == [0.0, 2.83, 0.0, 2.83]
    e = math.exp(4 / math.sqrt(2))
    assert round(e, 2) == 16.92 and round(2 + 2 * e, 2) == 35.84  # the article's softmax arithmetic
    assert w[2].round(decimals=3).tolist() == [0.028, 0.472, 0.028, 0.472]
    assert out[2].round(decimals=3).tolist() == [0.944, 0.028]
    assert round(float(w[2, 1] + w[2, 3]), 2) == 0.94  # 94% on the two water words


def test_article_causal():
    Q, K, V = _article()
    out, w = attention(Q, K, V, causal=True)
    assert w[2].round(decimals=3).tolist() == [0.053, 0.894, 0.053, 0.0]
    assert out[2].round(decimals=3).tolist() == [0.894, 0.053]
    assert w[0].tolist() == [1.0, 0.0, 0.0, 0.0]  # "The" can only look at itself
    full_out, full_w = attention(Q, K, V)
    torch.testing.assert_close(w[-1], full_w[-1])  # the last token already saw everything
    torch.testing.assert_close(out[-1], full_out[-1])


# ------------------------------------------------------------------------ attention in general


@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_sdpa(causal):
    Q, K, V = _qkv(lead=(2, 3))
    out, _ = attention(Q, K, V, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=causal)
    torch.testing.assert_close(out, ref)


def test_causal_rows_sum_to_one_and_upper_triangle_is_exactly_zero():
    Q, K, V = _qkv(n=7, lead=(4,))
    Q = Q * 30  # huge scores: the mask must still give exact zeros, not tiny numbers
    _, w = attention(Q, K, V, causal=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 7, dtype=torch.float64))
    upper = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert (w[:, upper] == 0).all()
    assert (w[:, ~upper] >= 0).all()


def test_unscaled_and_custom_scale():
    Q, K, V = _qkv()
    _, w1 = attention(Q, K, V, scale=1.0)
    torch.testing.assert_close(w1, (Q @ K.T).softmax(-1))
    _, w2 = attention(Q * 2, K, V, scale=0.5 / math.sqrt(Q.shape[-1]))
    torch.testing.assert_close(w2, attention(Q, K, V)[1])


def test_kv_cache_step_from_scratch():
    """One new query against all cached keys = the last row of the full causal computation."""
    Q, K, V = _qkv(n=8)
    out, w = attention(Q, K, V, causal=True)
    step_out, step_w = attention(Q[-1:], K, V, causal=True)
    torch.testing.assert_close(step_out[0], out[-1])
    torch.testing.assert_close(step_w[0], w[-1])
    # appending a token never changes earlier rows
    prefix_out, prefix_w = attention(Q[:-1], K[:-1], V[:-1], causal=True)
    torch.testing.assert_close(w[:-1, :-1], prefix_w)
    assert (w[:-1, -1] == 0).all()
    torch.testing.assert_close(out[:-1], prefix_out)


def test_causal_mask_shapes():
    assert causal_mask(2, 4).int().tolist() == [[0, 0, 0, 1], [0, 0, 0, 0]]
    with pytest.raises(HeadscopeError, match="at least as many keys"):
        causal_mask(3, 2)


def test_permutation_equivariance_without_positions():
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(9, 6, generator=gen, dtype=torch.float64)
    WQ, WK, WV = (torch.randn(6, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    perm = torch.randperm(9, generator=gen).tolist()
    a = attention(X @ WQ, X @ WK, X @ WV)
    b = attention(X[perm] @ WQ, X[perm] @ WK, X[perm] @ WV)
    d_out, d_w = permutation_gap(*a, *b, perm)
    assert d_out < 1e-12 and d_w < 1e-12
    # the causal mask is tied to position, so it breaks equivariance
    a = attention(X @ WQ, X @ WK, X @ WV, causal=True)
    b = attention(X[perm] @ WQ, X[perm] @ WK, X[perm] @ WV, causal=True)
    assert min(permutation_gap(*a, *b, perm)) > 1e-3


def test_article_shuffle_gives_same_weights():
    ex = article_example()
    X = ex["X"]
    perm = [3, 1, 0, 2]
    a = attention(*(X @ ex[w] for w in ("WQ", "WK", "WV")))
    b = attention(*(X[perm] @ ex[w] for w in ("WQ", "WK", "WV")))
    assert max(permutation_gap(*a, *b, perm)) < 1e-12  # equal up to summation order


def test_repeat_kv_grouping():
    kv = torch.arange(3.0).view(3, 1, 1).expand(3, 4, 2)  # [kv_head, pos, d]
    out = repeat_kv(kv, 9)
    assert out.shape == (9, 4, 2)
    assert [int(out[h, 0, 0]) for h in range(9)] == [h // 3 for h in range(9)]
    assert torch.equal(repeat_kv(kv, 3), kv)  # plain multi-head attention: nothing to share
    with pytest.raises(HeadscopeError, match="evenly"):
        repeat_kv(kv, 4)


def test_softmax_slope_closed_forms():
    for n in (2, 4, 8):
        assert softmax_slope(torch.zeros(n, dtype=torch.float64)).item() == pytest.approx(
            (1 / n) * (1 - 1 / n)
        )
    assert softmax_slope(torch.tensor([50.0, 0.0, 0.0], dtype=torch.float64)).item() < 1e-20
    # stretching the same scores shrinks the slope
    s = torch.tensor([1.0, 0.5, 0.0, -0.5], dtype=torch.float64)
    slopes = [softmax_slope(s * f).item() for f in (1, 8, 11.3)]
    assert slopes[0] > slopes[1] > slopes[2]


# ------------------------------------------------------------------------ the figure


def test_weights_figure_draws_the_weights_and_writes_them_in():
    _, w = attention(*_article())
    fig = weights_figure(w, ARTICLE_TOKENS, "article weights")
    ax, cbar = fig.axes  # the grid and its colour bar
    np.testing.assert_allclose(ax.images[0].get_array(), w.numpy())
    assert [t.get_text() for t in ax.get_xticklabels()] == list(ARTICLE_TOKENS)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(ARTICLE_TOKENS)
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == 16
    assert texts[8:12] == ["0.028", "0.472", "0.028", "0.472"]  # the "bank" row, keys across
    assert ax.get_title() == "article weights"
    assert ax.images[0].get_clim() == (0, 1)
