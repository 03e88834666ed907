"""Exact attention patterns in query blocks, at the cost of a fused-attention forward.

A scan needs every head's pattern, but never all of it at once: metrics reduce each query row to a
few numbers. So instead of eager attention (an ``n x n`` matrix per head, per layer, kept alive
through the layer), the model runs its fused ``sdpa`` kernel for the outputs, and this module
recomputes ``softmax(q k^T * scale + mask)`` a block of query rows at a time and hands each block
to a callback. Peak extra memory is one block, ``batch x head x block x n`` floats; for causal
models a block only computes keys up to its last query, which halves the work.

The function :func:`attention` has the signature of a transformers attention implementation; it is
registered under the name ``"headscope"`` by :mod:`headscope.models` (the one module that knows
transformers). While no :class:`BlockScorer` is active it is plain ``sdpa``. When the scorer asks
for the fused engine and the call allows it (CPU, boolean or no mask), no pattern is computed at
all: :mod:`headscope.kernels` returns the layer's output together with per-row statistics from one
pass over the scores, and sdpa is not run for that layer.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

#: The scorer of the forward pass in progress (None outside :func:`scoring`).
_ACTIVE: contextvars.ContextVar[BlockScorer | None] = contextvars.ContextVar("headscope_scorer", default=None)

NEG = torch.finfo(torch.float32).min  # a masked score (eager attention uses the same)
BLOCK_BYTES = 32 * 2**20  # one block of scores, fp32: small enough to stay in cache-friendly sizes


class StopForward(Exception):
    """Raised after the last wanted layer: the rest of the forward is not needed."""


@dataclass
class BlockScorer:
    """What one forward pass should do with its patterns."""

    on_block: Callable[..., None]  # (layer, pattern block [b, h, qb, kb] or HeadStats, q_start, log of the block)
    layers: frozenset[int]
    last: int
    block_bytes: int = BLOCK_BYTES
    #: Fused engine: the flag sets whose mass is wanted (name -> [batch, key]); None = pattern blocks.
    fused_flags: dict[str, Tensor] | None = None


@contextlib.contextmanager
def scoring(scorer: BlockScorer) -> Iterator[None]:
    """Activate ``scorer`` for the forward passes run inside the ``with`` block."""
    token = _ACTIVE.set(scorer)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def block_rows(batch: int, heads: int, keys: int, block_bytes: int = BLOCK_BYTES) -> int:
    """Query rows per block so that one fp32 block of scores stays under ``block_bytes``."""
    return max(16, block_bytes // max(1, batch * heads * keys * 4))


def pattern_blocks(
    query: Float[Tensor, "batch head q dim"],
    key: Float[Tensor, "batch kv_head k dim"],
    attention_mask: Tensor | None,
    scaling: float,
    causal: bool,
    rows: int,
    with_log: bool = False,
) -> Iterator[tuple]:
    """Yield ``(q_start, softmax pattern block)``; causal blocks stop at key ``q_start + block``.

    With ``with_log``, yield ``(q_start, block, log_block)``: the block is computed as
    ``exp(log_softmax(s))`` (same cost as ``softmax``) and ``log_block`` lets the entropy metric skip
    a logarithm per element. Masked scores are set to the most negative finite float, as eager
    attention does, so ``log_block`` is finite and ``block * log_block`` is 0 where masked.

    ``attention_mask``: None, boolean (True = may attend) or additive float, broadcastable to
    ``[batch, head, q, k]``. Grouped-query attention is handled without copying keys: query head
    ``h`` uses key head ``h // (heads / kv_heads)``.
    """
    b, h, n_q, d = query.shape
    kvh, n_k = key.shape[1], key.shape[2]
    g = h // kvh
    offset = n_k - n_q  # keys before the first query (0 without a KV cache)
    q32 = (query.float() * scaling).view(b, kvh, g, n_q, d)  # [b, kv_head, group, q, dim], pre-scaled
    kT = key.float().transpose(-1, -2).unsqueeze(2)  # [b, kv_head, 1, dim, k]
    for qs in range(0, n_q, rows):
        qe = min(n_q, qs + rows)
        kmax = min(n_k, qe + offset) if causal else n_k  # keys this block can see at most
        s = (q32[:, :, :, qs:qe] @ kT[..., :kmax]).view(b, h, qe - qs, kmax)  # [b, h, qb, kmax]
        empty_rows = None
        if attention_mask is not None:
            m = attention_mask[..., qs:qe, :kmax]
            if m.dtype == torch.bool:
                s.masked_fill_(~m, NEG)
                empty_rows = ~m.any(-1, keepdim=True)  # [b or 1, 1, qb, 1]: rows with no visible key
            else:
                s += m.float()
        elif causal:
            # Only the square of keys qs..qe-1 (plus offset) can lie in the future of a row.
            lo = qs + offset
            tri = torch.ones(qe - qs, kmax - lo, dtype=torch.bool, device=s.device).triu_(1)
            s[..., lo:].masked_fill_(tri, NEG)
        if with_log:
            logp = torch.log_softmax(s, dim=-1)
            p = logp.exp()
        else:
            p = torch.softmax(s, dim=-1)
        if empty_rows is not None and bool(empty_rows.any()):
            p = p.masked_fill(empty_rows, 0.0)  # a fully masked row attends nowhere: 0, not uniform
        yield (qs, p, logp) if with_log else (qs, p)


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, **kwargs):
    """A transformers attention implementation: ``sdpa`` outputs, plus blocked patterns when scoring
    (or, for the fused engine, the kernel's output and per-row statistics instead of both)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    scorer = _ACTIVE.get()
    layer = getattr(module, "layer_idx", None)
    if scorer is not None and layer in scorer.layers:
        causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", False))
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        from headscope import kernels

        unmodelled = [k for k in ("position_bias", "softcap", "s_aux", "sinks") if kwargs.get(k) is not None]
        if unmodelled:
            from headscope.errors import HeadscopeError

            raise HeadscopeError(f"This model's attention uses {', '.join(unmodelled)}, which the fused and "
                                 "blocked engines do not model; use --engine hooks.")
        if scorer.fused_flags is not None and kernels.supports(query, attention_mask):
            if layer == scorer.last:  # nothing runs after it: no output needed
                scorer.on_block(layer, kernels.head_stats(query, key, attention_mask, scale, causal,
                                                          scorer.fused_flags), 0, None)
                raise StopForward
            # the kernel's own output replaces sdpa's: one pass over the scores, not two
            out, stats = kernels.attention(query, key, value, attention_mask, scale, causal, scorer.fused_flags)
            scorer.on_block(layer, stats, 0, None)
            return out.transpose(1, 2).contiguous(), None
        rows = block_rows(query.shape[0], query.shape[1], key.shape[2], scorer.block_bytes)
        for qs, block, log_block in pattern_blocks(query, key, attention_mask, scale, causal, rows, with_log=True):
            scorer.on_block(layer, block, qs, log_block)
        if layer == scorer.last:
            raise StopForward
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **kwargs)
