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
resumes at that layer, the batch repeated once per head (the one intervention loop,
:func:`headscope.effects.loop.each_head`, with a
:class:`~headscope.models.attention.RestrictKeys` per row).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Bool
from torch import Tensor

from headscope.catalog import CENSUS
from headscope.effects import loop
from headscope.effects.targets import TARGETS, Target
from headscope.models.attention import RestrictKeys
from headscope.result import Probe, ScoreInfo


def drop_keys(layer: int, heads: Tensor, keys: Bool[Tensor, "batch key"]) -> RestrictKeys:
    """Row ``b``'s head ``heads[b]`` (-1: none) of ``layer`` may not attend to ``keys[b]`` (True =
    removed); its softmax renormalises over the others. A query row left with no key keeps its
    original mask (see the module docstring)."""
    return RestrictKeys(layer, heads, ~keys[:, None, :], empty="keep")  # keep: [batch, 1, key]


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
    heads = (
        [(la, h) for la in range(model.n_layers) for h in range(model.n_heads)]
        if heads is None
        else list(heads)
    )

    def drop(layer: int, rows: Tensor, tokens: Tensor, mask: Tensor) -> RestrictKeys:
        keys = removed_keys(model, tokens, mask)  # [batch, key]
        return drop_keys(layer, rows, keys.repeat(len(rows) // len(tokens), 1))

    return loop.each_head(
        model, probe, target_for(model), heads, drop, batch_size, rows_per_forward, on_progress
    )


def noop_info(model) -> ScoreInfo:
    """How the no-op effect rows of ``scores.csv`` are described (decoders: text loss; encoders:
    the embedding)."""
    return CENSUS[f"effect_noop_{target_for(model).name}"]
