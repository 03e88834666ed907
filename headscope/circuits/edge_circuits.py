"""Circuits of the edge graph and how faithful they are (docs/discover.md).

A circuit is a set of edges (a boolean ``[writer, reader]`` matrix inside
:attr:`~headscope.circuits.edge_graph.EdgeGraph.valid`). Running it: the clean prompts, with every
edge *outside* it cut, its writer's value replaced by the corrupt prompt's (``ablation="corrupt"``,
the default), by the writer's mean over the corrupt prompts at that position (``"mean"``), or by
zero (``"zero"``) (:class:`~headscope.circuits.edge_runs.Cut`: one forward per batch).

Faithfulness, as the MIB circuit track defines it (Mueller et al. 2025): with ``m(C)`` the metric
averaged over pairs,

    f(C) = (m(C) - m(empty)) / (m(full) - m(empty))

(``m(full)``: the clean run, every edge kept; ``m(empty)``: every edge cut). The curve is ``f`` of
the top edges by ``|score|`` at log-spaced sizes (:func:`fractions`: 0.1% to 100% of the edges);
**CPR** is the area under it and **CMD** the area between it and 1 (``|1 - f|``), both by the
trapezoid rule over the share of edges kept, from the empty circuit (share 0, ``f = 0``) to the
full one. Random circuits of the same sizes (each draw a random order of the edges, its circuits
nested as the top edges' are) give the curve and the areas a ranking must beat. Intervals:
percentile bootstrap over pairs (the same resampled pairs for every circuit of a draw).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from headscope.circuits.edge_graph import anatomy, graph_of
from headscope.circuits.edge_runs import Cut, EdgeForward, writer_major
from headscope.circuits.edge_scores import record
from headscope.effects.patching import Batch, read_rows
from headscope.errors import HeadscopeError
from headscope.uncertainty import LEVEL, draw_weights

ABLATIONS = ("corrupt", "mean", "zero")


def fractions(n: int = 20, smallest: float = 0.001) -> list[float]:
    """``n`` log-spaced shares of the edges from ``smallest`` to 1 (the curve's sizes).

    >>> [round(f, 4) for f in fractions(4)]
    [0.001, 0.01, 0.1, 1.0]
    """
    if n < 2 or not 0 < smallest < 1:
        raise HeadscopeError(f"A curve needs at least 2 sizes in (0, 1]; got {n} from {smallest}.")
    return [float(x) for x in np.logspace(np.log10(smallest), 0, n)]


def check_fraction(f: float) -> None:
    if not 0 <= f <= 1:
        raise HeadscopeError(
            f"A circuit size is a share of the edges between 0 and 1 (0% to 100%); got {f}."
        )


def top_edges(scores: Float[Tensor, "writer reader"], valid: Tensor, k: int) -> Tensor:
    """The ``k`` edges with the largest ``|score|`` as a circuit (ties: the earlier edge, reader by
    reader, as :meth:`~headscope.circuits.edge_graph.EdgeGraph.edges` orders them)."""
    order = ranking(scores, valid)
    return circuit_of(order[:k], valid)


def ranking(scores: Float[Tensor, "writer reader"], valid: Tensor) -> Tensor:
    """Every edge, largest ``|score|`` first, as flat indices into ``[writer, reader]``."""
    flat = valid.T.reshape(-1).nonzero()[:, 0]  # reader-major edge order
    n_w, n_r = valid.shape
    cells = (flat % n_w) * n_r + flat // n_w  # reader-major -> [writer, reader] flat index
    s = scores.reshape(-1)[cells].abs().nan_to_num(nan=-1.0)
    return cells[torch.sort(-s, stable=True).indices]


def circuit_of(cells: Tensor, valid: Tensor) -> Bool[Tensor, "writer reader"]:
    c = torch.zeros(valid.numel(), dtype=torch.bool)
    c[cells] = True
    return c.view(valid.shape)


def writer_means(model, batches: Sequence[Batch], side: str = "corrupt") -> Tensor:
    """Each writer's mean over ``side``'s prompts at each position (``[pos, writer, d_model]``,
    over the prompts long enough to have that position)."""
    sums, counts = None, None
    for batch in batches:
        w, _ = record(model, batch, side, "logit_diff")
        m = batch.mask.to(w.device)[:, :, None, None].to(w.dtype)
        s, c = (w * m).sum(0), m.sum(0)
        if sums is None:
            sums, counts = s, c
        else:
            n = max(sums.shape[0], s.shape[0])
            sums = _pad(sums, n) + _pad(s, n)
            counts = _pad(counts, n) + _pad(c, n)
    return sums / counts.clamp(min=1)


def _pad(x: Tensor, n: int) -> Tensor:
    return torch.cat([x, x.new_zeros(n - x.shape[0], *x.shape[1:])]) if x.shape[0] < n else x


def circuit_metrics(
    model,
    batches: Sequence[Batch],
    n_pairs: int,
    metric: str,
    circuits: Sequence[Bool[Tensor, "writer reader"]],
    ablation: str = "corrupt",
    means: Tensor | None = None,
    on_progress: Callable[[int], None] | None = None,
    kv_mode: str = "group",
) -> Float[Tensor, "circuit pair"]:
    """The metric of each circuit on every pair (float64): the clean prompts with every edge
    outside the circuit cut (module docstring)."""
    if ablation not in ABLATIONS:
        raise HeadscopeError(f"Unknown ablation '{ablation}'; use {', '.join(ABLATIONS)}.")
    an, graph = anatomy(model), graph_of(model, kv_mode)
    valid = graph.valid
    for c in circuits:
        if c.shape != valid.shape or (c & ~valid).any():
            raise HeadscopeError(
                f"A circuit of {model.name} is a [writer, reader] mask of its "
                f"{graph.n_edges} edges ({graph.n_writers} x {graph.n_readers})."
            )
    if ablation == "mean" and means is None:
        means = writer_means(model, batches)
    out = torch.full((len(circuits), n_pairs), torch.nan, dtype=torch.float64)
    for batch in batches:
        b, n = batch.mask.shape
        if ablation == "corrupt":  # the empty circuit reads only the corrupt run: it is that run
            repl, m_corrupt = record(model, batch, "corrupt", metric)
        else:
            d = model.hf.config.hidden_size if means is None else means.shape[-1]
            repl = torch.zeros(b, n, graph.n_writers, d, dtype=model.dtype, device=model.device)
            if ablation == "mean":
                k = min(n, means.shape[0])
                repl[:, :k] = means[:k].to(repl)
        repl = writer_major(repl)
        space = None  # one buffer for every circuit's differences
        for i, c in enumerate(circuits):
            if ablation == "corrupt" and not c.any():
                got = m_corrupt
            elif c.sum() == graph.n_edges:  # nothing cut: the clean run itself, no hooks
                hidden = model.run(batch.clean, batch.mask, output="hidden")
                got = read_rows(model, metric, hidden, batch, 1)
            else:
                cut = Cut(valid & ~c, repl, space)
                with EdgeForward(model, an, graph, cut=cut)():
                    hidden = model.run(batch.clean, batch.mask, output="hidden")
                got = read_rows(model, metric, hidden, batch, 1)
                space = cut.workspace
            out[i, batch.index] = got.double().cpu()
            if on_progress is not None:
                on_progress(1)
    return out


def _sizes(n_edges: int, shares: Sequence[float]) -> list[int]:
    """Edges kept at each share: at least one for a share above 0."""
    return [max(1, round(s * n_edges)) if s > 0 else 0 for s in shares]


def curve_runs(n_edges: int, shares: Sequence[float], n_random: int) -> int:
    """The circuits :func:`faithfulness_curve` runs per batch: the empty and the full circuit
    once, and every order's circuit at each share strictly between them."""
    inner = sum(0 < k < n_edges for k in _sizes(n_edges, shares))
    return 2 + inner * (1 + n_random)


def areas(shares: Sequence[float], f: Sequence[float]) -> tuple[float, float]:
    """``(CPR, CMD)``: the areas under ``f`` and under ``|1 - f|`` over the shares of edges kept
    (trapezoids, from share 0 where ``f = 0``).

    >>> areas([0.5, 1.0], [1.0, 1.0])  # every circuit as good as the model from half the edges
    (0.75, 0.25)
    """
    x = np.concatenate([[0.0], np.asarray(shares, dtype=float)])
    y = np.concatenate([[0.0], np.asarray(f, dtype=float)])
    return float(np.trapezoid(y, x)), float(np.trapezoid(np.abs(1 - y), x))


def faithfulness_curve(
    model,
    batches: Sequence[Batch],
    n_pairs: int,
    metric: str,
    scores: Float[Tensor, "writer reader"],
    shares: Sequence[float] | None = None,
    n_random: int = 10,
    ablation: str = "corrupt",
    seed: int = 0,
    resamples: int = 1000,
    level: float = LEVEL,
    on_progress: Callable[[int], None] | None = None,
    kv_mode: str = "group",
) -> dict:
    """The faithfulness curve of the top edges by ``|scores|`` and of ``n_random`` random orders
    (module docstring). Returns ``{"shares", "n_edges", "f" [draw, size] (draw 0: the ranking),
    "f_low", "f_high" (the ranking's interval per size), "cpr", "cmd" (each ``(value, low,
    high)``), "random_cpr", "random_cmd" (per draw), "m_full", "m_empty" (per pair),
    "metrics" [draw, size, pair]}``."""
    graph = graph_of(model, kv_mode)
    valid = graph.valid
    shares = list(shares) if shares is not None else fractions()
    for s in shares:
        check_fraction(s)
    n_edges = _sizes(graph.n_edges, shares)
    rng = np.random.default_rng(seed)
    flat = ranking(scores, valid)
    orders = [flat] + [flat[torch.from_numpy(rng.permutation(len(flat)))] for _ in range(n_random)]
    # every order's circuit of no edge is the empty one, of every edge the full one: run once
    circuits = [torch.zeros_like(valid), valid.clone()]  # empty, full
    at = []  # [draw][size] -> index into circuits
    for order in orders:
        at.append([])
        for k in n_edges:
            if 0 < k < graph.n_edges:
                circuits.append(circuit_of(order[:k], valid))
            at[-1].append(len(circuits) - 1 if 0 < k < graph.n_edges else int(k > 0))
    m = circuit_metrics(
        model,
        batches,
        n_pairs,
        metric,
        circuits,
        ablation,
        on_progress=on_progress,
        kv_mode=kv_mode,
    )  # [circuit, pair]
    empty, full = m[0], m[1]
    per = m[torch.tensor(at)]  # [draw, size, pair]
    if (full.mean() - empty.mean()).abs() < 1e-12:
        raise HeadscopeError(
            "The full model and the empty circuit score the same on these pairs, so "
            "faithfulness is undefined; choose pairs the metric separates."
        )
    f = (per.mean(-1) - empty.mean()) / (full.mean() - empty.mean())  # [draw, size]
    cpr, cmd = zip(*(areas(shares, row.tolist()) for row in f), strict=True)
    out = {
        "shares": shares,
        "n_edges": n_edges,
        "f": f.numpy(),
        "m_full": full,
        "m_empty": empty,
        "metrics": per,
        "random_cpr": np.array(cpr[1:]),
        "random_cmd": np.array(cmd[1:]),
    }
    if resamples:
        w = draw_weights(n_pairs, resamples, seed) / n_pairs  # [resample, pair]
        me, mf = w @ empty, w @ full  # [resample]
        fb = (per[0] @ w.T - me) / (mf - me)  # [size, resample]
        q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
        lo, hi = torch.nanquantile(fb, q, dim=1)
        out["f_low"], out["f_high"] = lo.numpy(), hi.numpy()
        boot = [areas(shares, fb[:, j].tolist()) for j in range(resamples)]
        for i, name in enumerate(("cpr", "cmd")):
            v = torch.tensor([x[i] for x in boot], dtype=torch.float64)
            a, z = torch.nanquantile(v, q)
            out[name] = ((cpr, cmd)[i][0], float(a), float(z))
    else:
        out["f_low"] = out["f_high"] = np.full(len(shares), np.nan)
        out["cpr"], out["cmd"] = (cpr[0], np.nan, np.nan), (cmd[0], np.nan, np.nan)
    return out
