"""Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): the effect of one head's output,
taken from the other prompt, reaching the model only through a chosen receiver (docs/circuits.md).

For a sender head ``s`` (layer ``ls``), a receiver and a direction (noising: base = clean, source =
corrupt; denoising: the reverse), on every pair of a task:

1. run base and source once and keep every head's output ``z`` (its slice of the output
   projection's input), each block's output and, if MLPs are frozen, each MLP's output;
2. run base with ``s``'s output from source and *every other head's output frozen at its base
   value* (layers ``>= ls``; MLPs recompute unless ``freeze_mlps``), and keep the receiver's input:
   its query, key or value (after any norm on them and rotary; a key or value is what the receiver
   head reads of its KV head, so with grouped-query attention the other heads of the group are not
   touched), or, for the ``logits`` receiver, the whole run (the metric reads its last position);
3. run base with only the receiver's input from (2), at the receiver's positions, nothing frozen.

The effect is read like patching (:mod:`headscope.effects.patch_table`): noising, the share of the
clean-corrupt gap destroyed; denoising, the share restored. Senders patch at every position (or one
named position, ``sender_position``).

As few forwards as the maths allows (counted in :class:`Cost`):

* step (1) once per batch of pairs; steps (2) and (3) start from base's kept residual stream at the
  sender's / the receiver's layer (``Model.run(resume=...)``);
* step (2) computes no attention at all (every head's output is known: base's, one slice from
  source), only the projections that produce the receivers' inputs and the MLPs; it stops after the
  last receiver's layer when no receiver is ``logits``; every sender of one layer shares a forward
  (the batch repeated once per sender), and one step-(2) forward serves every receiver;
* step (3) batches every (sender, receiver) job of one receiver layer and kind into one forward.

One-at-a-time path patching (:func:`one_at_a_time_cost`) runs two full forwards per sender.

Every forward goes through :func:`~headscope.effects.stages.attend` (steps 1 and 3), so a sender
patched with its base run's own output changes nothing (``tests/circuits/test_path_patching.py``
checks it bit for bit on tiny models, and every effect against an independent plain-transformers
implementation, ``tests/circuits/path_oracle.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.circuits.receivers import (
    STAGE,
    Path,
    Receiver,
    ReceiverGroup,
    check_kind,
    members,
)
from headscope.effects.loop import forwards, job_rows, jobs_per_forward
from headscope.effects.patching import Batch, Cached, position_masks, read_rows, run_cached
from headscope.effects.stages import Edit, attend, head_slice
from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall, StopForward


def check_paths(
    model, senders: Sequence[tuple[int, int]], receivers: Sequence[Receiver | ReceiverGroup]
) -> list[tuple[tuple[int, int], Receiver | ReceiverGroup]]:
    """Every (sender, receiver) pair to patch, each sender below its receiver; one line for a head
    outside the model, an unknown kind, or a named pair a sender cannot reach (a head reads only
    the output of heads in layers below its own)."""
    if not receivers:
        raise HeadscopeError("No receiver given; name logits or heads' inputs (L9H1.q@END).")
    if not senders:
        raise HeadscopeError("No sender given; name heads (L3H0) or leave the senders to default.")
    L, H = model.n_layers, model.n_heads
    for r in (m for target in receivers for m in members(target)):
        check_kind(r.kind)
        if r.kind != "logits" and not (0 <= r.layer < L and 0 <= r.head < H):
            raise HeadscopeError(
                f"Receiver {r.name} is outside {model.name} ({L} layers x {H} heads: "
                f"L0H0..L{L - 1}H{H - 1})."
            )
    for la, h in senders:
        if not (0 <= la < L and 0 <= h < H):
            raise HeadscopeError(
                f"Sender L{la}H{h} is outside {model.name} ({L} layers x {H} heads)."
            )
    pairs = []
    for r in receivers:
        for s in senders:
            if r.kind != "logits" and s[0] >= r.layer:
                raise HeadscopeError(
                    f"Sender L{s[0]}H{s[1]} is in layer {s[0]}, not below receiver {r.name} "
                    f"(layer {r.layer}): a head reads only heads of earlier layers; choose "
                    f"senders in layers 0..{r.layer - 1}."
                )
            pairs.append((tuple(s), r))
    return pairs


def senders_below(
    model, receivers: Sequence[Receiver | ReceiverGroup]
) -> dict[Receiver | ReceiverGroup, list[tuple[int, int]]]:
    """The default senders of each receiver: every head of every earlier layer (every head for
    ``logits``)."""
    out = {}
    for r in receivers:
        top = model.n_layers if r.kind == "logits" else r.layer
        out[r] = [(la, h) for la in range(top) for h in range(model.n_heads)]
    return out


@dataclass
class Cost:
    """What a path-patching run computed: ``forwards`` (calls of the model), ``block_rows`` (rows x
    blocks run: one full forward of ``b`` pairs is ``b x n_layers``)."""

    forwards: int = 0
    block_rows: int = 0

    def add(self, rows: int, blocks: int) -> None:
        self.forwards += 1
        self.block_rows += rows * blocks

    def full_forwards(self, n_pairs: int, n_layers: int) -> float:
        """The work in units of one full forward over every pair."""
        return self.block_rows / (n_pairs * n_layers)


def one_at_a_time_cost(model, n_pairs: int, n_jobs: int) -> Cost:
    """What patching each (sender, receiver) pair alone costs: the two cached runs, then two full
    forwards (steps 2 and 3) per pair, every pair of the task in each."""
    c = Cost()
    for _ in range(2 + 2 * n_jobs):
        c.add(n_pairs, model.n_layers)
    return c


# ------------------------------------------------------------------------------ the runs


def _frozen_handler(
    base: Cached,
    repeat: int,
    edit: Edit | None,
    record: dict[int, dict[str, Tensor]],
    record_layers: set[int],
    stop_at: int | None,
) -> Callable[[AttentionCall], Tensor]:
    """Step (2)'s attention: every head's output is base's (``repeat`` copies of the batch), but
    for ``edit``'s sender slice; the receivers' inputs of ``record_layers`` are kept (per query
    head)."""

    def handler(call: AttentionCall) -> Tensor:
        la = call.layer
        if la in record_layers:
            g = call.group
            record[la] = {
                "q": call.query.detach(),
                "k_head": (call.key.repeat_interleave(g, 1) if g > 1 else call.key).detach(),
                "v_head": (call.value.repeat_interleave(g, 1) if g > 1 else call.value).detach(),
            }  # [rows, head, pos, dim]
        if stop_at is not None and la == stop_at:
            raise StopForward
        z = base.acts[la]["z"].repeat(repeat, 1, 1, 1)  # [rows, pos, head, d_head]
        return edit.apply(z) if edit is not None and edit.layer == la else z

    return handler


class MultiEdit:
    """Several :class:`~headscope.effects.stages.Edit` s of one layer and stage, applied in turn
    (a receiver group with two heads in one layer)."""

    def __init__(self, edits: Sequence[Edit]):
        self.edits = list(edits)
        self.layer, self.stage = edits[0].layer, edits[0].stage

    def apply(self, x: Tensor) -> Tensor:
        for e in self.edits:
            x = e.apply(x)
        return x


def _edits_handler(edits: Sequence[Edit]) -> Callable[[AttentionCall], Tensor]:
    """Step (3)'s attention: :func:`attend` everywhere, the edits of each layer written in."""
    by_layer: dict[int, list[Edit]] = {}
    for e in edits:
        by_layer.setdefault(e.layer, []).append(e)
    multi = {la: MultiEdit(es) for la, es in by_layer.items()}

    def handler(call: AttentionCall) -> Tensor:
        return attend(call, multi.get(call.layer))

    return handler


