"""Exact activation patching of every head, both directions (docs/patching.md).

A *patch* writes one head's activation from the *source* run into the *base* run and reads the
metric at the last position: denoising = base corrupt, source clean; noising = base clean, source
corrupt. What is written, per stage of :mod:`headscope.effects.stages`:

* ``z`` (head output, the head's slice of the output projection's input), ``q``, ``pattern``:
  query head h's slice, at the chosen positions (query positions; for ``pattern``, those rows);
* ``k``/``v``, ``kv_mode="group"``: the KV head's slice at the chosen key positions; every query
  head that shares it reads the source values. ``kv_mode="head"``: only query head h reads them.

Positions: ``"all"`` (every position), a named position of the task (per pair, e.g. IOI's ``S2``),
or one token index (``positions="each"`` gives the layer x head x position grid).

Speed (the one intervention loop's two tricks, :mod:`headscope.effects.loop`): the clean and corrupt
runs are cached once per batch of pairs (each block's output and every stage's tensors); a layer-l
patch starts at block l from the base run's kept residual stream (``Model.run(resume=...)``), and
every (head, position) patch of one layer shares a forward, the batch repeated once per patch.

Every forward here, cached or patched, computes attention with :func:`attend`, and the metric is
read with :mod:`headscope.effects.readout`; so a patch that writes the base run's own values gives
the base metric bit for bit (``tests/effects/test_patching.py``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.effects.loop import forwards, job_rows, jobs_per_forward
from headscope.effects.readout import read_metric
from headscope.effects.settings import PATCH_ACTIVATIONS as KINDS
from headscope.effects.settings import PATCH_DIRECTIONS as DIRECTIONS
from headscope.effects.settings import PATCH_KV_MODES as KV_MODES
from headscope.effects.stages import Edit, explicit_handler, head_slice
from headscope.errors import HeadscopeError
from headscope.probes.tasks import TokenizedTask

__all__ = [
    "DIRECTIONS",
    "KINDS",
    "KV_MODES",
    "Batch",
    "Cached",
    "Request",
    "baseline_metrics",
    "exact_patching",
    "make_batches",
    "n_units",
    "patched_metrics",
    "position_masks",
    "read_rows",
    "run_cached",
    "stage_of",
]


def stage_of(kind: str, kv_mode: str) -> str:
    """The attend() stage a (kind, kv_mode) patches: ``k``/``v`` per KV head, ``k_head``/``v_head``
    per query head; the other kinds are per query head whatever kv_mode says."""
    if kind in ("k", "v"):
        return kind if kv_mode == "group" else f"{kind}_head"
    return kind


def n_units(model, kind: str, kv_mode: str) -> int:
    """Heads a (kind, kv_mode) has per layer: KV heads for group-mode k/v, else query heads."""
    return model.n_kv_heads if stage_of(kind, kv_mode) in ("k", "v") else model.n_heads


@dataclass
class Batch:
    """Pairs that share a forward (right-padded; clean and corrupt of a pair have one length)."""

    index: Int[Tensor, " b"]  # each row's pair in the task
    clean: Int[Tensor, "b pos"]
    corrupt: Int[Tensor, "b pos"]
    mask: Bool[Tensor, "b pos"]
    lengths: Int[Tensor, " b"]
    answer: Int[Tensor, " b"]
    wrong: Int[Tensor, " b"]
    positions: dict[str, Int[Tensor, " b"]]

    def tokens(self, prompt: str) -> Tensor:
        return self.clean if prompt == "clean" else self.corrupt


def make_batches(tt: TokenizedTask, batch_size: int, pad_id: int) -> list[Batch]:
    """The task's pairs in batches of up to ``batch_size``, similar lengths together."""
    order = sorted(range(len(tt)), key=lambda i: (len(tt.clean[i]), i))
    out = []
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        lengths = torch.tensor([len(tt.clean[i]) for i in idx])
        n = int(lengths.max())
        clean = torch.full((len(idx), n), pad_id, dtype=torch.long)
        corrupt = clean.clone()
        for r, i in enumerate(idx):
            clean[r, : lengths[r]] = torch.tensor(tt.clean[i])
            corrupt[r, : lengths[r]] = torch.tensor(tt.corrupt[i])
        mask = torch.arange(n)[None, :] < lengths[:, None]  # [b, pos]
        out.append(
            Batch(
                torch.tensor(idx),
                clean,
                corrupt,
                mask,
                lengths,
                torch.tensor([tt.answer[i] for i in idx]),
                torch.tensor([tt.wrong[i] for i in idx]),
                {k: torch.tensor([v[i] for i in idx]) for k, v in tt.positions.items()},
            )
        )
    return out


