"""Path patching to first order: an estimate for every (sender, receiver) pair from a few forwards
and backwards (labelled ``attribution``, like every first-order estimate in headscope).

Exact path patching (:mod:`headscope.circuits.path_patching`) changes sender ``s``'s output by
``dz_s = z_s(source) - z_s(base)``, lets it reach the receiver's input ``x_r`` through the residual
stream and the MLPs only (every other head frozen), then writes that input into base. To first
order the metric moves by

    g_r . J_rs dz_s,      g_r = d m / d x_r (base run),  J_rs = d x_r / d z_s with heads frozen,

and ``g_r^T J_rs`` for every sender at once is one backward of ``g_r . x_r`` through a base forward
whose every head output is a constant plus a zero ``delta`` (so no gradient enters any attention:
the heads are frozen) and whose MLPs are differentiated (or detached, with ``freeze_mlps``). For the
``logits`` receiver the objective is the metric itself. Cost per batch of pairs: one forward and
backward for the receivers' gradients, one per receiver (receivers batched as rows) for the frozen
paths, and the source's head outputs.

The estimate equals the exact effect's derivative in the dose ``t`` at ``t = 0``
(``tests/circuits/test_path_patching.py`` checks it against finite differences of the exact path
patching in float64).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.circuits.path_patching import STAGE, MultiEdit, ReceiverGroup
from headscope.circuits.receivers import Path
from headscope.effects.patch_attribution import grad_run, no_parameter_grads
from headscope.effects.patching import Batch, position_masks, read_rows
from headscope.effects.readout import read_metric
from headscope.effects.stages import Edit, attend, explicit_handler
from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall, StopForward

RECEIVERS_PER_PASS = 8  # receivers whose frozen-path backward shares one pass (rows)


def _detach_mlps(model):
    """Every MLP's output detached for one pass: the frozen MLPs of ``freeze_mlps``."""
    handles = []
    for layer in range(model.n_layers):
        mod = model.mlp(layer)
        handles.append(mod.register_forward_hook(lambda m, a, out: out.detach()))
    return handles


def path_attribution(
    model,
    batches: Sequence[Batch],
    n_pairs: int,
    metric: str,
    paths: Sequence[Path],
    direction: str = "noising",
    freeze_mlps: bool = False,
    sender_position: str = "all",
) -> dict[Path, Float[Tensor, " pair"]]:
    """Per pair, the first-order estimate of ``m_patched - m_base`` for each path (float64); a
    group's is the sum of its members' (first order is linear in the receivers' inputs)."""
    if direction not in ("noising", "denoising"):
        raise HeadscopeError(f"Unknown direction '{direction}'; use noising or denoising.")
    base_side, src_side = ("clean", "corrupt") if direction == "noising" else ("corrupt", "clean")
    paths = [(tuple(s), r) for s, r in paths]
    targets = list(dict.fromkeys(r for _, r in paths))
    singles = [r for r in targets if not isinstance(r, ReceiverGroup) and r.kind != "logits"]
    stages = sorted({STAGE[r.kind] for r in singles})
    out = {key: torch.zeros(n_pairs, dtype=torch.float64) for key in paths}
    for batch in batches:
        # both sides' head outputs, and the gradients of the metric at the single receivers
        base_acts: dict = {}
        grads: dict = {}
        if stages:
            base_acts, grads, _ = grad_run(model, batch, base_side, metric, (*stages, "z"))
        else:
            model.run(
                batch.tokens(base_side),
                batch.mask,
                handler=explicit_handler(base_acts, ("z",)),
                output=None,
            )
        src_acts: dict = {}
        model.run(
            batch.tokens(src_side),
            batch.mask,
            handler=explicit_handler(src_acts, ("z",)),
            output=None,
        )
        (_, s_where), *_ = position_masks(batch, sender_position)
        dz = {
            la: (src_acts[la]["z"].double() - base_acts[la]["z"].double())
            * s_where[:, :, None, None].to(src_acts[la]["z"].device)
            for la in range(model.n_layers)
        }  # [b, pos, head, d_head]: the sender's change, at its positions
        # units: (target, member, d m / d member input [b, pos, dim] or None for logits)
        units = []
        for target in targets:
            if isinstance(target, ReceiverGroup):
                g = _group_grads(model, batch, base_side, metric, target, base_acts)
                units += [(target, r, g[r]) for r in target.members]
            elif target.kind == "logits":
                units.append((target, target, None))
            else:
                (_, where), *_ = position_masks(batch, target.position)
                gr = grads[target.layer][STAGE[target.kind]][:, target.head]  # [b, pos, dim]
                units.append((target, target, gr * where[:, :, None].to(gr.device)))
        for start in range(0, len(units), RECEIVERS_PER_PASS):
            chunk = units[start : start + RECEIVERS_PER_PASS]
            sens = _frozen_path_grads(
                model, batch, base_side, metric, base_acts, chunk, freeze_mlps
            )  # {layer: [k, b, pos, head, d]}
            for j, (target, _, _) in enumerate(chunk):
                for s, t in paths:
                    if t != target:
                        continue
                    la, h = s
                    est = (sens[la][j][:, :, h].double() * dz[la][:, :, h]).sum((-1, -2))  # [b]
                    out[(s, target)][batch.index] += est.cpu()
    return out


