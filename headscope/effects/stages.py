"""One layer's attention computed explicitly, so that each head's q, k, v, pattern and output can be
read, replaced or differentiated (the seam of :mod:`headscope.models.attention`, one call at a
time).

For an :class:`~headscope.models.attention.AttentionCall` (q, k, v after any rotary embedding)::

    k_h, v_h = repeat(k, v)         # [batch, head, key, dim]: query head h reads KV head h // group
    scores   = (q @ k_h^T) * scale           # [batch, head, query, key], at least float32
    scores   = cap * tanh(scores / cap)      # only where the model soft-caps its attention logits
    pattern  = softmax(scores masked by call.full_mask())
    z        = pattern @ v_h        # [batch, query, head, dim_v]: what the output projection reads

Every run of the patching engines (cached, patched, differentiated) goes through this one function,
so a patch that writes a tensor's own values back gives bit-identical results: nothing but the
patch differs between a patched forward and the cached one. Its output agrees with the model's own
attention (sdpa) to float rounding (~1e-6; ``tests/effects/test_stages.py``).

Stages (what an :class:`Edit` can replace, what ``keep`` records, what ``deltas`` perturb):

=========== =============================== ==================================================
stage       tensor                          one head's slice, positions along
=========== =============================== ==================================================
``q``       ``[batch, head, query, dim]``   query head h, query positions
``k``       ``[batch, kv_head, key, dim]``  KV head g (``kv_mode="group"``: each query head of g)
``k_head``  ``[batch, head, key, dim]``     what query head h reads of its KV head (``head``)
``v``       as ``k``                        as ``k``
``v_head``  as ``k_head``                   as ``k_head``
``pattern`` ``[batch, head, query, key]``   query head h, query rows (post-softmax)
``z``       ``[batch, query, head, dim_v]`` query head h, query positions
=========== =============================== ==================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall

STAGES = ("q", "k", "v", "k_head", "v_head", "pattern", "z")
#: the axis of each stage's tensor that holds the head, and the one that holds positions
HEAD_AXIS = {"q": 1, "k": 1, "v": 1, "k_head": 1, "v_head": 1, "pattern": 1, "z": 2}
POS_AXIS = {"q": 2, "k": 2, "v": 2, "k_head": 2, "v_head": 2, "pattern": 2, "z": 1}


@dataclass
class Edit:
    """Write ``source`` into one head's slice of ``stage`` for each row of the batch.

    ``heads[r]``: the head of row ``r`` (a KV head for ``k``/``v``; -1: leave the row alone);
    ``where[r, p]``: the positions written (see the table above); ``source[r]``: the head slice to
    write, ``[pos, dim]`` (``pattern``: ``[query, key]``). ``t`` < 1 moves the slice only that
    fraction of the way (``x + t (source - x)``, for dose-response checks); ``t = 1`` writes
    ``source`` itself, bit for bit.
    """

    layer: int
    stage: str
    heads: Int[Tensor, " row"]
    where: Bool[Tensor, "row pos"]
    source: Float[Tensor, "row pos dim"]
    t: float = 1.0

    def apply(self, x: Tensor) -> Tensor:
        """``x`` (the stage's tensor for this call) with the edit written in (a new tensor)."""
        ax = HEAD_AXIS[self.stage]
        rows = torch.nonzero(self.heads >= 0).squeeze(-1).to(x.device)  # [m]
        h = self.heads.to(x.device)[rows]  # [m]
        cur = x[rows, :, h] if ax == 2 else x[rows, h]  # [m, pos, dim]
        src = self.source.to(device=x.device, dtype=x.dtype)[rows]  # [m, pos, dim]
        if self.t != 1.0:
            src = cur + self.t * (src - cur)
        new = torch.where(self.where.to(x.device)[rows][:, :, None], src, cur)  # [m, pos, dim]
        x = x.clone()
        if ax == 2:
            x[rows, :, h] = new
        else:
            x[rows, h] = new
        return x


def attend(
    call: AttentionCall,
    edit: Edit | None = None,
    keep: dict | None = None,
    deltas: dict | None = None,
) -> Float[Tensor, "batch query head dim_v"]:
    """The layer's attention output, computed as the module docstring says.

    ``edit``: one :class:`Edit` (applied when its layer is this call's); ``keep``: a dict that
    receives the stages named in it (``keep = {"z": None, ...}`` -> the detached tensors);
    ``deltas``: ``{stage: tensor}`` added to the stage (zeros with ``requires_grad``, so that
    ``d metric / d delta`` is the gradient at that stage; ``k``/``v`` deltas are in the per-head
    layout ``k_head``/``v_head``).
    """
    unknown = set(call.extras) - {"softcap"}
    if unknown:
        raise HeadscopeError(
            f"Layer {call.layer}'s attention uses {', '.join(sorted(unknown))}, which patching "
            "does not reproduce; patch a model without them."
        )
    edit = edit if edit is not None and edit.layer == call.layer else None
    deltas = deltas or {}

    def stage(name: str, x: Tensor) -> Tensor:
        if edit is not None and edit.stage == name:
            x = edit.apply(x)
        if name in deltas:
            x = x + deltas[name]
        if keep is not None and name in keep:
            keep[name] = x.detach()
        return x

    g = call.group
    q = stage("q", call.query)  # [batch, head, query, dim]
    k = stage("k", call.key)  # [batch, kv_head, key, dim]
    v = stage("v", call.value)
    k_h = stage("k_head", k.repeat_interleave(g, dim=1) if g > 1 else k)  # [batch, head, key, dim]
    v_h = stage("v_head", v.repeat_interleave(g, dim=1) if g > 1 else v)
    pattern = stage("pattern", softmax_pattern(call, q, k_h).to(v_h.dtype))
    z = torch.matmul(pattern, v_h).transpose(1, 2)  # [batch, query, head, dim_v]
    return stage("z", z)


def softmax_pattern(
    call: AttentionCall, q: Tensor, k_h: Tensor
) -> Float[Tensor, "batch head query key"]:
    """The pattern of queries ``q`` on keys ``k_h`` (per query head) under ``call``'s scale, soft
    cap and mask, in at least float32 (bf16 / fp16 scored in fp32, like sdpa)."""
    ct = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q.to(ct), k_h.to(ct).transpose(-1, -2)) * call.scale
    cap = call.extras.get("softcap")
    if cap is not None:
        scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~call.full_mask(), float("-inf"))
    return torch.softmax(scores, dim=-1)


def explicit_handler(
    keep_by_layer: dict | None = None,
    stages=(),
    edit: Edit | None = None,
    deltas_by_layer: dict | None = None,
):
    """A :meth:`~headscope.models.model.Model.run` handler: :func:`attend` at every layer; records
    ``stages`` of every layer into ``keep_by_layer[layer]`` and adds ``deltas_by_layer[layer]``."""

    def handler(call: AttentionCall) -> Tensor:
        keep = None
        if keep_by_layer is not None and stages:
            keep = keep_by_layer.setdefault(call.layer, dict.fromkeys(stages))
        deltas = None if deltas_by_layer is None else deltas_by_layer.get(call.layer)
        return attend(call, edit, keep, deltas)

    return handler


def head_slice(x: Tensor, stage: str, rows: Tensor, heads: Tensor) -> Tensor:
    """``x[rows[i]]``'s slice of head ``heads[i]`` for a stage tensor: ``[m, pos, dim]``."""
    return x[rows, :, heads] if HEAD_AXIS[stage] == 2 else x[rows, heads]