def path_patching(
    model,
    batches: Sequence[Batch],
    n_pairs: int,
    metric: str,
    paths: Sequence[Path],
    direction: str = "noising",
    freeze_mlps: bool = False,
    sender_position: str = "all",
    rows_per_forward: int | None = None,
    t: float = 1.0,
    baseline: dict[str, Tensor] | None = None,
    cost: Cost | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> dict[Path, Float[Tensor, " pair"]]:
    """Per pair, the metric after path patching each ``(sender, receiver)`` of ``paths`` (float64;
    see the module docstring); a :class:`ReceiverGroup` gets every member's input written at once.
    ``t`` < 1 moves the sender's output only that fraction of the way (a dose, for first-order
    checks). ``baseline`` (a dict) receives the unpatched ``clean`` / ``corrupt`` metrics and logit
    differences; ``cost`` counts the forwards."""
    if direction not in ("noising", "denoising"):
        raise HeadscopeError(f"Unknown direction '{direction}'; use noising or denoising.")
    cost = cost if cost is not None else Cost()
    base_side, src_side = ("clean", "corrupt") if direction == "noising" else ("corrupt", "clean")
    by_sender_layer: dict[int, dict[tuple[int, int], list]] = {}
    for s, r in paths:
        by_sender_layer.setdefault(s[0], {}).setdefault(tuple(s), []).append(r)
    out: dict[tuple, Tensor] = {}
    if baseline is not None:
        for k in ("clean", "corrupt", "clean_logit_diff", "corrupt_logit_diff"):
            baseline.setdefault(k, torch.full((n_pairs,), torch.nan, dtype=torch.float64))
    ctx = {  # what step (2) reads besides the batch
        "model": model,
        "metric": metric,
        "base_side": base_side,
        "by_sender_layer": by_sender_layer,
        "freeze_mlps": freeze_mlps,
        "sender_position": sender_position,
        "t": t,
        "cost": cost,
    }
    for batch in batches:
        b, n = batch.mask.shape
        per = jobs_per_forward(b, n, rows_per_forward)
        cached = {
            p: run_cached(model, batch, p, metric, ("z",), freeze_mlps, cost)
            for p in ("clean", "corrupt")
        }
        if baseline is not None:
            for p, c in cached.items():
                baseline[p][batch.index] = c.metric.double().cpu()
                baseline[f"{p}_logit_diff"][batch.index] = c.logit_diff.double().cpu()
        base = cached[base_side]
        got = _step2(ctx, batch, cached, per)
        inputs = got.pop("inputs")
        # step 3, single receivers: every job of one receiver layer and kind shares forwards
        singles: dict[tuple[int, str], list[tuple]] = {}
        groups: dict[ReceiverGroup, list[tuple]] = {}
        for s, r in paths:
            if isinstance(r, ReceiverGroup):
                groups.setdefault(r, []).append((tuple(s), r))
            elif r.kind != "logits":
                singles.setdefault((r.layer, STAGE[r.kind]), []).append((tuple(s), r))
        jobs = [(lr, keys) for (lr, _), keys in sorted(singles.items())]
        jobs += [(g.layer, keys) for g, keys in groups.items()]

        def step3(chunk: list, batch=batch, inputs=inputs) -> dict:
            return {"handler": _edits_handler(_receiver_edits(batch, chunk, inputs))}

        for lr, keys in jobs:
            for chunk, hidden in forwards(
                model, batch.tokens(base_side), batch.mask, keys, per, step3,
                layer=lr, kept=base.blocks, output="hidden",
            ):  # fmt: skip
                k = len(chunk)
                cost.add(k * b, model.n_layers - lr)
                m = read_rows(model, metric, hidden, batch, k).view(k, b)
                for j, key in enumerate(chunk):
                    got[key] = m[j]
        for key, m in got.items():
            if key not in out:
                out[key] = torch.full((n_pairs,), torch.nan, dtype=torch.float64)
            out[key][batch.index] = m.double().cpu()
        if on_progress is not None:
            on_progress(len(batch.index))
    return {(tuple(s), r): out[(tuple(s), r)] for s, r in paths if (tuple(s), r) in out}


def _receiver_edits(batch, chunk: list, inputs: dict) -> list[Edit]:
    """Step (3)'s edits for a chunk of (sender, receiver) jobs of one receiver layer: singles, one
    Edit with a head per row; a group, one Edit per member."""
    b = len(batch.index)
    k = len(chunk)
    edits = []
    for r in members(chunk[0][1]) if isinstance(chunk[0][1], ReceiverGroup) else [None]:
        rs = [key[1] for key in chunk] if r is None else [r] * k
        edits.append(
            Edit(
                rs[0].layer,
                STAGE[rs[0].kind],
                job_rows([x.head for x in rs], b),
                torch.cat([position_masks(batch, x.position)[0][1] for x in rs]),
                torch.cat([inputs[(key[0], x)] for key, x in zip(chunk, rs, strict=True)]),
            )  # source: [k*b, pos, dim]
        )
    return edits


def _step2(ctx: dict, batch, cached, per) -> dict:
    """Step (2) for every sender: ``{(sender, logits): metric [b]}`` and, under ``"inputs"``,
    ``{(sender, head receiver): its input [b, pos, dim]}`` (a group's members each)."""
    model, metric, base_side, t, cost = (
        ctx[k] for k in ("model", "metric", "base_side", "t", "cost")
    )
    by_sender_layer, freeze_mlps = ctx["by_sender_layer"], ctx["freeze_mlps"]
    sender_position = ctx["sender_position"]
    b, n = batch.mask.shape
    base = cached[base_side]
    src = cached["corrupt" if base_side == "clean" else "clean"]
    (_, s_where), *_ = position_masks(batch, sender_position)  # [b, pos]
    got: dict = {}
    inputs: dict = {}

    def receivers(by_sender: dict, chunk: list) -> tuple[set, bool, int | None]:
        """The head receivers of a chunk of senders, whether one is ``logits``, and the layer
        after which the forward may stop (None: it runs to the logits)."""
        targets = {r for s in chunk for r in by_sender[s]}
        heads_r = {m for r in targets for m in members(r) if m.kind != "logits"}
        logits = any(not isinstance(r, ReceiverGroup) and r.kind == "logits" for r in targets)
        return heads_r, logits, None if logits else max(r.layer for r in heads_r)

    for ls, by_sender in sorted(by_sender_layer.items()):
        srcz = src.acts[ls]["z"]
        record: dict[int, dict[str, Tensor]] = {}

        def setup(chunk: list, ls=ls, by_sender=by_sender, srcz=srcz, record=record) -> dict:
            heads_r, logits, stop = receivers(by_sender, chunk)
            heads = job_rows([h for _, h in chunk], b)  # [k*b]
            rows = torch.arange(b).repeat(len(chunk))
            source = head_slice(srcz, "z", rows.to(srcz.device), heads.to(srcz.device))
            edit = Edit(ls, "z", heads, s_where.repeat(len(chunk), 1), source, t)
            record.clear()
            layers = {r.layer for r in heads_r}
            return {
                "handler": _frozen_handler(base, len(chunk), edit, record, layers, stop),
                "output": "hidden" if logits else None,
            }

        def freeze(k: int):
            return model.mlp_outputs(frozen=base.mlp, repeat=k) if freeze_mlps else None

        for chunk, hidden in forwards(
            model, batch.tokens(base_side), batch.mask, sorted(by_sender), per, setup,
            layer=ls, kept=base.blocks, context=freeze if freeze_mlps else None,
        ):  # fmt: skip
            k = len(chunk)
            _, logits, stop = receivers(by_sender, chunk)
            cost.add(k * b, (model.n_layers if stop is None else stop + 1) - ls)
            m = read_rows(model, metric, hidden, batch, k).view(k, b) if logits else None
            for j, s in enumerate(chunk):
                for r in by_sender[s]:
                    if not isinstance(r, ReceiverGroup) and r.kind == "logits":
                        got[(s, r)] = m[j]
                        continue
                    for x in members(r):
                        inputs[(s, x)] = record[x.layer][STAGE[x.kind]][j * b : (j + 1) * b, x.head]
    got["inputs"] = inputs
    return got
