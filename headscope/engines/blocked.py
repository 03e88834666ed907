"""The blocked engine: exact attention patterns in query blocks, at the cost of an sdpa forward.

A scan needs every head's pattern, but never all of it at once: metrics reduce each query row to a
few numbers. So instead of eager attention (an ``n x n`` matrix per head, per layer, kept alive
through the layer), the model runs its own fused ``sdpa`` for the outputs, and this engine
recomputes ``softmax(q k^T * scale + mask)`` a block of query rows at a time and hands each block
to the metrics. Peak extra memory is one block, ``batch x head x block x n`` floats; for causal
models a block only computes keys up to its last query, which halves the work. It runs wherever
the model's attention goes through transformers' attention interface, on any device.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.engines.base import Engine, OnRows
from headscope.engines.registry import model_attention_engines
from headscope.errors import HeadscopeError
from headscope.metrics.rows import DenseRows
from headscope.models.attention import AttentionCall, StopForward

NEG = torch.finfo(torch.float32).min  # a masked score (eager attention uses the same)
BLOCK_BYTES = 32 * 2**20  # one block of scores, fp32: small enough to stay in cache-friendly sizes


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
    ``exp(log_softmax(s))`` (same cost as ``softmax``) and ``log_block`` lets the entropy metric
    skip a logarithm per element. Masked scores are set to the most negative finite float, as eager
    attention does, so ``log_block`` is finite and ``block * log_block`` is 0 where masked.

    ``attention_mask``: None, boolean (True = may attend) or additive float, broadcastable to
    ``[batch, head, q, k]``. Grouped-query attention is handled without copying keys: query head
    ``h`` uses key head ``h // (heads / kv_heads)``.
    """
    b, h, n_q, d = query.shape
    kvh, n_k = key.shape[1], key.shape[2]
    g = h // kvh
    offset = n_k - n_q  # keys before the first query (0 without a KV cache)
    # [b, kv_head, group, q, dim], pre-scaled
    q32 = (query.float() * scaling).view(b, kvh, g, n_q, d)
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
                # [b or 1, 1, qb, 1]: rows with no visible key
                empty_rows = ~m.any(-1, keepdim=True)
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


def refuse_unmodelled(call: AttentionCall, engine: str) -> None:
    """One line instead of a silently wrong score when the softmax has more than ``q k^T +
    mask``."""
    if call.extras:
        raise HeadscopeError(
            f"This model's attention uses {', '.join(call.extras)}, which the {engine} engine "
            f"does not model; use --engine {' or '.join(model_attention_engines())}."
        )


class BlockHandler:
    """The attention handler of one blocked forward: score the wanted layers, stop after the
    last."""

    engine = "blocked"

    def __init__(
        self,
        on_rows: OnRows,
        layers: Sequence[int],
        block_bytes: int | None = None,
        device: torch.device | None = None,
    ):
        self.on_rows = on_rows
        # where the metrics accumulate; a layer placed elsewhere (device_map) is moved here
        self.device = device
        self.layers = frozenset(layers)
        self.last = max(layers)
        self.block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes

    def score(self, call: AttentionCall) -> None:
        """Hand ``call``'s pattern to the metrics, a block of query rows at a time."""
        refuse_unmodelled(call, self.engine)
        b, h, _, n_k = call.shape
        rows = block_rows(b, h, n_k, self.block_bytes)
        query, key, mask = call.query, call.key, call.mask
        # a layer on another device of a device map
        if self.device is not None and query.device != self.device:
            query, key = query.to(self.device), key.to(self.device)
            mask = None if mask is None else mask.to(self.device)
        for qs, block, log_block in pattern_blocks(
            query, key, mask, call.scale, call.causal, rows, with_log=True
        ):
            self.on_rows(call.layer, DenseRows(block, log_block), qs)

    def __call__(self, call: AttentionCall) -> Tensor:
        if call.layer in self.layers:
            self.score(call)
            if call.layer == self.last:
                raise StopForward  # nothing after the last wanted layer is needed
        return call.output()  # the model's own sdpa: [batch, query, head, dim]


class BlockedEngine(Engine):
    name = "blocked"
    summary = (
        "the model's sdpa for outputs, exact softmax pattern blocks a few query rows at a time"
    )

    def unavailable(self, model, metrics):
        if not model.attention_interface:
            return "its attention does not run through transformers' attention interface"
        return None

    def run(
        self, model, tokens, mask, batch, on_rows, layers=None, interventions=(), token_types=None
    ) -> None:
        layers = range(model.n_layers) if layers is None else layers
        model.run(
            tokens,
            mask,
            handler=BlockHandler(on_rows, layers, device=model.device),
            interventions=interventions,
            token_types=token_types,
        )


ENGINE = BlockedEngine()
