"""A score for every edge of the graph (:mod:`headscope.circuits.edge_graph`) on a task's pairs:
edge attribution patching (EAP), its integrated-gradients form (EAP-IG), and exact edge patching
for chosen edges (docs/discover.md).

Directions, as in patching: *noising* starts from the clean prompt and brings in the corrupt
one's value, *denoising* the reverse. For an edge ``w -> r`` and a pair, with ``Δ_w = w(source)
- w(base)`` summed over positions:

* **exact**: the metric with ``r`` reading ``base stream - (w(base) - w(source))``, every other
  reader as in the base run, minus the base metric (:class:`~headscope.circuits.edge_runs.Single`);
* **eap** (Syed et al. 2023): ``Δ_w · d metric / d x_r`` in the base run, the first-order
  estimate of *exact* (its derivative in a dose ``t`` at 0); a forward of each prompt and one
  backward. Denoising with the gradient on the corrupt run is transformer-lens's
  ``attribution_patch`` convention;
* **eap-ig** (Hanna et al. 2024, "inputs" form): ``Δ_w`` times the gradient averaged over
  ``steps`` forwards whose embeddings are ``e(corrupt) + k/steps (e(clean) - e(corrupt))``, ``k =
  0 .. steps - 1`` (a left Riemann sum of the integral along the straight line between the two
  prompts' embeddings, their code's convention). The same gradients serve both directions (the
  sign of ``Δ`` differs).

Scores are per pair (``[pair, writer, reader]``, float64, NaN off the graph), so every summary can
carry an interval over pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from headscope.circuits.edge_graph import EdgeGraph, anatomy, graph_of
from headscope.circuits.edge_runs import EdgeForward, Single
from headscope.effects.loop import forwards, job_rows, jobs_per_forward
from headscope.effects.patch_attribution import no_parameter_grads
from headscope.effects.patching import Batch, position_masks, read_rows
from headscope.errors import HeadscopeError

METHODS = ("eap", "eap-ig", "exact")
DIRECTIONS = ("noising", "denoising")


def check_method(method: str) -> None:
    if method not in METHODS:
        raise HeadscopeError(f"Unknown method '{method}'; use {', '.join(METHODS)}.")


def check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise HeadscopeError(f"Unknown direction '{direction}'; use noising or denoising.")


def record(model, batch: Batch, side: str, metric: str, keep: dict | None = None):
    """One unpatched run of ``side``: ``(writers [b, pos, writer, d_model], metric [b])``;
    ``keep`` (a dict) receives each block's output."""
    ef = EdgeForward(model, anatomy(model), graph_of(model), record=True)
    with ef():
        hidden = model.run(batch.tokens(side), batch.mask, output="hidden", keep_blocks=keep)
    return ef.writers, read_rows(model, metric, hidden, batch, 1)


def _sides(direction: str) -> tuple[str, str]:
    return ("clean", "corrupt") if direction == "noising" else ("corrupt", "clean")


