"""Attribution patching: every head's effect, estimated to first order from one forward and one
backward.

Ablating head ``h`` of layer ``l`` moves its output ``z`` (``[batch, query, dim]``) to the ablation
value ``m`` at every position. To first order the target changes by

    sum over real positions (b, q) of  (m - z[b, q]) . d target / d z[b, q]

(Syed et al. 2023, "Attribution patching"). The gradient is taken through everything after the
head, later attention layers included: each layer's output gets a zero tensor ``delta`` added at
the seam, and ``d target / d delta`` is read with ``torch.autograd.grad`` (no parameter gradients
are kept). One forward and one backward give every head of every layer; the target is the pooled
loss of the whole probe, so batches add up.

It is an estimate, always labelled so: exact ablation (:mod:`headscope.effects.ablation`) is the
truth. For the sentence-embedding target it is zero by construction (``1 - cos`` is flat at the
clean embedding), so encoders get exact effects only.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.effects.loop import batches, segment_ids
from headscope.effects.targets import Target, logits_from, target_positions, token_losses
from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall
from headscope.result import Probe


def attribution_effects(
    model,
    probe: Probe,
    target: Target,
    values: Float[Tensor, "layer head dim"] | float | None,
    batch_size: int,
) -> tuple[
    Float[Tensor, "sequence layer head"],
    Float[Tensor, " sequence"],
    Float[Tensor, "layer head dim"],
]:
    """First-order estimate of every head's effect on ``target``, per sequence of ``probe`` (its
    part of the pooled effect, times the probe's target count: ``est.sum(0) / counts.sum()`` is the
    pooled estimate, in the exact effect's units), the target count of each sequence, and every
    head's mean output.

    ``values``: the ablation value of every head, 0.0 for zero ablation, or None for mean ablation
    with the means taken from this same pass: ``sum (m - z) . g = m . sum g - sum z . g``, so the
    forward that gives the gradients also gives the means, and no separate pass is needed.
    """
    if target.output != "logits":
        raise HeadscopeError(
            f"Attribution estimates of '{target.name}' are zero to first order (1 "
            "- cos is flat at the clean embedding); use exact ablation (--effects exact)."
        )
    total_count = 0.0
    for tokens, _, lengths in batches(model, probe, batch_size):
        total_count += float(
            target_positions(lengths, tokens.shape[1], target.probe, probe.repeat_len).sum()
        )
    n = len(probe)
    shape = (model.n_layers, model.n_heads, model.d_head)
    # per sequence: sum over real positions of d/dz
    grad_sum = torch.zeros(n, *shape, dtype=torch.float64)
    # per sequence: sum over real positions of z . d/dz
    zg = torch.zeros(n, *shape[:2], dtype=torch.float64)
    z_sum = torch.zeros(shape, dtype=torch.float64)  # for the means
    counts = torch.zeros(n, dtype=torch.float64)
    n_real = 0.0
    for tokens, mask, lengths, index in batches(model, probe, batch_size, with_index=True):
        outs: dict[int, Tensor] = {}
        deltas: dict[int, Tensor] = {}

        def seam(call: AttentionCall, outs=outs, deltas=deltas) -> Tensor:
            out = call.output()  # [batch, query, head, dim]
            delta = torch.zeros_like(out, requires_grad=True)
            outs[call.layer], deltas[call.layer] = out.detach(), delta
            return out + delta

        first = logits_from(target, tokens, probe.repeat_len)
        logits = model.run(
            tokens,
            mask,
            handler=seam,
            output="logits",
            grad=True,
            logits_from=first,
            token_types=segment_ids(probe, index),
        )
        targets = target_positions(lengths, tokens.shape[1], target.probe, probe.repeat_len)
        loss_sum, count = token_losses(logits, tokens, targets, first=first)
        counts[index] = count.double().cpu()
        layers = sorted(deltas)
        grads = torch.autograd.grad(loss_sum.sum() / total_count, [deltas[la] for la in layers])
        real = mask.to(logits.device)[:, :, None, None].to(torch.float64)  # [batch, pos, 1, 1]
        for layer, g in zip(layers, grads, strict=True):
            # [batch, pos, head, dim], padding zeroed
            z, g = outs[layer].double() * real, g.double() * real
            grad_sum[index, layer] = g.sum(1).cpu()  # [batch, head, dim]
            zg[index, layer] = (z * g).sum((1, 3)).cpu()  # [batch, head]
            z_sum[layer] += z.sum((0, 1)).cpu()  # [head, dim]
        n_real += float(mask.sum())
        del logits, loss_sum, grads
    means = z_sum / n_real
    m = (
        means
        if values is None
        else values.double()
        if isinstance(values, Tensor)
        else float(values)
    )
    # sum over positions of (m - z) . g = m . sum g - sum z . g, per sequence; times total_count:
    # each sequence's share of the pooled estimate, in the units of an effect sum
    # [sequence, layer, head]
    est = ((m * grad_sum).sum(-1) if isinstance(m, Tensor) else m * grad_sum.sum(-1)) - zg
    return est * total_count, counts, means
