"""Attention written out by hand, small enough to check every number of the seed article.

Every head headscope scores computes ``softmax(Q K^T / sqrt(d_k)) V``, with a causal mask in a
decoder. Before trusting scores read out of a real model, it helps to have that formula as a few
lines of torch that can be run on the article's four-token example ("The river bank flooded") and
compared digit for digit with what the article prints. This module is those lines:

* :func:`article_example` (the article's vectors and weights) and :func:`attention` itself, with
  :func:`causal_mask` and, for grouped-query models, :func:`repeat_kv`;
* two properties the notebook demonstrates: without positions, shuffling the tokens only shuffles
  the result (:func:`permutation_gap`), and a peaked softmax has almost no slope left to learn
  from (:func:`softmax_slope`);
* :func:`weights_figure`, a weights grid with its numbers written in.

:mod:`lib.model_checks` runs the same :func:`attention` against a real model's own
pattern. Figures are ``matplotlib.figure.Figure`` objects, never pyplot state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Float
from matplotlib.figure import Figure
from torch import Tensor

from headscope.errors import HeadscopeError

# ---------------------------------------------------------------------------- the article's example

ARTICLE_TOKENS = ("The", "river", "bank", "flooded")
ARTICLE_FEATURES = ("water", "place noun", "grammar word")


def article_example(dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    """The article's token vectors ``X`` and weights ``WQ``, ``WK``, ``WV`` (its numpy code).

    ``X`` is ``[token, feature]`` with features (water, place noun, grammar word); each weight
    matrix maps those 3 features to 2 numbers, so ``d_k = 2``.

    >>> ex = article_example()
    >>> (ex["X"] @ ex["WQ"])[2].tolist()                # the query of "bank"
    [2.0, 0.0]
    """

    def t(rows):
        return torch.tensor(rows, dtype=dtype)

    return {
        # [token=4, feature=3]: The, river, bank, flooded
        "X": t([[0, 0, 1], [1, 0, 0], [0, 1, 0], [1, 0, 1]]),
        "WQ": t([[1, 0], [2, 0], [0, 1]]),  # [feature=3, d_k=2]
        "WK": t([[2, 0], [0, 1], [0, 1]]),  # [feature=3, d_k=2]
        "WV": t([[1, 0], [0, 1], [0, 0]]),  # [feature=3, d_v=2]
    }


# ---------------------------------------------------------------------------- attention itself


def causal_mask(n_query: int, n_key: int, device=None) -> Tensor:
    """``True`` where a query may NOT look: keys after it. ``[query, key]``.

    Queries are the last ``n_query`` of the ``n_key`` positions (a KV-cache step has
    ``n_query = 1``), so query ``i`` sits at position ``i + n_key - n_query``.

    >>> causal_mask(3, 3).int().tolist()
    [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    >>> causal_mask(1, 3).int().tolist()                # one new token sees everything
    [[0, 0, 0]]
    """
    if n_query > n_key:
        raise HeadscopeError(
            f"A causal mask needs at least as many keys as queries; got {n_query} queries, {n_key} "
            "keys."
        )
    # [query, key]
    return torch.ones(n_query, n_key, dtype=torch.bool, device=device).triu(n_key - n_query + 1)


def attention(
    Q: Float[Tensor, "... query d_k"],
    K: Float[Tensor, "... key d_k"],
    V: Float[Tensor, "... key d_v"],
    causal: bool = False,
    scale: float | None = None,
) -> tuple[Float[Tensor, "... query d_v"], Float[Tensor, "... query key"]]:
    """Scaled dot-product attention: ``softmax(Q K^T * scale [+ mask]) V``; returns (output,
    weights).

    ``scale`` defaults to ``1 / sqrt(d_k)`` (pass ``1.0`` for unscaled scores). With ``causal=True``
    every score of a later key is set to ``-inf`` before the softmax, so its weight is exactly 0.
    Leading dimensions (batch, head) broadcast.

    >>> ex = article_example()
    >>> Q, K, V = (ex["X"] @ ex[w] for w in ("WQ", "WK", "WV"))
    >>> out, w = attention(Q, K, V)
    >>> w[2].round(decimals=3).tolist(), out[2].round(decimals=3).tolist()   # "bank"
    ([0.028, 0.472, 0.028, 0.472], [0.944, 0.028])
    >>> out, w = attention(Q, K, V, causal=True)
    >>> out[2].round(decimals=3).tolist()
    [0.894, 0.053]
    """
    d_k = Q.shape[-1]
    scale = d_k**-0.5 if scale is None else scale
    scores = Q @ K.transpose(-2, -1) * scale  # [..., query, key]
    if causal:
        # [query, key]
        future = causal_mask(scores.shape[-2], scores.shape[-1], device=scores.device)
        scores = scores.masked_fill(future, float("-inf"))  # [..., query, key]
    weights = scores.softmax(dim=-1)  # [..., query, key], each row sums to 1
    return weights @ V, weights  # [..., query, d_v], [..., query, key]


def repeat_kv(
    x: Float[Tensor, "... kv_head pos d"], n_heads: int
) -> Float[Tensor, "... head pos d"]:
    """Grouped-query attention: give each of ``n_heads`` query heads its KV head.

    Query head ``h`` uses KV head ``h // (n_heads // n_kv_heads)`` (consecutive query heads share).

    >>> kv = torch.arange(3.0).view(3, 1, 1)           # 3 KV heads, 1 position, d = 1
    >>> repeat_kv(kv, 9).flatten().tolist()
    [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    """
    n_kv = x.shape[-3]
    if n_heads % n_kv:
        raise HeadscopeError(f"{n_heads} query heads cannot share {n_kv} KV heads evenly.")
    return x.repeat_interleave(n_heads // n_kv, dim=-3)  # [..., head, pos, d]


# ---------------------------------------------------------------------------- two properties


def permutation_gap(
    out: Tensor, weights: Tensor, out_perm: Tensor, weights_perm: Tensor, perm: Sequence[int]
) -> tuple[float, float]:
    """How far attention on shuffled tokens is from the original, shuffled the same way.

    ``perm[i]`` is the original position of the token now at position ``i``. Returns
    ``(max |out_perm - out[perm]|, max |weights_perm - weights[perm][:, perm]|)``; both are 0 when
    attention is permutation-equivariant. ``out`` is ``[..., pos, d]``, weights ``[..., query,
    key]``.

    >>> ex = article_example()
    >>> perm = [2, 0, 3, 1]
    >>> a = attention(*(ex["X"] @ ex[w] for w in ("WQ", "WK", "WV")))
    >>> b = attention(*(ex["X"][perm] @ ex[w] for w in ("WQ", "WK", "WV")))
    >>> [round(gap, 12) for gap in permutation_gap(*a, *b, perm)]
    [0.0, 0.0]
    """
    idx = torch.as_tensor(list(perm), device=out.device)  # [pos]
    d_out = (out_perm - out[..., idx, :]).abs().max().item()  # rows of out in the shuffled order
    # rows and columns shuffled
    d_w = (weights_perm - weights[..., idx, :][..., idx]).abs().max().item()
    return d_out, d_w


def softmax_slope(scores: Float[Tensor, "... key"]) -> Float[Tensor, ...]:
    """The largest entry of the softmax Jacobian ``dp_i/ds_j = p_i (delta_ij - p_j)``, in size.

    It is what a gradient through the softmax can be at most per unit of score; a near one-hot
    softmax has almost none. For a uniform row of ``n`` it is ``(1/n)(1 - 1/n)``.

    >>> softmax_slope(torch.zeros(4)).item()
    0.1875
    """
    p = scores.softmax(dim=-1)  # [..., key]
    jac = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # [..., key, key]
    return jac.abs().amax(dim=(-2, -1))  # [...]


# ---------------------------------------------------------------------------- figure


def weights_figure(weights: Tensor, tokens: Sequence[str], title: str) -> Figure:
    """A ``[query, key]`` weights grid with its values written in, queries down, keys across."""
    w = weights.detach().cpu().double().numpy()  # [query, key]
    fig = Figure(figsize=(0.9 * len(tokens) + 1.6, 0.8 * len(tokens) + 1.0), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(w, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(tokens)), tokens, rotation=45, ha="right")
    ax.set_yticks(range(len(tokens)), tokens)
    ax.set_xlabel("key (being asked)")
    ax.set_ylabel("query (asking)")
    for (i, j), v in np.ndenumerate(w):
        ax.text(
            j,
            i,
            f"{v:.3f}",
            ha="center",
            va="center",
            fontsize=8,
            color="black" if v > 0.6 else "white",
        )
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8, label="attention weight (row sums to 1)")
    return fig