def _group_grads(model, batch, base_side, metric, group: ReceiverGroup, base_acts) -> dict:
    """``d m / d x_r`` for each member ``r`` of ``group`` (masked to its positions) in base, with
    every member's input at its positions held at its base value, as step (3) holds it: a member
    below another reaches the metric only around the other's written input."""
    b, n = batch.mask.shape
    plain: dict = {}
    stages = tuple(sorted({STAGE[r.kind] for r in group.members}))
    model.run(
        batch.tokens(base_side), batch.mask, handler=explicit_handler(plain, stages), output=None
    )
    edits: dict[int, list[Edit]] = {}
    deltas: dict[int, dict[str, Tensor]] = {}
    wheres = {}
    for r in group.members:
        st = STAGE[r.kind]
        (_, where), *_ = position_masks(batch, r.position)
        wheres[r] = where
        x = plain[r.layer][st]  # [b, head, pos, dim]
        edits.setdefault(r.layer, []).append(
            Edit(r.layer, st, torch.full((b,), r.head), where, x[:, r.head].detach())
        )
        deltas.setdefault(r.layer, {})[st] = torch.zeros_like(x, requires_grad=True)
    multi = {la: MultiEdit(es) for la, es in edits.items()}

    def handler(call: AttentionCall) -> Tensor:
        return attend(call, multi.get(call.layer), None, deltas.get(call.layer))

    with no_parameter_grads(model):
        hidden = model.run(
            batch.tokens(base_side), batch.mask, handler=handler, output="hidden", grad=True
        )
        with torch.enable_grad():
            m, _ = read_metric(model, metric, hidden, batch.lengths, batch.answer, batch.wrong)
            flat = [(la, st) for la, d in deltas.items() for st in d]
            got = dict(
                zip(
                    flat,
                    torch.autograd.grad(m.sum(), [deltas[la][st] for la, st in flat]),
                    strict=True,
                )
            )
    return {
        r: got[(r.layer, STAGE[r.kind])][:, r.head] * wheres[r][:, :, None].to(m.device)
        for r in group.members
    }


def _frozen_path_grads(model, batch, base_side, metric, base_acts, units, freeze_mlps):
    """For each unit ``(target, member, g)`` (a block of rows), ``d (g . x_member) / d z_l`` (or
    ``d m / d z_l`` for logits) along paths through the residual stream and MLPs only: ``{layer:
    [k, b, pos, head, d_head]}``."""
    b, n = batch.mask.shape
    k = len(units)
    z0 = {la: base_acts[la]["z"].repeat(k, 1, 1, 1) for la in range(model.n_layers)}
    deltas = {la: torch.zeros_like(z0[la], requires_grad=True) for la in range(model.n_layers)}
    heads_r = {j: (r, g) for j, (_, r, g) in enumerate(units) if r.kind != "logits"}
    logits = len(heads_r) < k
    last = None if logits else max(r.layer for r, _ in heads_r.values())
    objective: list[Tensor] = []

    def handler(call: AttentionCall) -> Tensor:
        la = call.layer
        for j, (r, gr) in heads_r.items():
            if r.layer != la:
                continue
            g = call.group
            x = {
                "q": call.query,
                "k_head": call.key.repeat_interleave(g, 1) if g > 1 else call.key,
                "v_head": call.value.repeat_interleave(g, 1) if g > 1 else call.value,
            }[STAGE[r.kind]]  # [rows, head, pos, dim]
            objective.append((x[j * b : (j + 1) * b, r.head] * gr.to(x.dtype)).sum())
        if last is not None and la == last:
            raise StopForward
        return z0[la] + deltas[la]

    handles = _detach_mlps(model) if freeze_mlps else []
    try:
        with no_parameter_grads(model):
            hidden = model.run(
                batch.tokens(base_side).repeat(k, 1),
                batch.mask.repeat(k, 1),
                handler=handler,
                output="hidden" if logits else None,
                grad=True,
            )
            with torch.enable_grad():
                if logits:
                    m = read_rows(model, metric, hidden, batch, k, grad=True).view(k, b)
                    for j, (_, r, _) in enumerate(units):
                        if r.kind == "logits":
                            objective.append(m[j].sum())
                total = torch.stack(objective).sum()
                layers = list(range(model.n_layers))
                got = torch.autograd.grad(total, [deltas[la] for la in layers], allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    out = {}
    for la, g in zip(layers, got, strict=True):
        g = torch.zeros_like(z0[la]) if g is None else g
        out[la] = g.view(k, b, *g.shape[1:])
    return out


__all__ = ["path_attribution"]