def position_masks(batch: Batch, position: str) -> list[tuple[str, Bool[Tensor, "b pos"]]]:
    """``[(label, where [b, pos])]`` for one position request: ``all``, a named position (shifted
    by a token count: ``S1+1``), one token index (``"3"``) or ``each`` (one entry per token
    index; the caller checks that every pair has the same length)."""
    b, n = batch.mask.shape
    if position == "all":
        return [("all", batch.mask)]
    if position == "each" or position.isdigit():
        eye = torch.eye(n, dtype=torch.bool)
        return [
            (str(p), eye[p].expand(b, n))
            for p in (range(n) if position == "each" else [int(position)])
        ]
    name, shift = position, 0
    m = re.fullmatch(r"(.+?)([+-]\d+)", position)
    if position not in batch.positions and m and m[1] in batch.positions:
        name, shift = m[1], int(m[2])  # "S1+1": the token after each pair's S1
    if name not in batch.positions:
        raise HeadscopeError(
            f"No position '{position}' in this task; it has {', '.join(batch.positions)} "
            "(or one of them shifted, e.g. S1+1)."
        )
    at = batch.positions[name] + shift  # [b]
    outside = (at < 0) | (at >= batch.lengths)
    if outside.any():
        raise HeadscopeError(
            f"Position '{position}' falls outside pair {int(batch.index[outside][0])}; shift a "
            "named position by less."
        )
    where = torch.zeros(b, n, dtype=torch.bool)
    where[torch.arange(b), at] = True
    return [(position, where)]


@dataclass
class Cached:
    """One prompt side of a batch, run once: the metric, each block's output, each stage's
    tensors and (path patching with frozen MLPs) each MLP's output."""

    metric: Float[Tensor, " b"]
    logit_diff: Float[Tensor, " b"]
    blocks: dict[int, Tensor]  # {layer: [b, pos, d_model]}, the residual stream after block layer
    acts: dict[int, dict[str, Tensor]]  # {layer: {stage: tensor}}, layouts as in attend
    mlp: dict[int, Tensor] = field(default_factory=dict)  # {layer: [b, pos, d_model]}


def run_cached(
    model,
    batch: Batch,
    prompt: str,
    metric: str,
    stages: Sequence[str] = (),
    mlps: bool = False,
    cost=None,
) -> Cached:
    """The unpatched run of ``batch``'s ``prompt`` side ("clean" or "corrupt"), keeping
    ``stages`` of every layer (and every MLP's output with ``mlps``); ``cost`` (a path-patching
    :class:`~headscope.circuits.path_patching.Cost`) counts it."""
    blocks: dict[int, Tensor] = {}
    acts: dict[int, dict[str, Tensor]] = {}
    mlp: dict[int, Tensor] = {}
    with model.mlp_outputs(record=mlp) if mlps else contextlib.nullcontext():
        hidden = model.run(
            batch.tokens(prompt),
            batch.mask,
            handler=explicit_handler(acts, tuple(stages)),
            output="hidden",
            keep_blocks=blocks,
        )
    if cost is not None:
        cost.add(len(batch.index), model.n_layers)
    with torch.no_grad():
        m, ld = read_metric(model, metric, hidden, batch.lengths, batch.answer, batch.wrong)
    return Cached(m, ld, blocks, acts, mlp)


def read_rows(
    model, metric: str, hidden: Tensor, batch: Batch, repeat: int, grad: bool = False
) -> Tensor:
    """``[repeat * b]``: the metric of ``batch`` repeated ``repeat`` times, read from ``hidden``
    (detached, unless ``grad``: then differentiable, for attribution)."""
    with torch.enable_grad() if grad else torch.no_grad():
        m, _ = read_metric(
            model, metric, hidden, batch.lengths.repeat(repeat), batch.answer.repeat(repeat),
            batch.wrong.repeat(repeat),
        )  # fmt: skip
    return m if grad else m.detach()


def patched_metrics(
    model,
    batch: Batch,
    prompt: str,
    base: Cached,
    source: Cached,
    stage: str,
    layer: int,
    jobs: Sequence[tuple[int, Tensor]],
    metric: str,
    rows_per_forward: int | None = None,
    t: float = 1.0,
) -> Float[Tensor, "job b"]:
    """The metric of ``batch``'s ``prompt`` side (the base) with each job patched from ``source``.

    A job is ``(head, where [b, pos])``: write ``source``'s slice of that head at those positions
    (``head`` is a KV head for the stages ``k``/``v``). Jobs share forwards, ``rows_per_forward``
    rows at most (default: about :data:`~headscope.effects.loop.TOKENS_PER_FORWARD` tokens), each
    starting at block ``layer`` from the base run's kept residual stream (the one loop,
    :func:`headscope.effects.loop.forwards`).
    """
    b, n = batch.mask.shape
    src_all = source.acts[layer][stage]

    def setup(chunk: list) -> dict:
        k = len(chunk)
        heads = job_rows([h for h, _ in chunk], b)  # [k*b]: copy j patches job j
        where = torch.cat([w for _, w in chunk])  # [k*b, pos]
        rows = torch.arange(b).repeat(k)  # [k*b]: the pair of each row
        source_rows = head_slice(src_all, stage, rows.to(src_all.device), heads.to(src_all.device))
        return {"handler": explicit_handler(edit=Edit(layer, stage, heads, where, source_rows, t))}

    per = jobs_per_forward(b, n, rows_per_forward)
    out = [
        read_rows(model, metric, hidden, batch, len(chunk)).view(len(chunk), b)
        for chunk, hidden in forwards(
            model, batch.tokens(prompt), batch.mask, jobs, per, setup,
            layer=layer, kept=base.blocks, output="hidden",
        )
    ]  # fmt: skip
    return torch.cat(out)  # [job, b]


