"""Notebook 05's helpers: induction scores per sequence (so an ablation's change gets an interval
over sequences), the same for many single-head ablations at once (a control distribution), and
resample ablation as an intervention with a per-position value.

On a repeat probe ``BOS + R + R`` (``|R| = L``) head ``(l, h)``'s induction score on sequence ``s``
is ``I_s = mean_{q = L+1..2L} A_s[q, q - L + 1]`` (the scan's ``induction``: attention from the
second copy's token to the token after its earlier copy), with ``A = softmax(q k^T * scale)``
recomputed from each attention call's own query, key and mask, so any intervention upstream
(``before`` or an earlier layer's ``after``) counts.

Resample ablation of head ``(l, h)`` on a batch of equal-length sequences replaces its output
``z_s`` (``[query, dim]``, its slice of the output projection's input) by ``z_{s - shift}``: the
head's clean output on another sequence of the batch (cyclically), every other head untouched.

>>> import torch
>>> resampled_output(torch.arange(3.0)[:, None, None], shift=1)[:, 0, 0].tolist()
[2.0, 0.0, 1.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall, ReplaceHeadOutput, StopForward

Head = tuple[int, int]


def _check_repeat(probe) -> int:
    if probe.repeat_len is None or len({len(s) for s in probe.sequences}) != 1:
        raise HeadscopeError(
            "This needs a repeat probe of one length (BOS + R + R, headscope.repeat_probe)."
        )
    return int(probe.repeat_len)


def _pattern_score(call: AttentionCall, L: int) -> Float[Tensor, "batch head"]:
    """Each row's induction score for every head of ``call`` (float64)."""
    k = call.key.repeat_interleave(call.group, dim=1)  # [batch, head, key, dim]
    s = (call.query.double() @ k.double().transpose(-1, -2)) * call.scale  # [b, h, q, k]
    s = s.masked_fill(~call.full_mask().expand_as(s), float("-inf"))
    a = s.softmax(-1)
    q = torch.arange(L + 1, 2 * L + 1, device=a.device)
    return a[:, :, q, q - L + 1].mean(2).cpu()  # [batch, head]


def sequence_induction(
    model,
    probe,
    layers: Sequence[int],
    interventions: Sequence = (),
    resume: tuple[int, Tensor] | None = None,
) -> Float[np.ndarray, "sequence layer head"]:
    """Induction scores of every head of ``layers``, per sequence of the repeat ``probe`` (one
    batch), with ``interventions``; ``resume=(l, hidden)`` starts the forward at block ``l`` from
    ``hidden`` (``Model.run``'s resume). The forward stops after the last of ``layers``."""
    L = _check_repeat(probe)
    tokens = torch.tensor(probe.sequences)
    order, found = sorted(set(layers)), {}

    def score(call: AttentionCall) -> Tensor:
        out = call.output()
        if call.layer in order:
            found[call.layer] = _pattern_score(call, L)
        if len(found) == len(order):
            raise StopForward
        return out

    model.run(tokens, handler=score, interventions=interventions, resume=resume)
    missing = [la for la in order if la not in found]
    if missing:
        raise HeadscopeError(
            f"Layers {missing} were not reached (resumed at layer {resume[0] if resume else 0})."
        )
    by = {la: found[la] for la in order}
    return torch.stack([by[la] for la in layers], dim=1).numpy()  # [sequence, layer, head]


def ablation_induction(
    model,
    probe,
    heads: Sequence[Head],
    values: Mapping[Head, Tensor | float],
    receivers: Sequence[Head],
) -> tuple[
    Float[np.ndarray, "sequence receiver"], dict[Head, Float[np.ndarray, "sequence receiver"]]
]:
    """The ``receivers``' induction scores per sequence, clean and with each of ``heads`` ablated
    alone (its output replaced by ``values[head]``: a ``[dim]`` mean, 0.0, or a per-position
    ``[batch, query, dim]`` tensor). Every head must lie below every receiver's layer: the clean
    residual stream is kept once and each ablated forward resumes at the head's layer."""
    layers = sorted({la for la, _ in receivers})
    for la, h in heads:
        if la >= layers[0]:
            raise HeadscopeError(
                f"Head L{la}H{h} is not below the receivers (lowest layer {layers[0]}); ablate "
                f"heads of layers 0..{layers[0] - 1}."
            )
    tokens = torch.tensor(probe.sequences)
    kept: dict[int, Tensor] = {}
    model.run(tokens, keep_blocks=kept, output="hidden")
    idx = [(layers.index(la), h) for la, h in receivers]

    def pick(scores: np.ndarray) -> np.ndarray:
        return np.stack([scores[:, i, h] for i, h in idx], axis=1)  # [sequence, receiver]

    clean = pick(sequence_induction(model, probe, layers))
    out = {}
    for la, h in heads:
        resume = (la, kept[la - 1]) if la > 0 else None
        iv = [ReplaceHeadOutput(la, h, values[(la, h)])]
        out[(la, h)] = pick(sequence_induction(model, probe, layers, iv, resume=resume))
    return clean, out


def resampled_output(
    outputs: Float[Tensor, "batch query dim"], shift: int = 1
) -> Float[Tensor, "batch query dim"]:
    """Row ``s`` gets row ``s - shift`` (cyclically): another sequence's output at each position."""
    if outputs.shape[0] < 2:
        raise HeadscopeError("Resample ablation needs at least 2 sequences in the batch.")
    return outputs.roll(shift, dims=0)


def head_outputs(model, tokens: Tensor, heads: Sequence[Head]) -> dict[Head, Tensor]:
    """Each of ``heads``' clean output ``[batch, query, dim]`` on ``tokens`` (one forward)."""
    want = {la for la, _ in heads}
    seen: dict[int, Tensor] = {}

    def record(call: AttentionCall) -> Tensor:
        out = call.output()
        if call.layer in want:
            seen[call.layer] = out.detach().clone()
        if len(seen) == len(want):
            raise StopForward
        return out

    model.run(tokens, handler=record)
    return {(la, h): seen[la][:, :, h] for la, h in heads}


def resample_ablation(model, probe, head: Head, shift: int = 1) -> ReplaceHeadOutput:
    """The intervention that resample-ablates ``head`` on the repeat ``probe`` run as one batch
    (all its sequences, in order): its output on sequence ``s`` becomes its clean output on
    sequence ``s - shift``."""
    _check_repeat(probe)
    z = head_outputs(model, torch.tensor(probe.sequences), [head])[head]
    return ReplaceHeadOutput(head[0], head[1], resampled_output(z, shift))


def bootstrap_mean(
    values: Sequence[float], resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of per-sequence ``values`` and its percentile bootstrap
    interval over sequences."""
    v = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    boot = v[rng.integers(0, len(v), (resamples, len(v)))].mean(1)
    a = (1 - level) / 2
    return float(v.mean()), float(np.quantile(boot, a)), float(np.quantile(boot, 1 - a))
