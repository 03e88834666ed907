"""One protocol for reading a layer's attention rows, whichever engine produced them.

Every built-in metric reads a query row of a pattern in one of three ways: a single entry
(``A[q, 0]``, ``A[q, q-1]``, ...), the mass on a set of flagged keys, or the row's entropy. The
selectors in :mod:`headscope.metrics.base` ask a :class:`Rows` object for exactly those, so one
metric definition runs on

* :class:`DenseRows`: a pattern tensor ``[batch, head, query, key]``, or a block of its query rows
  (the hooks and blocked engines, a user's own pattern, the uniform head behind ``chance``);
* :class:`~headscope.metrics.stats.HeadStats`: per-row statistics from the fused kernel, where the
  pattern never exists in memory.

A new engine that can answer these three questions needs no change to any metric.
:func:`as_rows` is the one place a plain tensor becomes rows.

>>> A = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0, 1, 0]])[None, None]   # [1, 1, 3, 3]
>>> as_rows(A).at(torch.tensor([-1, 0, 1]), PatternBatch(lengths=torch.tensor([3]), causal=True))
tensor([[[0.0000, 0.5000, 1.0000]]])
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.metrics.context import PatternBatch


@runtime_checkable
class Rows(Protocol):
    """A layer's attention rows ``[batch, head, query, key]`` as the metrics read them."""

    shape: tuple[int, int, int, int]  # (batch, head, query rows, keys)

    @property
    def device(self) -> torch.device: ...

    def at(
        self, keys: Int[Tensor, " query"], batch: PatternBatch
    ) -> Float[Tensor, "batch head query"]:
        """``A[q, keys[q]]`` for every row (absolute key positions); 0 outside the key axis."""
        ...

    def row_entropy(self, batch: PatternBatch) -> Float[Tensor, "batch head query"]:
        """``-sum_k A[q, k] ln A[q, k]`` over real keys (0 ln 0 = 0)."""
        ...

    def mass(
        self, batch: PatternBatch, name: str, keys: Bool[Tensor, "batch key"]
    ) -> Float[Tensor, "batch head query"]:
        """Attention mass on the keys ``keys`` (the flag set ``name``) that each query can see."""
        ...

    def band_mass(
        self, batch: PatternBatch, sinks: int, window: int
    ) -> Float[Tensor, "batch head query"]:
        """Attention mass on keys ``k < sinks`` and ``q - window < k <= q`` (a sink + window KV
        cache)."""
        ...

    def arg_max(self, batch: PatternBatch) -> Int[Tensor, "batch head query"]:
        """Each row's arg-max key: the first key holding the row's largest weight."""
        ...


class DenseRows:
    """Rows held as a pattern tensor (possibly a block of query rows starting at
    ``batch.q_start``)."""

    def __init__(self, pattern: Float[Tensor, "batch head query key"], log: Tensor | None = None):
        self.pattern = pattern
        # ln(pattern), when the engine has it (finite where masked): entropy skips a log
        self.log = log
        self.shape = tuple(pattern.shape)

    @property
    def device(self) -> torch.device:
        return self.pattern.device

    def at(self, keys: Tensor, batch: PatternBatch) -> Tensor:
        """``keys``: ``[query]``, or ``[batch, query]`` for a key per sequence."""
        b, h, nq, nk = self.shape
        keys = keys.to(self.pattern.device).expand(b, nq)  # [batch, query]
        inside = (keys >= 0) & (keys < nk)
        idx = keys.clamp(0, nk - 1)[:, None, :, None].expand(b, h, nq, 1)
        return self.pattern.gather(-1, idx).squeeze(-1) * inside[:, None, :]  # [batch, head, query]

    def band_mass(self, batch: PatternBatch, sinks: int, window: int) -> Tensor:
        nk = self.shape[-1]
        k = torch.arange(nk, device=self.pattern.device)
        q = torch.arange(batch.q_start, batch.q_start + self.shape[-2], device=self.pattern.device)
        # [query, key]
        band = (k[None, :] < sinks) | (
            (q[:, None] - k[None, :] < window) & (k[None, :] <= q[:, None])
        )
        real = k[None, :] < batch.lengths.to(self.pattern.device)[:, None]  # [batch, key]
        keep = (band[None] & real[:, None, :]).to(self.pattern.dtype)  # [batch, query, key]
        return (self.pattern * keep[:, None]).sum(-1)

    def arg_max(self, batch: PatternBatch) -> Tensor:
        return self.pattern.argmax(-1)  # the first maximum, as torch defines it

    def row_entropy(self, batch: PatternBatch) -> Tensor:
        pattern, nk = self.pattern, self.shape[-1]
        if bool((batch.lengths < nk).any()):  # padding keys in range: they never count
            k = torch.arange(nk, device=pattern.device)
            # [batch, 1, 1, key]
            real = (k[None, :] < batch.lengths.to(pattern.device)[:, None])[:, None, None, :]
            pattern = pattern * real
        if self.log is not None:  # -(A * ln A): no log per element
            return -(pattern * self.log).sum(-1)
        return torch.special.entr(pattern).sum(-1)

    def mass(self, batch: PatternBatch, name: str, keys: Tensor) -> Tensor:
        pattern, nk = self.pattern, self.shape[-1]
        f = keys.to(pattern.dtype)  # [batch, key]
        if not batch.causal:
            # [batch, head, query]: every key visible
            return (pattern @ f[:, None, :, None]).squeeze(-1)
        # Keys before the block's first query are visible to every row: one matrix-vector product.
        # Only the keys from q_start on need the k <= q test (a small triangle in a query block).
        k = torch.arange(nk, device=pattern.device)
        q = torch.arange(batch.q_start, batch.q_start + self.shape[-2], device=pattern.device)
        ks = min(batch.q_start, nk)
        mass = (pattern[..., :ks] @ f[:, None, :ks, None]).squeeze(-1)  # [batch, head, query]
        if ks < nk:
            tail = f[:, None, ks:] * (k[None, ks:] <= q[:, None])[None]  # [batch, query, key - ks]
            mass = mass + (pattern[..., ks:] * tail[:, None]).sum(-1)
        return mass


def as_rows(pattern: Tensor | Rows) -> Rows:
    """``pattern`` as :class:`Rows`: a plain tensor becomes :class:`DenseRows`, rows stay as they
    are."""
    return DenseRows(pattern) if isinstance(pattern, Tensor) else pattern