@dataclass(frozen=True)
class Request:
    """What to patch exactly: one activation kind in one direction at some positions, for ``units``
    (``(layer, head)``; KV heads for group-mode k/v)."""

    direction: str
    kind: str
    kv_mode: str
    positions: tuple[str, ...]
    units: tuple[tuple[int, int], ...]


def exact_patching(
    model,
    batches: Sequence[Batch],
    n_pairs: int,
    metric: str,
    requests: Sequence[Request],
    rows_per_forward: int | None = None,
    on_progress: Callable[[int], None] | None = None,
    baseline: dict[str, Tensor] | None = None,
) -> dict[tuple, Float[Tensor, " pair"]]:
    """Per pair, the patched metric of every request's (layer, unit, position):
    ``{(direction, kind, kv_mode, position label, layer, unit): [pair]}`` (float64).

    ``positions`` labels are those of :func:`position_masks` (``each`` -> ``"0"``, ``"1"``, ...).
    ``baseline`` (a dict) receives the unpatched metrics of the same cached runs
    (:func:`baseline_metrics`' keys).
    """
    stages = sorted({stage_of(r.kind, r.kv_mode) for r in requests})
    out: dict[tuple, Tensor] = {}
    if baseline is not None:
        baseline.update(_empty_baseline(n_pairs))
    for batch in batches:
        cached = {p: run_cached(model, batch, p, metric, stages) for p in ("clean", "corrupt")}
        if baseline is not None:
            _fill_baseline(baseline, batch, cached)
        # every (unit, position) of one direction, stage and layer shares forwards, whatever
        # request it came from
        groups: dict[tuple, dict] = {}
        for r in requests:
            stage = stage_of(r.kind, r.kv_mode)
            masks = [pm for p in r.positions for pm in position_masks(batch, p)]
            for layer, unit in r.units:
                for label, where in masks:
                    key = (r.direction, r.kind, r.kv_mode, label, layer, unit)
                    groups.setdefault((r.direction, stage, layer), {})[key] = (unit, where)
        for (direction, stage, layer), jobs in sorted(groups.items()):
            base, src = ("corrupt", "clean") if direction == "denoising" else ("clean", "corrupt")
            got = patched_metrics(
                model,
                batch,
                base,
                cached[base],
                cached[src],
                stage,
                layer,
                list(jobs.values()),
                metric,
                rows_per_forward,
            )  # [job, b]
            for j, key in enumerate(jobs):
                if key not in out:
                    out[key] = torch.full((n_pairs,), torch.nan, dtype=torch.float64)
                out[key][batch.index] = got[j].double().cpu()
            if on_progress is not None:
                on_progress(len(jobs))
    return out


def baseline_metrics(
    model, batches: Sequence[Batch], n_pairs: int, metric: str
) -> dict[str, Tensor]:
    """Per pair, the unpatched metric and logit difference of both prompts (float64), read exactly
    as the patched runs read theirs: ``{"clean", "corrupt", "clean_logit_diff",
    "corrupt_logit_diff"}``."""
    out = _empty_baseline(n_pairs)
    for batch in batches:
        _fill_baseline(
            out, batch, {p: run_cached(model, batch, p, metric, ()) for p in ("clean", "corrupt")}
        )
    return out


def _empty_baseline(n_pairs: int) -> dict[str, Tensor]:
    return {
        k: torch.full((n_pairs,), torch.nan, dtype=torch.float64)
        for k in ("clean", "corrupt", "clean_logit_diff", "corrupt_logit_diff")
    }


def _fill_baseline(out: dict[str, Tensor], batch: Batch, cached: dict[str, Cached]) -> None:
    for p, c in cached.items():
        out[p][batch.index] = c.metric.double().cpu()
        out[f"{p}_logit_diff"][batch.index] = c.logit_diff.double().cpu()
