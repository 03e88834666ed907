"""The one intervention loop: a batch run clean once, then once per job with that job's
intervention, as many jobs to a forward as fit.

Every causal number headscope reports rests on it: exact ablation and the no-op test
(:func:`each_head`), activation patching (:mod:`headscope.effects.patching`), path patching and
faithfulness (:mod:`headscope.circuits`), and the notebooks' group ablations. Two things make it
cheap:

* **the clean prefix is reused**: the residual stream entering layer ``l`` does not depend on a
  change at ``l``, so the clean run keeps every block's output (``Model.run(keep_blocks=...)``)
  and a job at layer ``l`` starts at block ``l`` from it (``resume``): on average half a forward
  per job;
* **jobs share forwards**: the batch is repeated once per job (:func:`forwards`), copy ``j``
  carrying job ``j``'s intervention (:class:`~headscope.models.attention.SetHeads` and
  :class:`~headscope.models.attention.RestrictKeys` act on chosen heads *per row*), up to about
  :data:`TOKENS_PER_FORWARD` tokens a forward.

:func:`head_means` is every mean-ablation value: each head's mean output over the real positions
of the batches it is given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.effects.targets import Target, effect_sums, logits_from, measure
from headscope.engines.extract import pad_batch
from headscope.models.attention import AttentionCall, Intervention
from headscope.result import Probe

TOKENS_PER_FORWARD = 8192  # rows x positions per forward (the batch repeated once per job)

Head = tuple[int, int]


def jobs_per_forward(rows: int, length: int, rows_per_forward: int | None = None) -> int:
    """How many jobs share one forward of a ``rows`` x ``length`` batch: ``rows_per_forward`` rows
    at most (default: about :data:`TOKENS_PER_FORWARD` tokens), at least one job.

    >>> jobs_per_forward(8, 64), jobs_per_forward(8, 64, rows_per_forward=16)
    (16, 2)
    """
    return max(1, (rows_per_forward or max(rows, TOKENS_PER_FORWARD // length)) // rows)


def job_rows(values: Sequence, rows: int) -> Tensor:
    """``[len(values) * rows]``: each value repeated once per row of the batch (copy ``j`` of the
    batch carries job ``j``).

    >>> job_rows([3, 5], 2).tolist()
    [3, 3, 5, 5]
    """
    return torch.tensor(list(values)).repeat_interleave(rows)


def forwards(
    model,
    tokens: Int[Tensor, "batch pos"],
    mask: Bool[Tensor, "batch pos"],
    jobs: Sequence,
    per_forward: int,
    setup: Callable[[list], dict],
    *,
    layer: int = 0,
    kept: dict[int, Tensor] | None = None,
    token_types: Int[Tensor, "batch pos"] | None = None,
    context: Callable[[int], contextlib.AbstractContextManager] | None = None,
    **run,
) -> Iterator[tuple[list, Tensor | None]]:
    """``(chunk, output)`` for each chunk of up to ``per_forward`` jobs: one forward of the batch
    repeated once per job of the chunk (rows ``j * batch .. (j + 1) * batch`` are job ``j``'s).

    ``setup(chunk)`` gives the forward's ``interventions`` and/or ``handler``
    (:meth:`~headscope.models.model.Model.run`'s keywords); ``run`` the rest (``output``,
    ``logits_from``, ...). With ``kept`` (the clean run's block outputs) each forward starts at
    block ``layer`` from the clean residual stream, as the full forward would have it.
    ``context(k)``, if given, is entered around each forward of ``k`` jobs (e.g. frozen MLPs,
    :meth:`~headscope.models.model.Model.mlp_outputs`).
    """
    for start in range(0, len(jobs), per_forward):
        chunk = list(jobs[start : start + per_forward])
        k = len(chunk)
        resume = None
        if kept is not None and layer > 0:
            resume = (layer, kept[layer - 1].repeat(k, 1, 1))  # [k * batch, pos, d_model]
        with context(k) if context is not None else contextlib.nullcontext():
            out = model.run(
                tokens.repeat(k, 1),
                mask.repeat(k, 1),
                resume=resume,
                token_types=None if token_types is None else token_types.repeat(k, 1),
                **setup(chunk),
                **run,
            )
        yield chunk, out


# ------------------------------------------------------------------------------ a probe's batches


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


def probe_inputs(model, probe: Probe, batch_size: int) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """``(tokens, mask, token_types)`` of each batch of ``probe`` (:func:`batches`' order)."""
    for tokens, mask, _, index in batches(model, probe, batch_size, with_index=True):
        yield tokens, mask, segment_ids(probe, index)


def head_means(
    model, inputs: Iterable[tuple[Tensor, Tensor, Tensor | None]]
) -> Float[Tensor, "layer head dim"]:
    """Each head's mean output (``A v``) over every real position of every batch of ``inputs``
    (``(tokens, mask, token_types)`` each: :func:`probe_inputs`, or a task's prompts), summed in
    float64."""
    sums: dict[int, Tensor] = {}
    count = 0.0
    for tokens, mask, types in inputs:
        real = mask.to(model.device)[:, :, None, None].double()  # [batch, pos, 1, 1]

        def record(call: AttentionCall, real=real) -> Tensor:
            out = call.output()  # [batch, query, head, dim]
            s = (out.double() * real).sum((0, 1))  # [head, dim]
            sums[call.layer] = sums.get(call.layer, 0) + s
            return out

        model.run(tokens, mask, handler=record, token_types=types)
        count += float(mask.sum())
    return torch.stack([sums[layer] for layer in range(model.n_layers)]) / count  # [layer, ...]


# ------------------------------------------------------------------------------ one head at a time


def each_head(
    model,
    probe: Probe,
    target: Target,
    heads: Sequence[Head],
    intervention: Callable[[int, Tensor, Tensor, Tensor], Intervention],
    batch_size: int,
    rows_per_forward: int | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> dict[Head, tuple[Tensor, Tensor]]:
    """``{(layer, head): (effect sums, counts)}``: the change in ``target`` with each of ``heads``
    changed alone, per sequence of ``probe`` (``[sequence]`` each, float64; the pooled effect is
    ``sums.sum() / counts.sum()``).

    ``intervention(layer, heads [rows], tokens, mask)`` makes the change of one forward: row ``r``
    of the repeated batch changes head ``heads[r]`` of ``layer`` (``tokens`` and ``mask`` are the
    batch's, before repeating). Exact ablation passes a
    :class:`~headscope.models.attention.SetHeads`, the no-op test a
    :class:`~headscope.models.attention.RestrictKeys`.
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
        run = dict(output=target.output, logits_from=first)
        clean_out = model.run(tokens, mask, keep_blocks=kept, token_types=types, **run)
        clean = measure(target, clean_out, tokens, lengths, probe.repeat_len)
        per = jobs_per_forward(b, tokens.shape[1], rows_per_forward)
        for layer, layer_heads in sorted(by_layer.items()):

            def setup(chunk, layer=layer, b=b, tokens=tokens, mask=mask):
                return {"interventions": [intervention(layer, job_rows(chunk, b), tokens, mask)]}

            for chunk, out in forwards(
                model, tokens, mask, layer_heads, per, setup,
                layer=layer, kept=kept, token_types=types, **run,
            ):  # fmt: skip
                k = len(chunk)
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
                    s, c = effect_sums(target, clean, got)  # [batch] each
                    sums[(layer, h)][0][index] += s.double().cpu()
                    sums[(layer, h)][1][index] += c.double().cpu()
                if on_progress is not None:
                    on_progress(k * b)
    return sums
