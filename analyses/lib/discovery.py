"""Notebook 11's helpers (circuit discovery in the edge graph): pairs held out from the ones that
ranked the edges, the class-rule IOI circuit as notebook 09 saved it, Wang et al.'s chain as edges
of the graph, sign agreement with exact patching resampled over pairs, and faithfulness curves'
areas with intervals (several curves on the same resampled pairs, so differences get one too).

* :func:`fresh_pairs`: a kit's pairs of another seed whose clean prompt the first draw does not
  have (held-out evaluation).
* :func:`parse_classes` / :func:`saved_classes`: ``{model: {head: class}}`` from the printed
  class tables of notebook 09's ``headscope.circuit(m, "ioi", ...)`` cell.
* :func:`chain_edges`: the class-to-class links of Wang et al.'s circuit (previous token ->
  induction key, induction and duplicate token -> S-inhibition value, S-inhibition -> name-mover
  query, movers -> logits) as edge names of the graph, keys and values per KV head.
* :func:`sign_agreement`: the share of edges whose mean estimate has the sign of the mean exact
  effect (or is within a tolerance of it), with a percentile interval over resampled pairs;
  :func:`sign_agreement_difference`: two estimates' shares subtracted, on the same resampled
  pairs.
* :func:`curve_areas`: CPR and CMD of curves measured on the same pairs (full circuit appended at
  share 1), each with an interval, and the paired difference of any two.
* :func:`first_entries`: heads in the order they first write on an edge of a ranking.
* :func:`overlap_tail`: the chance that a random set of heads overlaps a fixed set as much
  (hypergeometric tail: the limit of infinitely many random draws).

>>> writer_head("L16H0->L17KV1.k"), writer_head("MLP0->L8H1.q")
('L16H0', None)
>>> round(overlap_tail(270, 6, 6, 1), 4)  # 6 random heads of 270 share >= 1 with a set of 6
0.1273
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headscope.catalog import CIRCUIT_CLASSES
from headscope.circuits.edge_circuits import areas
from headscope.probes.tasks import Task
from headscope.uncertainty import draw_weights

LEVEL = 0.95
CLASSES = CIRCUIT_CLASSES  # notebook 09's class rules, in the diagram's order
_ROW = re.compile(r"^(L\d+H\d+)\s+(" + "|".join(sorted(CLASSES, key=len, reverse=True)) + r")\s")
_RUN = re.compile(r"^(\S+): \d+ exact paths into")


# ------------------------------------------------------------------------------ pairs


def fresh_pairs(seen: Task, task: Task, n: int) -> tuple[Task, int]:
    """The first ``n`` pairs of ``task`` whose clean prompt is none of ``seen``'s, and how many
    of ``task``'s pairs before the last one kept were dropped for it.

    >>> a = Task.from_pairs([("When A and B", "When C and D", " A", " B")])
    >>> b = Task.from_pairs([("When A and B", "When E and F", " A", " B"),
    ...                      ("When X and Y", "When C and D", " X", " Y")])
    >>> t, dropped = fresh_pairs(a, b, 1)
    >>> [p.clean for p in t.pairs], dropped
    (['When X and Y'], 1)
    """
    have = {p.clean for p in seen.pairs}
    kept, dropped = [], 0
    for p in task.pairs:
        if len(kept) == n:
            break
        if p.clean in have:
            dropped += 1
        else:
            kept.append(p)
    return Task(task.name, tuple(kept), task.metric, task.prepend_bos, task.provenance), dropped


# ------------------------------------------------------------------------------ notebook 09


def parse_classes(texts: Sequence[str]) -> dict[str, dict[str, str]]:
    """``{model: {head: class}}`` from the output texts of notebook 09's IOI cell, in order: a
    line ``<model>: N exact paths into ...`` starts a model; a table row ``L16H0  previous_token
    ...`` after it names a classed head.

    >>> parse_classes(["m1: 12 exact paths into 3 receivers\\n",
    ...                "      class\\nL23H0   name_mover  +0.1\\nL23H3        +0.8\\n",
    ...                "m2: 5 exact paths into 2 receivers\\n", "L10H3  s_inhibition 0.1\\n"])
    {'m1': {'L23H0': 'name_mover'}, 'm2': {'L10H3': 's_inhibition'}}
    """
    out: dict[str, dict[str, str]] = {}
    model = None
    for text in texts:
        for line in text.splitlines():
            if m := _RUN.match(line.strip()):
                model = m[1]
                out.setdefault(model, {})
            elif model is not None and (m := _ROW.match(line)):
                out[model][m[1]] = m[2]
    return out


def saved_classes(path: str | Path) -> dict[str, dict[str, str]]:
    """:func:`parse_classes` of the saved outputs of the cell of notebook ``path`` that calls
    ``headscope.circuit(m, "ioi", ...)`` (plain-text outputs: streams and tables)."""
    nb = json.loads(Path(path).read_text())
    for cell in nb["cells"]:
        src = "".join(cell.get("source", ""))
        if cell.get("cell_type") == "code" and 'headscope.circuit(m, "ioi"' in src:
            texts = []
            for o in cell.get("outputs", []):
                t = o.get("text") or o.get("data", {}).get("text/plain") or ""
                texts.append("".join(t) if isinstance(t, list) else t)
            return parse_classes(texts)
    return {}


def kv_reader(head: str, kind: str, n_heads: int, n_kv: int) -> str:
    """The reader a query head's key or value is, with keys and values per KV head.

    >>> kv_reader("L17H4", "k", 9, 3), kv_reader("L17H4", "q", 9, 3)
    ('L17KV1.k', 'L17H4.q')
    """
    la, h = (int(x) for x in re.fullmatch(r"L(\d+)H(\d+)", head).groups())
    if kind == "q":
        return f"L{la}H{h}.q"
    return f"L{la}KV{h // (n_heads // n_kv)}.{kind}"


#: Wang et al.'s links between classes: (sender class, receiver class, what the receiver reads)
LINKS = (
    ("previous_token", "induction", "k"),
    ("induction", "s_inhibition", "v"),
    ("duplicate_token", "s_inhibition", "v"),
    ("s_inhibition", "name_mover", "q"),
    ("name_mover", "logits", ""),
    ("negative_name_mover", "logits", ""),
)


def chain_edges(classes: Mapping[str, str], n_heads: int, n_kv: int) -> pd.DataFrame:
    """One row per link of :data:`LINKS` between classed heads: ``link`` (``previous_token ->
    induction.k``), ``sender``, ``receiver`` and the graph's ``edge`` (sender before receiver
    only). Several query heads of one KV head share one key (value) edge.

    >>> t = chain_edges(
    ...     {"L16H0": "previous_token", "L17H4": "induction", "L23H0": "name_mover"}, 9, 3)
    >>> t["edge"].tolist(), t["link"].iloc[0]
    (['L16H0->L17KV1.k', 'L23H0->logits'], 'previous_token -> induction.k')
    """
    rows = []
    layer = {h: int(re.match(r"L(\d+)", h)[1]) for h in classes}
    for a, b, kind in LINKS:
        for s in [h for h, c in classes.items() if c == a]:
            if b == "logits":
                rows.append({"link": f"{a} -> logits", "sender": s, "receiver": "logits",
                             "edge": f"{s}->logits"})  # fmt: skip
                continue
            for r in [h for h, c in classes.items() if c == b and layer[h] > layer[s]]:
                e = f"{s}->{kv_reader(r, kind, n_heads, n_kv)}"
                rows.append({"link": f"{a} -> {b}.{kind}", "sender": s, "receiver": r, "edge": e})
    return pd.DataFrame(rows, columns=["link", "sender", "receiver", "edge"])


# ------------------------------------------------------------------------------ estimates vs exact


def _quantiles(x: Tensor, level: float) -> tuple[float, float]:
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.nanquantile(x.double(), q)
    return float(lo), float(hi)


def _agree(estimate: Tensor, exact: Tensor, tolerance: float | None) -> Tensor:
    """Per edge (last axis), whether ``estimate`` agrees with ``exact``: the same sign
    (``tolerance`` None), or off by at most ``tolerance`` of ``|exact|``."""
    if tolerance is None:
        return torch.sign(estimate) == torch.sign(exact)
    return (estimate - exact).abs() <= tolerance * exact.abs()


def sign_agreement(
    estimate: Tensor,
    exact: Tensor,
    resamples: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    tolerance: float | None = None,
) -> tuple[float, float, float]:
    """The share of edges (columns of ``[pair, edge]`` tensors) whose mean ``estimate`` over
    pairs has the sign of their mean ``exact`` effect (with ``tolerance``: is off by at most that
    share of it), with a percentile interval: pairs resampled, the same draws for both.

    >>> est = torch.tensor([[1.0, -1.0, 2.0], [1.0, -1.0, 2.0]])
    >>> ex = torch.tensor([[2.0, 1.0, 1.0], [2.0, 1.0, 1.0]])
    >>> [round(v, 3) for v in sign_agreement(est, ex, resamples=20)]
    [0.667, 0.667, 0.667]
    >>> round(sign_agreement(est, ex, resamples=0, tolerance=0.5)[0], 3)  # 1 vs 2: off by half
    0.333
    """
    share = lambda a, b: _agree(a, b, tolerance).double().mean(-1)  # noqa: E731
    value = float(share(estimate.double().mean(0), exact.double().mean(0)))
    if not resamples or estimate.shape[1] == 0:
        return value, math.nan, math.nan
    w = draw_weights(estimate.shape[0], resamples, seed) / estimate.shape[0]
    boot = share(w @ estimate.double(), w @ exact.double())
    return (value, *_quantiles(boot, level))


def sign_agreement_difference(
    a: Tensor,
    b: Tensor,
    exact: Tensor,
    resamples: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    tolerance: float | None = None,
) -> tuple[float, float, float]:
    """:func:`sign_agreement` of estimate ``a`` minus that of estimate ``b`` on the same edges,
    with a percentile interval over pairs resampled once for all three.

    >>> ex = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    >>> a, b = torch.ones(2, 2), torch.tensor([[1.0, -1.0], [1.0, -1.0]])
    >>> sign_agreement_difference(a, b, ex, resamples=10)
    (0.5, 0.5, 0.5)
    """
    share = lambda x, y: _agree(x, y, tolerance).double().mean(-1)  # noqa: E731
    mean = lambda x: x.double().mean(0)  # noqa: E731
    value = float(share(mean(a), mean(exact)) - share(mean(b), mean(exact)))
    if not resamples or exact.shape[1] == 0:
        return value, math.nan, math.nan
    w = draw_weights(exact.shape[0], resamples, seed) / exact.shape[0]
    ex = w @ exact.double()
    boot = share(w @ a.double(), ex) - share(w @ b.double(), ex)
    return (value, *_quantiles(boot, level))


# ------------------------------------------------------------------------------ curves


def _with_full(shares: Sequence[float], f: Sequence[float]) -> tuple[list[float], list[float]]:
    shares, f = list(shares), list(f)
    if shares[-1] < 1:
        shares, f = [*shares, 1.0], [*f, 1.0]
    return shares, f


def curve_areas(
    metrics: Mapping[str, Tensor],
    shares: Sequence[float],
    m_full: Tensor,
    m_empty: Tensor,
    resamples: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """For each named curve (its circuits' metric per pair, ``[size, pair]``, at ``shares``, all
    on the same pairs as ``m_full`` and ``m_empty``): ``f`` per size and CPR / CMD (the full
    circuit, ``f = 1``, appended at share 1 when the shares stop below it: the same areas as
    :func:`~headscope.circuits.edge_circuits.faithfulness_curve` gives with share 1 measured),
    each with a percentile interval over resampled pairs. Returns the table and each curve's
    resampled CPR (the same draws for every curve: subtract two for a paired difference).

    >>> full, empty = torch.tensor([2.0, 2.0]), torch.tensor([0.0, 0.0])
    >>> t, boot = curve_areas({"a": torch.tensor([[2.0, 2.0]])}, [0.5], full, empty, 10)
    >>> t.loc["a", ["cpr", "cmd"]].tolist()
    [0.75, 0.25]
    """
    n = m_full.shape[0]
    f_of = lambda per, me, mf: (per - me) / (mf - me)  # noqa: E731
    rows, boots = {}, {}
    w = draw_weights(n, resamples, seed) / n if resamples else None
    for name, per in metrics.items():
        per = per.double()
        f = f_of(per.mean(-1), m_empty.double().mean(), m_full.double().mean())
        cpr, cmd = areas(*_with_full(shares, f.tolist()))
        row = {"cpr": cpr, "cmd": cmd}
        for i, s in enumerate(shares):
            row[f"f@{s:.4f}"] = float(f[i])
        if w is not None:
            fb = f_of(per @ w.T, w @ m_empty.double(), w @ m_full.double())  # [size, resample]
            a = np.array([areas(*_with_full(shares, fb[:, j].tolist())) for j in range(resamples)])
            row["cpr_low"], row["cpr_high"] = interval(a[:, 0], level)
            row["cmd_low"], row["cmd_high"] = interval(a[:, 1], level)
            lo, hi = np.nanquantile(fb.numpy(), [(1 - level) / 2, (1 + level) / 2], axis=1)
            for i, s in enumerate(shares):
                row[f"f_low@{s:.4f}"], row[f"f_high@{s:.4f}"] = float(lo[i]), float(hi[i])
            boots[name] = a[:, 0]
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index"), boots


def interval(x: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of resampled values.

    >>> [round(v, 6) for v in interval(np.arange(101.0))]
    [2.5, 97.5]
    """
    lo, hi = np.nanquantile(x, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


# ------------------------------------------------------------------------------ heads


def writer_head(edge: str) -> str | None:
    """The head an edge comes out of (None for the embedding or an MLP)."""
    m = re.match(r"(L\d+H\d+)->", edge)
    return m[1] if m else None


def first_entries(edges: Sequence[str]) -> pd.DataFrame:
    """Heads in the order they first write on one of ``edges`` (a ranking, best first): ``head``,
    ``edge`` (its first), ``edge_rank`` (1-based) and ``head_rank``.

    >>> ranking = ["MLP0->L1H0.q", "L3H1->logits", "L2H0->L3H1.q", "L3H1->MLP4.in"]
    >>> first_entries(ranking).values.tolist()
    [['L3H1', 'L3H1->logits', 2, 1], ['L2H0', 'L2H0->L3H1.q', 3, 2]]
    """
    rows, seen = [], set()
    for i, e in enumerate(edges):
        h = writer_head(e)
        if h is not None and h not in seen:
            seen.add(h)
            rows.append({"head": h, "edge": e, "edge_rank": i + 1, "head_rank": len(rows) + 1})
    return pd.DataFrame(rows, columns=["head", "edge", "edge_rank", "head_rank"])


def overlap_tail(n_heads: int, n_set: int, n_drawn: int, k: int) -> float:
    """P(a random ``n_drawn`` of ``n_heads`` heads shares at least ``k`` with a fixed
    ``n_set``): the hypergeometric tail."""
    total = math.comb(n_heads, n_drawn)
    hits = sum(
        math.comb(n_set, j) * math.comb(n_heads - n_set, n_drawn - j)
        for j in range(k, min(n_set, n_drawn) + 1)
    )
    return hits / total
