"""``headscope.discover(model, task, ...)`` and ``headscope discover``: find a task's circuit in the
edge graph (docs/discover.md). Every edge scored (EAP, EAP-IG), the top edges by each score and any
named ones patched exactly, the faithfulness curve of the top edges against random circuits, one
circuit saved.

    result = headscope.discover(model, "ioi", methods=("eap", "eap-ig"), exact=100)
    result.edges.sort_values("eap_ig", key=abs).tail()   # a row per edge
    save_discovery(result, "runs/ioi-edges")

The run directory (written whole, the ``--force`` rules of :mod:`headscope.rundir.store`)::

    OUT/
      edges.csv        a row per edge: writer, reader, its kind and layers, each score's mean
                       over pairs with its interval (eap, eap_ig, exact where measured), rank
      nodes.csv        a row per writer: the sum of its edges' scores per method (its node score),
                       with intervals; beside a head, the scan's pattern scores with --scan
      edges_at.csv     with --positions: a row per edge and named position, each score there (the
                       top 10 per position by the ranking score patched exactly there)
      readers.csv      a row per reader: the sum of the scores of the edges into it; for a query
                       or key, patching it whole estimated by attribution (atp) and by AtP*'s
                       fix for saturated attention (atp_qk), the top --exact-readers exactly
      curve.csv        the faithfulness curve: a row per (order, size): share and number of
                       edges kept, f with its interval (the ranking), every random order's f
      agreement.csv    per pair of scores, over the exactly patched edges: Spearman rho with its
                       interval, the top-k overlap against chance (k: 20, or half the edges
                       patched when fewer than 40, so that the overlap can miss)
      circuit.json     the chosen circuit: its edges with their scores, its share and its f
      baseline.csv     clean and corrupt metric with intervals; share correct
      tokens.jsonl     one line per pair: clean and corrupt ids, answer and wrong, positions
      held_out.jsonl   with --held-out N: the pairs the curve and the circuit were measured on
      metadata.json    model, source, task, settings, versions, timings; CPR and CMD with
                       intervals and against the random orders
      curve.png        the curve, the random orders' curves behind it
      circuit.png      the chosen circuit drawn from edges.csv (layers bottom to top)
      report.html      the page (:mod:`headscope.report.discover_page`), from the files above

Importing this module loads no torch (``headscope discover --help`` is instant).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from headscope.apps.runs import check_model, task_run_to_dir
from headscope.apps.settings import CIRCUIT_PAIRS, DiscoverSettings
from headscope.result import progress, timed

if TYPE_CHECKING:  # pragma: no cover - pandas is imported where a table is made or read
    import pandas as pd


@dataclass
class DiscoverResult:
    """What :func:`discover` returns (and :func:`load_discovery` reads back, without
    ``per_pair``: ``{method: [pair, writer, reader]}``, ``exact`` ``[pair, edge]``)."""

    task: str
    model: str
    metric: str
    edges: pd.DataFrame
    nodes: pd.DataFrame
    readers: pd.DataFrame
    curve: pd.DataFrame
    agreement: pd.DataFrame
    circuit: dict
    baseline: pd.DataFrame
    tokens: object
    metadata: dict = field(default_factory=dict)
    per_pair: dict = field(default_factory=dict, repr=False)
    held_out: object = None  # the pairs the curve was measured on, with --held-out
    edges_at: pd.DataFrame | None = None  # with positions: a row per edge and position


def column(method: str) -> str:
    """A score's column name (``eap-ig`` -> ``eap_ig``)."""
    return method.replace("-", "_")


def mean_ci(x, resamples: int, level: float, seed: int, chunk: int = 4096):
    """``(mean, low, high)`` over pairs of every column of ``x`` (``[pair, n]``, float64): the
    percentile bootstrap of :func:`~headscope.effects.patch_table.mean_interval`, in chunks."""
    import numpy as np
    import torch

    from headscope.uncertainty import draw_weights

    x = x.double()
    mean = x.mean(0).numpy()
    if not resamples:
        nan = np.full(x.shape[1], np.nan)
        return mean, nan, nan.copy()
    w = draw_weights(x.shape[0], resamples, seed) / x.shape[0]
    a = (1 - level) / 2
    q = torch.tensor([a, 1 - a], dtype=torch.float64)
    lo, hi = [], []
    for start in range(0, x.shape[1], chunk):
        b = torch.quantile(w @ x[:, start : start + chunk], q, dim=0)
        lo.append(b[0])
        hi.append(b[1])
    return mean, torch.cat(lo).numpy(), torch.cat(hi).numpy()


