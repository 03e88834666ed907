"""The [SEP] / BOS no-op test: does a head's attention to [SEP] (or to position 0) do anything?

Clark et al. (2019, section 3) found over half of BERT's attention in layers 6-10 on [SEP] and
proposed it works "as a sort of no-op". A weight cannot show that; removing it can. For head
``h`` of layer ``l``, on the text probe:

* **removed keys**: encoders, every [SEP] key at ``k >= 1`` (the ``separator`` metric's keys);
  decoders, position 0 (BOS, the ``sink`` metric's key);
* **intervention**: the head's scores at those keys are masked before its softmax, so the rest of
  its row is renormalised (``A'[q, k] = A[q, k] / (1 - A[q, removed])``); every other head, and
  the head's shared KV head (grouped-query attention), are untouched;
* **a row whose only visible keys are the removed ones** (a decoder's query 0 sees only BOS) has
  nothing to renormalise onto: it is left as it was (so query 0 of a decoder is never changed);
* **effect** = the change in the model's target (:mod:`headscope.effects.targets`): decoders,
  ``text_loss`` (mean next-token loss, nats, positions 1..n-1); encoders, ``embedding``
  (``1 - cos`` of the mean-pooled last hidden state), per sequence; pooled like every effect
  (rows ``effect_noop_text_loss`` / ``effect_noop_embedding``, :data:`headscope.catalog.CENSUS`);
* **weight** beside it: the head's mean attention on the removed keys over the queries whose row
  changes (``sink`` / ``separator``, from the same sequences).

A no-op head has a high weight and an effect near 0 (chance: 0). Intervals: a seeded bootstrap
over sequences of both. Cheap like exact ablation (:mod:`headscope.effects.ablation`): each batch
runs clean once, keeps every block's output, and the heads of one layer share one forward that
resumes at that layer, the batch repeated once per head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool
from torch import Tensor

from headscope.catalog import CENSUS
from headscope.effects.ablation import batches, segment_ids
from headscope.effects.targets import TARGETS, Target, effect_sums, logits_from, measure
from headscope.models.attention import AttentionCall
from headscope.result import Probe, ScoreInfo


@dataclass(frozen=True)
class DropKeys:
    """For row ``b`` of the batch, head ``heads[b]`` (-1: none) of layer ``layer`` may not attend
    to the keys ``keys[b]`` (True = removed); its softmax renormalises over the others. A query
    row left with no key keeps its original mask (see the module docstring)."""

    layer: int
    heads: Tensor  # [batch] long
    keys: Bool[Tensor, "batch key"]

    def before(self, call: AttentionCall) -> AttentionCall:
        if call.layer != self.layer:
            return call
        b, h, n_q, n_k = call.shape
        mask = call.full_mask().expand(b, h, n_q, n_k).clone()  # [batch, head, query, key] bool
        heads = self.heads.to(mask.device)
        rows = torch.nonzero(heads >= 0).squeeze(-1)  # [m]
        hh = heads[rows]  # [m]
        old = mask[rows, hh]  # [m, query, key]
        new = old & ~self.keys.to(mask.device)[rows][:, None, :n_k]  # [m, query, key]
        empty = ~new.any(-1, keepdim=True)  # [m, query, 1]: only removed keys were visible
        mask[rows, hh] = torch.where(empty, old, new)
        return call.with_mask(mask)

    def after(self, call: AttentionCall, out: Tensor) -> Tensor:
        return out


def removed_keys(model, tokens: Tensor, mask: Tensor) -> Bool[Tensor, "batch key"]:
    """The keys the test removes: [SEP] at ``k >= 1`` (encoders), position 0 (decoders)."""
    if model.causal:
        keys = torch.zeros_like(mask)
        keys[:, 0] = True
        return keys
    keys = (tokens == model.sep_id) & mask
    keys[:, 0] = False
    return keys


def target_for(model) -> Target:
    """``text_loss`` for decoders, ``embedding`` for encoders (the text probe's effect target)."""
    return TARGETS["text_loss"] if model.causal else TARGETS["embedding"]


def noop_effects(
    model,
    probe: Probe,
    heads: Sequence[tuple[int, int]] | None = None,
    batch_size: int = 8,
    rows_per_forward: int | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> dict[tuple[int, int], tuple[Tensor, Tensor]]:
    """``{(layer, head): (effect sums [sequence], counts [sequence])}`` (float64) of removing each
    head's attention to [SEP] / position 0 on the text ``probe``; pooled = ``sums.sum() /
    counts.sum()``."""
    target = target_for(model)
    heads = (
        [(la, h) for la in range(model.n_layers) for h in range(model.n_heads)]
        if heads is None
        else list(heads)
    )
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    n = len(probe)
    sums = {
        (la, h): (torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64))
        for la, h in heads
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
        keys = removed_keys(model, tokens, mask)  # [b, key]
        per_forward = max(1, (rows_per_forward or max(b, 8192 // tokens.shape[1])) // b)
        for layer, layer_heads in sorted(by_layer.items()):
            for start in range(0, len(layer_heads), per_forward):
                chunk = layer_heads[start : start + per_forward]
                k = len(chunk)
                rep = torch.tensor(chunk).repeat_interleave(
                    b
                )  # [k * b]: copy j changes head chunk[j]
                resume = (
                    (layer, kept[layer - 1].repeat(k, 1, 1)) if layer > 0 else None
                )  # [k*b, pos, d_model]
                out = model.run(
                    tokens.repeat(k, 1),
                    mask.repeat(k, 1),
                    interventions=[DropKeys(layer, rep, keys.repeat(k, 1))],
                    output=target.output,
                    resume=resume,
                    logits_from=first,
                    token_types=None if types is None else types.repeat(k, 1),
                )
                changed = measure(
                    target, out, tokens.repeat(k, 1), lengths.repeat(k), probe.repeat_len
                )
                for j, h in enumerate(chunk):
                    part = slice(j * b, (j + 1) * b)
                    got = (
                        (changed[0][part], changed[1][part])
                        if isinstance(changed, tuple)
                        else changed[part]
                    )
                    s, c = effect_sums(target, clean, got)  # [b] each
                    sums[(layer, h)][0][index] += s.double().cpu()
                    sums[(layer, h)][1][index] += c.double().cpu()
                if on_progress is not None:
                    on_progress(k * b)
    return sums


def noop_info(model) -> ScoreInfo:
    """How the no-op effect rows of ``scores.csv`` are described (decoders: text loss; encoders:
    the embedding)."""
    return CENSUS[f"effect_noop_{target_for(model).name}"]