class GradSum:
    """Every reader's gradient summed over the passes it hears (a hook for
    :class:`~headscope.circuits.edge_runs.EdgeForward`): ``[b, reader, pos * d_model]``."""

    def __init__(self, graph: EdgeGraph, weight: float = 1.0):
        self.graph, self.weight, self.sum = graph, weight, None

    def __call__(self, readers: slice | int, g: Tensor) -> None:
        if isinstance(readers, int):  # [b, pos, d]
            g = g[None]
            readers = slice(readers, readers + 1)
        n, b, p, d = g.shape  # reader-major
        if self.sum is None:
            self.sum = g.new_zeros(b, self.graph.n_readers, p * d)
        self.sum[:, readers].view(b, n, p, d).add_(g.transpose(0, 1), alpha=self.weight)

    def scores(self, delta: Float[Tensor, "b pos writer d_model"], chunks: int = 6) -> Tensor:
        """``[b, writer, reader]`` (float64): ``Δ_w · g_r`` summed over positions, every edge (0
        off the graph). The readers go in ``chunks`` runs of consecutive readers, each one batched
        product over the writers its last reader reads (a few large products are faster than one
        per group of readers; the cells above a reader's staircase are computed and zeroed)."""
        graph = self.graph
        b, p, n_w, d = delta.shape
        dt = delta.permute(0, 2, 1, 3).reshape(b, n_w, p * d).to(self.sum.dtype)  # [b, W, pos*d]
        out = torch.zeros(b, n_w, graph.n_readers, dtype=torch.float64)
        n_in = graph.writers_before().tolist()
        step = -(-graph.n_readers // chunks)
        for start in range(0, graph.n_readers, step):
            stop = min(start + step, graph.n_readers)
            k = n_in[stop - 1]  # the most any reader of the run reads
            got = torch.bmm(dt[:, :k], self.sum[:, start:stop].transpose(1, 2))  # [b, k, n]
            out[:, :k, start:stop] = got.double().cpu()
        return out.masked_fill_(~graph.valid, 0.0)

    def scores_at(
        self, delta: Float[Tensor, "b pos writer d_model"], where: Bool[Tensor, "b pos"]
    ) -> Tensor:
        """:meth:`scores` at the positions ``where`` only (each edge at the positions a reader
        reads its writer there): one gathered product when every row has one position."""
        b, p, n_w, d = delta.shape
        where = where.to(delta.device)
        if not (where.sum(1) == 1).all():
            return self.scores(delta * where[:, :, None, None].to(delta.dtype))
        rows, at = torch.arange(b), where.int().argmax(1)
        dt = delta[rows, at].to(self.sum.dtype)  # [b, writer, d]
        g = self.sum.view(b, self.graph.n_readers, p, d)[rows, :, at]  # [b, reader, d]
        out = torch.bmm(dt, g.transpose(1, 2)).double().cpu()
        return out.masked_fill_(~self.graph.valid, 0.0)


def _grad_pass(model, ef: EdgeForward, batch: Batch, side: str, metric: str) -> None:
    with no_parameter_grads(model), ef():
        hidden = model.run(batch.tokens(side), batch.mask, output="hidden", grad=True)
        read_rows(model, metric, hidden, batch, 1, grad=True).sum().backward()


def attribution(
    model,
    batches: Sequence[Batch],
    n_pairs: int,
    metric: str,
    method: str = "eap",
    direction: str = "noising",
    steps: int = 5,
    on_progress: Callable[[int], None] | None = None,
    at: dict | None = None,
    kv_mode: str = "group",
) -> Float[Tensor, "pair writer reader"]:
    """Every edge's ``eap`` or ``eap-ig`` score on every pair (module docstring). Cost per batch:
    EAP, one forward of the source and one forward and backward of the base; EAP-IG, a forward of
    the clean prompt and ``steps`` forwards and backwards (the first of them the corrupt prompt's,
    which also records its writers); then a few batched products. ``at``: a dict whose keys name
    positions of the task (``IO``, ``END``, ``S1+1``: :func:`position_masks`); each receives the
    same score at that position only, ``[pair, writer, reader]`` (the positions' scores and the
    rest add up to the pooled one). ``kv_mode``: keys and values read per KV head (``group``) or
    per query head (``head``: :func:`~headscope.circuits.edge_graph.graph_of`)."""
    check_method(method)
    check_direction(direction)
    if method == "exact":
        raise HeadscopeError("Exact scores are for chosen edges: use exact_edges().")
    if method == "eap-ig" and steps < 1:
        raise HeadscopeError(f"EAP-IG needs at least one step; got steps={steps}.")
    an, graph = anatomy(model), graph_of(model, kv_mode)
    out = torch.full((n_pairs, graph.n_writers, graph.n_readers), torch.nan, dtype=torch.float64)
    valid = graph.valid
    base_side, src_side = _sides(direction)
    named = list(at or ())
    for name in named:
        at[name] = torch.full_like(out, torch.nan)
    for batch in batches:
        wheres = {name: position_masks(batch, name)[0][1] for name in named}
        if method == "eap":
            src, _ = record(model, batch, src_side, metric)
            grads = GradSum(graph)
            ef = EdgeForward(model, an, graph, record=True, on_grad=grads)
            _grad_pass(model, ef, batch, base_side, metric)
            base = ef.writers
        else:  # step 0 is the corrupt prompt itself, and its pass records the corrupt writers
            grads = GradSum(graph, 1.0 / steps)
            ef = EdgeForward(model, an, graph, record=True, on_grad=grads)
            _grad_pass(model, ef, batch, "corrupt", metric)
            corrupt = ef.writers
            clean, _ = record(model, batch, "clean", metric)
            for k in range(1, steps):
                embed = corrupt[:, :, 0] + (k / steps) * (clean[:, :, 0] - corrupt[:, :, 0])
                ef = EdgeForward(model, an, graph, on_grad=grads, embed=embed)
                _grad_pass(model, ef, batch, "clean", metric)
            src, base = (corrupt, clean) if direction == "noising" else (clean, corrupt)
        got = grads.scores(src - base)
        out[batch.index] = torch.where(valid, got, torch.nan)
        for name, where in wheres.items():
            at[name][batch.index] = torch.where(
                valid, grads.scores_at(src - base, where), torch.nan
            )
        if on_progress is not None:
            on_progress(len(batch.index))
    return out


def exact_edges(
    model,
    batches: Sequence[Batch],
    n_pairs: int,
    metric: str,
    edges: Sequence[tuple[int, int]],
    direction: str = "noising",
    t: float = 1.0,
    rows_per_forward: int | None = None,
    on_progress: Callable[[int], None] | None = None,
    position: str | None = None,
    kv_mode: str = "group",
) -> Float[Tensor, "pair edge"]:
    """Each edge ``(writer, reader)`` patched alone: the change in the metric from the base run,
    per pair (float64). ``t`` < 1 moves the reader's input only that fraction of the way (a dose,
    for first-order checks); ``position`` (a named position of the task, as in
    :func:`position_masks`): the reader reads the other run's writer at that position only."""
    check_direction(direction)
    an, graph = anatomy(model), graph_of(model, kv_mode)
    n_in = graph.writers_before()
    for w, r in edges:
        if not (0 <= r < graph.n_readers and 0 <= w < int(n_in[r])):
            raise HeadscopeError(
                f"({w}, {r}) is not an edge of {model.name}'s graph ({graph.n_writers} writers, "
                f"{graph.n_readers} readers); a reader reads only writers before it."
            )
    base_side, src_side = _sides(direction)
    out = torch.full((n_pairs, len(edges)), torch.nan, dtype=torch.float64)
    by_layer: dict[int, list[int]] = {}
    for j, (_, r) in enumerate(edges):
        by_layer.setdefault(min(graph.reader_layer(r), graph.n_layers - 1), []).append(j)
    for batch in batches:
        b, n = batch.mask.shape
        kept: dict[int, Tensor] = {}
        base, m_base = record(model, batch, base_side, metric, keep=kept)
        src, _ = record(model, batch, src_side, metric)
        ef = EdgeForward(model, an, graph)
        per = jobs_per_forward(b, n, rows_per_forward)

        keep = 1.0
        if position is not None:
            keep = position_masks(batch, position)[0][1][:, :, None].to(base)  # [b, pos, 1]

        def setup(chunk: list, base=base, src=src, b=b, ef=ef, keep=keep) -> dict:
            readers = job_rows([edges[j][1] for j in chunk], b)
            delta = torch.cat(
                [(base[:, :, edges[j][0]] - src[:, :, edges[j][0]]) * keep for j in chunk]
            )
            ef.single = Single(readers, t * delta)
            return {}

        for layer, jobs in sorted(by_layer.items()):
            for chunk, hidden in forwards(
                model, batch.tokens(base_side), batch.mask, jobs, per, setup,
                layer=layer, kept=kept, output="hidden", context=lambda k, ef=ef: ef(),
            ):  # fmt: skip
                m = read_rows(model, metric, hidden, batch, len(chunk)).view(len(chunk), b)
                for i, j in enumerate(chunk):
                    out[batch.index, j] = (m[i] - m_base).double().cpu()
        if on_progress is not None:
            on_progress(len(batch.index))
    return out


SATURATED = 0.9  # attention mass on one key above which a query is saturated (AtP*, Kramár 2024)


def saturation(
    model, batches: Sequence[Batch], side: str = "clean", threshold: float = SATURATED
) -> Float[Tensor, "layer head"]:
    """Each head's share of real query positions after the first (over ``side``'s prompts) whose
    attention puts more than ``threshold`` on one key: where a first-order estimate through the
    softmax can fail (the pattern barely moves until it flips). The first query sees one key and
    is left out."""
    from headscope.effects.stages import explicit_handler

    hits = torch.zeros(model.n_layers, model.n_heads, dtype=torch.float64)
    count = 0.0
    for batch in batches:
        acts: dict = {}
        model.run(batch.tokens(side), batch.mask, handler=explicit_handler(acts, ("pattern",)))
        real = batch.mask.to(model.device).clone()
        real[:, 0] = False  # one key to attend to: saturated by construction
        real = real[:, None, :]  # [b, 1, query]
        for la in range(model.n_layers):
            top = acts[la]["pattern"].amax(-1) > threshold  # [b, head, query]
            hits[la] += (top & real).sum((0, 2)).double().cpu()
        count += float(real.sum())
    return hits / count
