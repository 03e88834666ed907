"""Exact ablation: what happens to the model without one head, one forward per head.

Ablating head ``h`` of layer ``l`` replaces its slice of the input to the output projection (its
``A v``, ``[batch, query, head, dim]`` at the attention seam) at every position: by the mean of
that slice over every real position of every sequence of the probe, from the clean run (mean
ablation, the default), or by 0 (zero ablation). Only the query head changes; with grouped-query
attention its shared KV head, and so every other head, is untouched.

Two things make it cheap:

* **the clean prefix is reused**: the residual stream entering layer ``l`` does not depend on an
  ablation at ``l``, so each batch runs clean once, keeps every block's output, and an ablated
  forward at layer ``l`` starts at block ``l`` from it (:meth:`~headscope.models.model.Model.run`'s
  ``resume``): on average half a forward per head;
* **heads of one layer share a forward**: the batch is repeated once per head, each copy ablating
  its own head (:class:`~headscope.models.attention.AblateHeads`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.effects.settings import ABLATIONS  # noqa: F401 - where callers find it
from headscope.effects.targets import Target, effect_sums, logits_from, measure
from headscope.engines.extract import pad_batch
from headscope.models.attention import AblateHeads, AttentionCall
from headscope.result import Probe


def batches(model, probe: Probe, batch_size: int, with_index: bool = False):
    """``(tokens, mask, lengths)`` for each batch of ``probe``, similar lengths together; with
    ``with_index``, also each row's place in the probe (``[batch]``)."""
    order = sorted(range(len(probe)), key=lambda i: (len(probe.sequences[i]), i))
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        padded = pad_batch([probe.sequences[i] for i in index], model.pad_id)
        yield (*padded, torch.tensor(index)) if with_index else padded


def segment_ids(probe: Probe, index: Tensor) -> Tensor | None:
    """The padded segment ids (``token_type_ids``) of the batch made of ``probe``'s rows ``index``
    (None when the probe feeds none)."""
    if probe.token_types is None:
        return None
    return pad_batch([probe.token_types[i] for i in index.tolist()], 0)[0]


def head_means(model, probe: Probe, batch_size: int) -> Float[Tensor, "layer head dim"]:
    """Each head's mean output (``A v``) over every real position of every sequence of ``probe``."""
    sums: dict[int, Tensor] = {}
    count = 0.0

    for tokens, mask, _, index in batches(model, probe, batch_size, with_index=True):
        real = mask.to(model.device)[:, :, None, None].float()  # [batch, pos, 1, 1]

        def record(call: AttentionCall, real=real) -> Tensor:
            out = call.output()  # [batch, query, head, dim]
            s = (out.double() * real.double()).sum((0, 1))  # [head, dim], summed in float64
            sums[call.layer] = sums.get(call.layer, 0) + s
            return out

        model.run(tokens, mask, handler=record, token_types=segment_ids(probe, index))
        count += float(mask.sum())
    # [layer, head, dim]
    return torch.stack([sums[layer] for layer in range(model.n_layers)]) / count


def exact_effects(
    model,
    probe: Probe,
    target: Target,
    heads: Sequence[tuple[int, int]],
    values: Float[Tensor, "layer head dim"] | float,
    batch_size: int,
    rows_per_forward: int | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> dict[tuple[int, int], tuple[Tensor, Tensor]]:
    """``{(layer, head): (effect sums, counts)}`` for ``heads``, ablated one at a time (exactly),
    per sequence of ``probe`` (``[sequence]`` each, float64): the pooled effect is ``sums.sum() /
    counts.sum()``.

    ``values`` is the ablation value of every head (``head_means`` for mean ablation) or 0.0.
    ``rows_per_forward`` caps sequences per ablated forward (the batch repeated once per head;
    default: about 8k tokens a forward).
    """
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    n = len(probe)
    sums = {
        (layer, h): (torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64))
        for layer, hs in by_layer.items()
        for h in hs
    }
    for tokens, mask, lengths, index in batches(model, probe, batch_size, with_index=True):
        b = len(tokens)
        kept: dict[int, Tensor] = {}
        first = logits_from(target, tokens, probe.repeat_len) if target.output == "logits" else 0
        types = segment_ids(probe, index)
        clean = measure(
            target,
            model.run(
                tokens,
                mask,
                output=target.output,
                keep_blocks=kept,
                logits_from=first,
                token_types=types,
            ),
            tokens,
            lengths,
            probe.repeat_len,
        )
        rows = rows_per_forward or max(b, 8192 // tokens.shape[1])
        per_forward = max(1, rows // b)  # heads per ablated forward
        for layer, layer_heads in sorted(by_layer.items()):
            for start in range(0, len(layer_heads), per_forward):
                chunk = layer_heads[start : start + per_forward]
                k = len(chunk)
                # [k * batch]: copy j ablates head chunk[j]
                rep = torch.tensor(chunk).repeat_interleave(b)
                # [k*b, pos, d_model]
                resume = (layer, kept[layer - 1].repeat(k, 1, 1)) if layer > 0 else None
                val = values[layer] if isinstance(values, Tensor) else values
                out = model.run(
                    tokens.repeat(k, 1),
                    mask.repeat(k, 1),
                    interventions=[AblateHeads(layer, rep, val)],
                    output=target.output,
                    resume=resume,
                    logits_from=first,
                    token_types=None if types is None else types.repeat(k, 1),
                )
                ablated = measure(
                    target, out, tokens.repeat(k, 1), lengths.repeat(k), probe.repeat_len
                )
                for j, h in enumerate(chunk):
                    part = slice(j * b, (j + 1) * b)
                    abl = (
                        (ablated[0][part], ablated[1][part])
                        if isinstance(ablated, tuple)
                        else ablated[part]
                    )
                    s, c = effect_sums(target, clean, abl)  # [batch] each
                    sums[(layer, h)][0][index] += s.double().cpu()
                    sums[(layer, h)][1][index] += c.double().cpu()
                if on_progress is not None:
                    on_progress(k * b)
    return sums
