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
  its own head (:class:`~headscope.models.attention.SetHeads`, one head per row).

Both are the one intervention loop's (:func:`headscope.effects.loop.each_head`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jaxtyping import Float
from torch import Tensor

from headscope.effects import loop
from headscope.effects.loop import batches, segment_ids  # noqa: F401 - where callers find them
from headscope.effects.settings import ABLATIONS  # noqa: F401 - where callers find it
from headscope.effects.targets import Target
from headscope.models.attention import SetHeads
from headscope.result import Probe


def head_means(model, probe: Probe, batch_size: int) -> Float[Tensor, "layer head dim"]:
    """Each head's mean output (``A v``) over every real position of every sequence of ``probe``."""
    return loop.head_means(model, loop.probe_inputs(model, probe, batch_size))


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

    def ablate(layer: int, rows: Tensor, tokens: Tensor, mask: Tensor) -> SetHeads:
        return SetHeads(layer, rows, values[layer] if isinstance(values, Tensor) else values)

    return loop.each_head(
        model, probe, target, heads, ablate, batch_size, rows_per_forward, on_progress
    )
