"""Attention is not only a weight (Kobayashi et al. 2020): how much of a head's output comes from
position 0.

A head's output at query ``q`` is ``sum_k A[q, k] f(x_k)``, with ``f(x_k) = v_k W_O^h`` the vector
key ``k`` sends through the head. A key with a large weight but a tiny ``f`` contributes little, so
the weight on position 0 (the ``sink`` score) can overstate what the sink contributes. The
value-weighted share of position 0 is::

    A[q, 0] ||f(x_0)|| / sum_k A[q, k] ||f(x_k)||

pooled over queries ``1 <= q <= n-1`` of the text probe, exactly like ``sink`` (the same share by
weight alone). The norms come from the call's own values at the attention seam (bias included)
and each head's slice of the output projection; ``||v W||^2 = v (W W^T) v^T`` costs a
``d_head x d_head`` product per key. There is no single chance value: a uniform head's share
depends on its value norms, so ``chance`` is NaN.

>>> A = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])        # [batch, head, query, key]
>>> norms = torch.tensor([[[1.0, 3.0]]])                   # [batch, head, key]: key 1 sends 3x more
>>> value_weighted_share(A, norms)[0, 0].tolist()   # query 1: 0.5*1 / (0.5*1 + 0.5*3)
[1.0, 0.25]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from headscope.catalog import CIRCUIT
from headscope.effects.loop import batches, segment_ids
from headscope.engines.blocked import block_rows, pattern_blocks
from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall
from headscope.result import Probe, ScoreInfo

VALUE_SINK = CIRCUIT["value_sink"]


@dataclass
class ValueSinkScores:
    """The ``value_sink`` rows of a scan."""

    metric: ScoreInfo
    score: Float[Tensor, "layer head"]
    count: float
    chance: float = float("nan")
    estimator: np.ndarray | None = None
    seq_total: Float[Tensor, "sequence layer head"] | None = None
    seq_count: Float[Tensor, " sequence"] | None = None


def value_norms(
    value: Float[Tensor, "batch kv_head key dim"], W_O: Float[Tensor, "head dim d_model"]
) -> Float[Tensor, "batch head key"]:
    """``||v_k W_O^h||`` for every query head ``h`` (query head ``h`` reads KV head ``h // g``)."""
    h, kvh = W_O.shape[0], value.shape[1]
    gram = W_O.double() @ W_O.double().transpose(-1, -2)  # [head, dim, dim]: W W^T
    v = value.double().repeat_interleave(h // kvh, dim=1)  # [batch, head, key, dim]
    sq = torch.einsum("bhkd,hde,bhke->bhk", v, gram, v)  # [batch, head, key]
    return sq.clamp(min=0).sqrt()


def value_weighted_share(
    block: Float[Tensor, "batch head query key"], norms: Float[Tensor, "batch head key"]
) -> Float[Tensor, "batch head query"]:
    """Position 0's share of each row's norm-weighted attention (0 where a row weighs nothing)."""
    w = block.double() * norms[:, :, None, : block.shape[-1]]  # [batch, head, query, key]
    den = w.sum(-1)  # [batch, head, query]
    return torch.where(den > 0, w[..., 0] / den.clamp(min=torch.finfo(torch.float64).tiny), 0.0)


def value_sink_scores(model, probe: Probe, batch_size: int = 8) -> ValueSinkScores:
    """The value-weighted sink share of every head on the text ``probe`` (see the module
    docstring)."""
    W_O = model.output_weights()  # [layer, head, dim, d_model]
    seq_total = torch.zeros(len(probe), model.n_layers, model.n_heads, dtype=torch.float64)
    seq_count = torch.zeros(len(probe), dtype=torch.float64)
    for tokens, mask, lengths, index in batches(model, probe, batch_size, with_index=True):
        n = tokens.shape[1]

        def share(call: AttentionCall, lengths=lengths, n=n, index=index) -> Tensor:
            if call.extras:
                raise HeadscopeError(
                    f"This model's attention uses {', '.join(call.extras)}; "
                    "value_sink recomputes softmax(q k^T) and does not model it."
                )
            # [batch, head, key]
            norms = value_norms(call.value, W_O[call.layer].to(call.value.device))
            b, h, _, n_k = call.shape
            for qs, block in pattern_blocks(
                call.query, call.key, call.mask, call.scale, call.causal, block_rows(b, h, n_k)
            ):
                q = torch.arange(qs, qs + block.shape[-2], device=block.device)  # [query]
                # [b, query]
                keep = (
                    (q[None, :] >= 1) & (q[None, :] < lengths.to(block.device)[:, None])
                ).double()
                s = value_weighted_share(block, norms)  # [batch, head, query]
                seq_total[index, call.layer] += (s * keep[:, None, :]).sum(2).cpu()  # [batch, head]
            return call.output()

        model.run(tokens, mask, handler=share, token_types=segment_ids(probe, index))
        seq_count[index] = (lengths - 1).clamp(min=0).double()
    total, count = seq_total.sum(0), float(seq_count.sum())
    return ValueSinkScores(
        VALUE_SINK,
        total / count if count else torch.full_like(total, torch.nan),
        count,
        seq_total=seq_total,
        seq_count=seq_count,
    )


def scan_score(model, probes: dict, batch_size: int, progress=None) -> ValueSinkScores | None:
    """A scan's ``value_sink`` (catalog ``impl``): on the text probe (None without one)."""
    probe = probes.get("text")
    return None if probe is None else value_sink_scores(model, probe, batch_size)
