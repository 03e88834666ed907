"""Hand-built attention patterns and batch contexts shared by the metric tests."""

from __future__ import annotations

import torch

from headscope.metrics import PatternBatch


def causal_uniform(n: int) -> torch.Tensor:
    """[1, 1, n, n]: row q spreads 1/(q+1) over keys 0..q."""
    A = torch.tril(torch.ones(n, n))
    return (A / A.sum(-1, keepdim=True))[None, None]


def batch(n: int, causal: bool = True, **kw) -> PatternBatch:
    """One sequence of ``n`` real tokens."""
    return PatternBatch(lengths=torch.tensor([n]), causal=causal, **kw)


def shifted(n: int, offset: int, fallback: int = 0) -> torch.Tensor:
    """Row q puts all its weight on key q+offset (or on `fallback` where that key does not
    exist)."""
    A = torch.zeros(1, 1, n, n)
    for q in range(n):
        k = q + offset
        A[0, 0, q, k if 0 <= k < n else fallback] = 1.0
    return A


def random_causal(b: int, h: int, n: int, seed: int = 0) -> torch.Tensor:
    """A random causal softmax pattern [b, h, n, n]."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, h, n, n, generator=g)
    return logits.masked_fill(
        torch.triu(torch.ones(n, n, dtype=torch.bool), 1), -torch.inf
    ).softmax(-1)


def repeat_pattern(L: int, offset: int, n: int | None = None) -> torch.Tensor:
    """Sink everywhere, except queries L+1..2L put all weight on key q + offset."""
    n = 2 * L + 1 if n is None else n
    A = torch.zeros(1, 1, n, n)
    A[..., 0] = 1.0
    for q in range(L + 1, 2 * L + 1):
        A[0, 0, q] = 0
        A[0, 0, q, q + offset] = 1.0
    return A