def discover(
    model,
    task,
    config: DiscoverSettings | None = None,
    *,
    pattern: pd.DataFrame | None = None,
    say: Callable[[str], None] | None = None,
    **settings,
) -> DiscoverResult:
    """Score every edge of ``model``'s graph on ``task`` and find its circuit (module docstring).
    ``config`` or keyword ``settings``: the fields of
    :class:`~headscope.apps.settings.DiscoverSettings`; ``pattern``: a scan's pattern scores put
    beside the head nodes; ``say`` hears progress lines."""
    import torch

    from headscope.circuits import edge_circuits as ec
    from headscope.circuits import edge_scores as es
    from headscope.circuits.edge_graph import anatomy, graph_of
    from headscope.effects.patch_attribution import qk_fixed
    from headscope.effects.patch_table import baseline_table
    from headscope.effects.patching import baseline_metrics, make_batches, position_masks
    from headscope.probes.kits import held_out_task, tokenize_task
    from headscope.rundir.record import run_record

    config = DiscoverSettings.configure(config, settings)
    say = say or (lambda _m: None)
    timings: dict[str, float] = {}
    check_model(model)
    anatomy(model)  # one line for a family the graph does not know, before any forward
    graph = graph_of(model, config.kv_mode)
    named = [graph.edge_index(e) for e in config.edges]
    tt = tokenize_task(
        task, model, config.metric, config.n_pairs, config.seed, config.templates,
        draw=config.n_pairs or CIRCUIT_PAIRS,
    )  # fmt: skip
    batches = make_batches(tt, config.batch_size, model.pad_id)
    n, metric = len(tt), tt.metric
    held = curve_batches = None
    if config.held_out:
        held = held_out_task(task, model, tt, config.held_out, config.metric, config.seed,
                             config.templates)  # fmt: skip
        curve_batches = make_batches(held, config.batch_size, model.pad_id)
    n_curve, curve_batches = (len(held), curve_batches) if held else (n, batches)
    for name in config.positions:  # one line for a position the task does not name
        for bt in batches:
            position_masks(bt, name)
    b, level, seed = config.bootstrap, config.ci, config.seed
    with timed(timings, "baseline_s"):
        base = baseline_metrics(model, batches, n, metric)
    scores: dict[str, torch.Tensor] = {}
    at: dict[str, dict] = {}
    for m in config.methods:
        with (
            timed(timings, f"{column(m)}_s"),
            progress(n, f"{m} over {graph.n_edges} edges", say) as tick,
        ):
            at[m] = dict.fromkeys(config.positions)
            scores[m] = es.attribution(
                model, batches, n, metric, m, config.direction, config.steps, on_progress=tick,
                at=at[m], kv_mode=config.kv_mode,
            )  # fmt: skip
    valid = graph.valid
    means = {m: s.mean(0) for m, s in scores.items()}
    chosen: list[tuple[int, int]] = list(dict.fromkeys(named))
    for m in config.methods:
        order = ec.ranking(means[m], valid)[: config.exact]
        chosen += [(int(c) // graph.n_readers, int(c) % graph.n_readers) for c in order]
    chosen = list(dict.fromkeys(chosen))
    exact = None
    if chosen:
        with (
            timed(timings, "exact_s"),
            progress(n, f"exact patching of {len(chosen)} edges", say) as tick,
        ):
            exact = es.exact_edges(
                model, batches, n, metric, chosen, config.direction,
                rows_per_forward=None, on_progress=tick, kv_mode=config.kv_mode,
            )  # fmt: skip
    with timed(timings, "saturation_s"):
        sat = es.saturation(model, batches, "clean" if config.direction == "noising" else "corrupt")
    with timed(timings, "readers_s"), progress(n, "AtP* of every query and key", say) as tick:
        qk = qk_fixed(model, batches, n, metric, config.direction)
        tick(n)
    qk_exact = None
    if config.exact_readers:
        with timed(timings, "exact_readers_s"):
            qk_exact = exact_readers(model, batches, n, metric, qk, config)
    rank_by = "eap-ig" if "eap-ig" in scores else config.methods[0]
    exact_at: dict[str, tuple[list, torch.Tensor]] = {}
    for name in config.positions:
        top = ec.ranking(at[rank_by][name].mean(0), valid)[:EXACT_AT]
        pick = [(int(c) // graph.n_readers, int(c) % graph.n_readers) for c in top]
        with timed(timings, "exact_at_s"):
            exact_at[name] = (
                pick,
                es.exact_edges(
                    model,
                    batches,
                    n,
                    metric,
                    pick,
                    config.direction,
                    position=name,
                    kv_mode=config.kv_mode,
                ),  # fmt: skip
            )
    shares = ec.fractions(config.sizes, config.smallest)
    runs = ec.curve_runs(graph.n_edges, shares, config.n_random) * len(curve_batches)
    with timed(timings, "curve_s"), progress(runs, "faithfulness curve (forwards)", say) as tick:
        curve = ec.faithfulness_curve(
            model, curve_batches, n_curve, metric, means[rank_by], shares, config.n_random,
            config.ablation, seed, b, level, on_progress=tick, kv_mode=config.kv_mode,
        )  # fmt: skip
    k = max(1, round(config.circuit_share * graph.n_edges))
    circuit_mask = ec.top_edges(means[rank_by], valid, k)
    with timed(timings, "circuit_s"):
        m_c = ec.circuit_metrics(
            model, curve_batches, n_curve, metric, [circuit_mask], config.ablation,
            kv_mode=config.kv_mode,
        )[0]  # fmt: skip
    f_c = float(
        (m_c.mean() - curve["m_empty"].mean()) / (curve["m_full"].mean() - curve["m_empty"].mean())
    )
    edges = edge_table(graph, scores, chosen, exact, b, level, seed, sat)
    nodes = node_table(graph, scores, b, level, seed, pattern, sat)
    readers = reader_table(graph, scores, qk, qk_exact, b, level, seed, sat)
    edges_at = edges_at_table(graph, at, exact_at, b, level, seed) if config.positions else None
    circuit = circuit_record(
        graph, circuit_mask, means[rank_by], rank_by, config.circuit_share, f_c
    )
    meta = run_record(
        model,
        config,
        run_kind="discover",
        task=tt.name,
        task_provenance=tt.provenance,
        metric=metric,
        n_pairs=n,
        curve_pairs=n_curve,
        curve_on="held-out pairs" if held else "ranking pairs (in-sample)",
        n_edges=graph.n_edges,
        ranked_by=rank_by,
        cpr=list(curve["cpr"]),
        cmd=list(curve["cmd"]),
        random_cpr=[float(x) for x in curve["random_cpr"]],
        random_cmd=[float(x) for x in curve["random_cmd"]],
        cpr_rank_p=_rank_p(curve["cpr"][0], curve["random_cpr"], higher=True),
        cmd_rank_p=_rank_p(curve["cmd"][0], curve["random_cmd"], higher=False),
        gqa_group=model.n_heads // model.n_kv_heads,
        kv_mode=config.kv_mode,
        timings=timings,
    )
    return DiscoverResult(
        tt.name,
        model.name,
        metric,
        edges,
        nodes,
        readers,
        curve_table(curve, rank_by),
        agreement_table(graph, scores, chosen, exact, config, seed, edges),
        circuit,
        baseline_table(tt.name, metric, base, b, level, seed),
        tt,
        meta,
        {
            **scores,
            "exact": exact,
            "exact_edges": chosen,
            "curve": curve,
            "qk": qk,
            "qk_exact": qk_exact,
            "at": at,
            "exact_at": exact_at,
        },
        held,
        edges_at,
    )


def _rank_p(value: float, draws, higher: bool) -> float:
    """One-sided permutation p-value of ``value`` among random ``draws`` (NaN without draws)."""
    import numpy as np

    draws = np.asarray(draws, dtype=float)
    if not len(draws):
        return float("nan")
    as_good = (draws >= value) if higher else (draws <= value)
    return float((1 + as_good.sum()) / (1 + len(draws)))


# ------------------------------------------------------------------------------ the tables


def head_saturation(graph, name: str, sat) -> float:
    """The saturation of the head a writer or reader name belongs to (a KV head's: its query
    heads' largest); NaN for the embedding, an MLP, the logits."""
    import re

    if m := re.match(r"L(\d+)H(\d+)", name):
        return float(sat[int(m[1]), int(m[2])])
    if m := re.match(r"L(\d+)KV(\d+)", name):
        g = graph.n_heads // graph.n_kv
        return float(sat[int(m[1]), int(m[2]) * g : (int(m[2]) + 1) * g].max())
    return float("nan")


def edge_table(
    graph, scores: dict, chosen, exact, resamples, level, seed, sat=None
) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    w, r = graph.edges()
    out = pd.DataFrame(
        {
            "edge": [graph.edge_name(a, c) for a, c in zip(w.tolist(), r.tolist(), strict=True)],
            "writer": [graph.writer_name(a) for a in w.tolist()],
            "reader": [graph.reader_name(c) for c in r.tolist()],
        }
    )
    out["reader_kind"] = [x.rsplit(".", 1)[-1] if "." in x else x for x in out["reader"]]
    out["writer_layer"] = [graph.writer_layer(a) for a in w.tolist()]
    out["reader_layer"] = [graph.reader_layer(c) for c in r.tolist()]
    if sat is not None:  # share of saturated queries of the heads at each end
        for end in ("writer", "reader"):
            names = pd.unique(out[end])
            by = {x: head_saturation(graph, x, sat) for x in names}
            out[f"{end}_saturation"] = out[end].map(by)
    for m, s in scores.items():
        col = column(m)
        mean, lo, hi = mean_ci(s[:, w, r], resamples, level, seed)
        out[col], out[f"{col}_low"], out[f"{col}_high"] = mean, lo, hi
        out[f"{col}_rank"] = (-np.abs(mean)).argsort(kind="stable").argsort(kind="stable") + 1
    _put_exact(out, graph, chosen if exact is not None else [], exact, resamples, level, seed)
    return out


def _put_exact(out, graph, edges, per, resamples, level, seed) -> None:
    """``out``'s ``exact`` columns (NaN but at ``edges``, a row per edge of ``graph`` in
    :meth:`~headscope.circuits.edge_graph.EdgeGraph.edges` order): the mean of ``per`` ``[pair,
    edge]`` with its interval."""
    import numpy as np

    out["exact"] = out["exact_low"] = out["exact_high"] = np.nan
    if per is None or not len(edges):
        return
    w, r = graph.edges()
    index = {(a, c): i for i, (a, c) in enumerate(zip(w.tolist(), r.tolist(), strict=True))}
    rows = [index[e] for e in edges]
    mean, lo, hi = mean_ci(per, resamples, level, seed)
    out.loc[rows, "exact"], out.loc[rows, "exact_low"], out.loc[rows, "exact_high"] = mean, lo, hi


def node_table(graph, scores: dict, resamples, level, seed, pattern=None, sat=None) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for wi in range(graph.n_writers):
        name = graph.writer_name(wi)
        la = graph.writer_layer(wi)
        head = (wi - 1) % (graph.n_heads + 1) if wi else -1
        kind = "embed" if wi == 0 else ("mlp" if head == graph.n_heads else "head")
        rows.append(
            {"node": name, "kind": kind, "layer": la, "head": head if kind == "head" else -1}
        )
    out = pd.DataFrame(rows)
    if sat is not None:
        out["saturation"] = [head_saturation(graph, x, sat) for x in out["node"]]
    for m, s in scores.items():
        col = column(m)
        per = s.nansum(2)  # [pair, writer]: a writer's node score, the sum of its edges
        out[col], out[f"{col}_low"], out[f"{col}_high"] = mean_ci(per, resamples, level, seed)
    if pattern is not None and len(pattern):
        wide = pattern.pivot_table(index="head_name", columns="metric", values="score")
        out = out.merge(wide, left_on="node", right_index=True, how="left")
    return out


def exact_readers(model, batches, n: int, metric: str, qk: dict, config) -> dict:
    """The top ``config.exact_readers`` query and key readers by ``|AtP*|`` (over both kinds)
    patched exactly, whole: ``{("q", layer, head) or ("k", layer, kv_head): [pair]}``, the
    change in the metric from the base run."""
    import torch

    from headscope.effects.patching import Request, exact_patching

    # a reader kind's AtP* estimates and its exact patch: a KV head's key, or one query head's
    per = {
        "q": ("q", "head"),
        "k": ("k_head", "head") if config.kv_mode == "head" else ("k", "group"),
    }
    means = [(kind, qk[per[kind][0]].nanmean(0)) for kind in ("q", "k")]
    flat = [
        (abs(float(m[la, u])), kind, la, u)
        for kind, m in means
        for la in range(m.shape[0])
        for u in range(m.shape[1])
    ]
    top = sorted(flat, reverse=True)[: config.exact_readers]
    mode = {kind: per[kind][1] for kind in per}
    reqs = [
        Request(
            config.direction,
            kind,
            mode[kind],
            ("all",),
            tuple((la, u) for _, k, la, u in top if k == kind),
        )
        for kind in ("q", "k")
        if any(k == kind for _, k, _, _ in top)
    ]
    base: dict = {}
    got = exact_patching(model, batches, n, metric, reqs, baseline=base)
    ref = base["clean" if config.direction == "noising" else "corrupt"]
    out = {}
    for _, kind, la, u in top:
        m = got[(config.direction, kind, mode[kind], "all", la, u)]
        out[(kind, la, u)] = (m - ref).to(torch.float64)
    return out


def reader_table(graph, scores: dict, qk: dict, qk_exact, resamples, level, seed, sat=None):
    """A row per reader: its in-edges' score sums; for a query (key) reader, attribution's and
    AtP*'s estimate of patching the whole query (key), with intervals, and the exact effect
    where it was measured."""
    import pandas as pd
    import torch

    rows = []
    for r in range(graph.n_readers):
        name = graph.reader_name(r)
        kind = name.rsplit(".", 1)[-1] if "." in name else name
        la = graph.reader_layer(r)
        unit = -1
        if kind in ("q", "k", "v"):
            by = "H" if kind == "q" or graph.kv_mode == "head" else "KV"
            unit = int(name.split(".")[0].split(by)[-1])
        rows.append({"reader": name, "kind": kind, "layer": la, "head": unit})
    out = pd.DataFrame(rows)
    if sat is not None:
        out["saturation"] = [head_saturation(graph, x, sat) for x in out["reader"]]
    for m, s in scores.items():
        col = column(m)
        per = s.nansum(1)  # [pair, reader]: the edges into each reader
        out[col], out[f"{col}_low"], out[f"{col}_high"] = mean_ci(per, resamples, level, seed)
    n = next(iter(scores.values())).shape[0]
    cols = {c: torch.full((n, graph.n_readers), torch.nan, dtype=torch.float64)
            for c in ("atp", "atp_qk", "exact")}  # fmt: skip
    for r, row in enumerate(rows):
        kind, la, u = row["kind"], row["layer"], row["head"]
        if kind in ("q", "k"):
            key = "k_head" if kind == "k" and graph.kv_mode == "head" else kind
            cols["atp"][:, r] = qk[f"atp_{key}"][:, la, u]
            cols["atp_qk"][:, r] = qk[key][:, la, u]
            if qk_exact and (kind, la, u) in qk_exact:
                cols["exact"][:, r] = qk_exact[(kind, la, u)]
    for c, per in cols.items():
        mean, lo, hi = mean_ci(per, resamples, level, seed)
        out[c], out[f"{c}_low"], out[f"{c}_high"] = mean, lo, hi
    return out


#: position-resolved edges patched exactly per named position: the top ones by the ranking score
EXACT_AT = 10


def edges_at_table(graph, at: dict, exact_at: dict, resamples, level, seed) -> pd.DataFrame:
    """A row per edge and named position: each score at that position with its interval, the
    exact effect where it was measured (``at``: ``{method: {position: [pair, writer, reader]}}``,
    ``exact_at``: ``{position: (edges, [pair, edge])}``)."""
    import pandas as pd

    w, r = graph.edges()
    names = [graph.edge_name(a, c) for a, c in zip(w.tolist(), r.tolist(), strict=True)]
    parts = []
    for pos in next(iter(at.values())):
        out = pd.DataFrame(
            {
                "edge": names,
                "position": pos,
                "writer": [graph.writer_name(a) for a in w.tolist()],
                "reader": [graph.reader_name(c) for c in r.tolist()],
            }
        )
        for m, by_pos in at.items():
            col = column(m)
            mean, lo, hi = mean_ci(by_pos[pos][:, w, r], resamples, level, seed)
            out[col], out[f"{col}_low"], out[f"{col}_high"] = mean, lo, hi
        edges, per = exact_at.get(pos, ([], None))
        _put_exact(out, graph, edges, per, resamples, level, seed)
        parts.append(out)
    return pd.concat(parts, ignore_index=True)


def curve_table(curve: dict, rank_by: str) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for d, f in enumerate(curve["f"]):
        for i, (share, k) in enumerate(zip(curve["shares"], curve["n_edges"], strict=True)):
            rows.append(
                {
                    "order": f"top by {rank_by}" if d == 0 else "random",
                    "draw": d,
                    "share": share,
                    "n_edges": k,
                    "f": float(f[i]),
                    "f_low": float(curve["f_low"][i]) if d == 0 else float("nan"),
                    "f_high": float(curve["f_high"][i]) if d == 0 else float("nan"),
                }
            )
    return pd.DataFrame(rows)


#: an estimate disagrees with the exact effect when off by more than this share of it (or signed
#: the other way); a head "saturates" when more than half its queries put > 0.9 on one key
DISAGREE, SATURATED_SHARE = 0.5, 0.5


def agreement_table(graph, scores: dict, chosen, exact, config, seed, edges=None) -> pd.DataFrame:
    """Spearman and top-k overlap between every two scores, over the exactly patched edges; for
    an estimate against the exact effect, how many edges it gets wrong (off by more than
    :data:`DISAGREE` of the exact effect) and how often a head at either end saturates
    (:data:`SATURATED_SHARE` of its queries above 0.9 on one key) among those and among the
    rest."""
    import pandas as pd

    from headscope.circuits.agreement import rank_agreement

    if exact is None or len(chosen) < 3:
        return pd.DataFrame(columns=["a", "b", "n", "rho", "rho_low", "rho_high", "k", "overlap"])
    names = [graph.edge_name(a, c) for a, c in chosen]
    w, r = (list(x) for x in zip(*chosen, strict=True))
    series = {m: pd.Series(s.mean(0)[w, r].numpy(), index=names) for m, s in scores.items()}
    series["exact"] = pd.Series(exact.mean(0).numpy(), index=names)
    keys = list(series)
    rows = []
    for i, a in enumerate(keys):
        for bb in keys[i + 1 :]:
            got = rank_agreement(
                series[a],
                series[bb],
                k=min(20, len(names) // 2),
                n_boot=config.bootstrap or 200,
                seed=seed,
            )
            row = {"a": a, "b": bb, **{k: v for k, v in got.items() if k not in ("top_a", "top_b")}}
            if bb == "exact" and edges is not None and "writer_saturation" in edges:
                row.update(_disagreement(series[a], series[bb], edges))
            rows.append(row)
    return pd.DataFrame(rows)


def _disagreement(est, exact, edges) -> dict:
    import numpy as np

    e = edges.set_index("edge").loc[est.index]
    sat = np.fmax(e["writer_saturation"].to_numpy(), e["reader_saturation"].to_numpy())
    saturated = np.nan_to_num(sat, nan=0.0) > SATURATED_SHARE
    wrong = (est - exact).abs().to_numpy() > DISAGREE * exact.abs().to_numpy()
    return {
        "n_disagree": int(wrong.sum()),
        "saturated_disagree": float(saturated[wrong].mean()) if wrong.any() else float("nan"),
        "saturated_agree": float(saturated[~wrong].mean()) if (~wrong).any() else float("nan"),
    }


def circuit_record(graph, mask, scores, rank_by: str, share: float, f: float) -> dict:
    w, r = mask.nonzero(as_tuple=True)
    edges = sorted(
        (
            {
                "edge": graph.edge_name(a, c),
                "writer": graph.writer_name(a),
                "reader": graph.reader_name(c),
                "score": float(scores[a, c]),
            }
            for a, c in zip(w.tolist(), r.tolist(), strict=True)
        ),
        key=lambda e: -abs(e["score"]),
    )
    return {
        "ranked_by": rank_by,
        "share": share,
        "n_edges": len(edges),
        "of_edges": graph.n_edges,
        "faithfulness": f,
        "edges": edges,
    }


# ------------------------------------------------------------------------------ the run directory


def save_discovery(
    result: DiscoverResult, out: str | Path, *, figures: bool = True, figure_formats=None, **options
) -> Path:
    """Write ``result`` to the run directory ``out`` (module docstring), published whole
    (:func:`headscope.rundir.store.write_run`)."""
    from headscope.rundir.kinds import DISCOVER
    from headscope.rundir.store import write_csv, write_run

    def tables(tmp: Path) -> None:
        for name in ("edges", "nodes", "readers", "curve", "agreement", "baseline"):
            write_csv(getattr(result, name), tmp / f"{name}.csv")
        (tmp / "circuit.json").write_text(json.dumps(result.circuit, indent=1) + "\n")
        result.tokens.write_jsonl(tmp / "tokens.jsonl")
        if result.held_out is not None:
            result.held_out.write_jsonl(tmp / "held_out.jsonl")
        if result.edges_at is not None:
            write_csv(result.edges_at, tmp / "edges_at.csv")

    def draw(tmp: Path) -> None:
        from headscope.report.discover_figures import save_discover_figures

        save_discover_figures(tmp, result.metadata, formats=figure_formats)

    def page(tmp: Path) -> None:
        from headscope.report.discover_page import discover_page_html

        (tmp / "report.html").write_text(discover_page_html(tmp, figures), encoding="utf-8")

    base = result.baseline.set_index("prompt")
    record = dict(
        result.metadata,
        model=result.model,
        task=result.task,
        metric=result.metric,
        baseline={p: base.loc[p].drop("task").to_dict() for p in base.index},
    )
    result.metadata = write_run(
        out, DISCOVER, tables, record, figures=draw if figures else None, page=page, **options
    )
    return Path(out)


def load_discovery(path: str | Path) -> DiscoverResult:
    """Read a discovery run directory back (tables, tokens, metadata; no per-pair values)."""
    from headscope.probes.tasks import TokenizedTask
    from headscope.rundir.kinds import DISCOVER
    from headscope.rundir.store import read_record, read_table

    path = Path(path)
    meta = read_record(path, DISCOVER)
    task, metric = meta.get("task", ""), meta["metric"]
    tokens = TokenizedTask.read_jsonl(path / "tokens.jsonl", task, metric)
    held = path / "held_out.jsonl"
    return DiscoverResult(
        meta.get("task", ""),
        meta.get("model", ""),
        meta.get("metric", ""),
        read_table(path, "edges.csv", ("edge", "writer", "reader", "reader_kind")),
        read_table(path, "nodes.csv", ("node", "kind")),
        read_table(path, "readers.csv", ("reader", "kind")),
        read_table(path, "curve.csv", ("order",)),
        read_table(path, "agreement.csv", ("a", "b")),
        json.loads((path / "circuit.json").read_text()),
        read_table(path, "baseline.csv", ("prompt",)),
        tokens,
        meta,
        held_out=TokenizedTask.read_jsonl(held, task, metric) if held.exists() else None,
        edges_at=read_table(path, "edges_at.csv", ("edge", "position", "writer", "reader"))
        if (path / "edges_at.csv").exists()
        else None,
    )


def discover_to_dir(model_name, task, out: str | Path, config=None, **options) -> DiscoverResult:
    """``headscope discover``: check everything, load ``model_name``, discover, save the run to
    ``out`` (:func:`headscope.apps.runs.task_run_to_dir`; ``options``: ``scan``, ``tokenizer``,
    ``force``, ``figures``, ``say``, ``figure_formats`` and any setting). Refused in one line
    before the model loads: a setting, the task, ``--scan``, ``out``, the model's name; before any
    forward: a family the edge graph does not know (an encoder among them), a named edge whose
    reader is not after its writer, a task whose pairs fail their checks."""
    from headscope.rundir.kinds import DISCOVER

    return task_run_to_dir(
        DISCOVER, DiscoverSettings, _work, save_discovery, model_name, task, out, config, **options
    )


def _work(model, task, config, pattern, say) -> DiscoverResult:
    return discover(model, task, config, pattern=pattern, say=say)
