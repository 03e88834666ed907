"""Figures of a circuit run, from its tables alone (never the model): matplotlib Figures, no pyplot
(the page's diagram is the same Figure as SVG).

The tables are the run directory's (``headscope circuit``): ``path.csv`` (path patching of a
sender head into a receiver: the logits, or one head's q, k or v input at one position),
``composition.csv`` (Q-/K-/V-composition z against a random-weight null), ``agreement.csv`` (per
receiver, the senders ranked both ways: Spearman rho and the top-k overlap against chance) and
``classes.csv`` (each head's class by an explicit rule, with its evidence).

* :func:`circuit_edges`: the diagram's edges, one per ``path.csv`` row that qualifies (exact
  estimator, one direction, sender and receiver both nodes, ``|effect| >= threshold``); a group
  receiver (several heads' inputs patched at once, :func:`group_members`) is a receiver whose
  heads are all nodes;
* :func:`circuit_diagram`: heads with a class as nodes (x = layer, rows grouped by class,
  coloured by class), a ``logits`` node right of the last layer (a column apart, and between node
  rows, so that it never covers a head and no edge into it runs through one), the edges as arrows
  sender -> receiver whose width is proportional to ``|effect|`` (the share of the clean-corrupt gap
  the path carries), red where the effect is positive and blue where negative, pale where the
  effect's interval includes 0, the receiver's input (q/k/v/logits) as the line style and a letter
  on the edge; a group receiver is a dashed box around its heads, its edges end on the box;
* :func:`diagram_svg`: the same figure as SVG text for the page (matplotlib's own SVG: one
  renderer), with ``<title>`` tooltips on each edge (its effect and interval) and each node (its
  class, rule and evidence);
* :func:`agreement_figure`: per receiver, each sender's composition z against its path-patching
  effect into that receiver, with the Spearman rho and the top-k overlap in the panel's title (the
  axes padded so that every point and interval bar lies clear of the border);
* :func:`save_circuit_figures` writes ``circuit.png`` and ``agreement.png`` into a run directory.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from headscope.catalog import CIRCUIT_CLASSES as CLASSES
from headscope.catalog import CLASS_EVIDENCE as EVIDENCE
from headscope.files import figure_files, save_figure

#: The classes in the order of the diagram's rows (top to bottom) and their colours.
CLASS_COLOURS = {
    "name_mover": "#1b9e77",
    "negative_name_mover": "#d95f02",
    "s_inhibition": "#7570b3",
    "induction": "#e7298a",
    "duplicate_token": "#66a61e",
    "previous_token": "#e6ab02",
}
OTHER_COLOURS = ("#a6761d", "#666666", "#17becf", "#8c564b")  # classes outside CLASSES
POSITIVE, NEGATIVE = "#b2182b", "#2166ac"  # the ends of RdBu_r, as in the patching heatmaps


LABEL_BOX = {"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.9}


def _pale(colour: str, share: float = 0.55) -> str:
    """``colour`` mixed with ``share`` of white."""
    return to_hex([c + (1.0 - c) * share for c in to_rgb(colour)])


#: An edge whose effect's interval includes 0 (the sign is not settled): its sign's colour, pale.
#: Not a dash: the line style already says the receiver's input.
PALE = {POSITIVE: _pale(POSITIVE), NEGATIVE: _pale(NEGATIVE)}
UNSURE = "pale: its interval includes 0"
#: A group receiver's box: an outline in grey, dashed, around its heads.
GROUP_COLOUR = "#777777"
GROUP_WHAT = (  # the legend's lines
    "dashed box: a group receiver",
    "(its heads' inputs patched at once);",
    "an edge into the box is one path",
    "into the whole group",
)
#: The receiver's input as a line style.
KINDS = ("logits", "q", "k", "v")
KIND_STYLE = {"logits": "solid", "q": (0, (6, 3)), "k": (0, (1.5, 2)), "v": (0, (6, 2, 1.5, 2))}
KIND_WHAT = {
    "logits": "direct to the logits",
    "q": "into the query",
    "k": "into the key",
    "v": "into the value",
}
MAX_WIDTH = 5.0  # points (figure) / pixels (SVG) of the edge with the largest |effect|
LOGITS = "logits"
LOGITS_GAP = 2.0  # layers from the last layer to the logits column: never on a head
#: A head receiver's name (``L9H1.q@END``) at the start of a name or after a ``+``.
_MEMBER = re.compile(r"(?:^|\+)L(\d+)H(\d+)\.[qkv](?=@|\+|$)")


def _head(layer, head) -> str:
    return f"L{int(layer)}H{int(head)}"


def class_colour(cls: str, classes: Sequence[str]) -> str:
    """The colour of a class: fixed for :data:`CLASSES`, in turn for any other."""
    if cls in CLASS_COLOURS:
        return CLASS_COLOURS[cls]
    others = [c for c in classes if c not in CLASS_COLOURS]
    return OTHER_COLOURS[others.index(cls) % len(OTHER_COLOURS)] if cls in others else "#999999"


def classed(classes: pd.DataFrame) -> pd.DataFrame:
    """The heads with a class (an empty or missing class is none), in the diagram's order: by
    class (:data:`CLASSES` first, others by name), then layer, then head."""
    cls = classes["class"].fillna("").astype(str).str.strip()
    sub = classes[cls != ""].assign(**{"class": cls[cls != ""]})
    known = {c: i for i, c in enumerate(CLASSES)}
    others = sorted(set(sub["class"]) - set(known))
    rank = {**known, **{c: len(known) + i for i, c in enumerate(others)}}
    return sub.assign(_rank=sub["class"].map(rank)).sort_values(["_rank", "layer", "head"])


#: The class :func:`path_nodes` gives every head of a run without ``classes.csv``.
IN_PATH = "in a path"


def path_nodes(path: pd.DataFrame, threshold: float = 0.05, direction: str | None = None):
    """A stand-in for ``classes.csv`` read from ``path.csv`` alone (a run with named receivers
    writes no classes): every head at either end of an exact path effect of the drawn direction
    with ``|effect| >= threshold`` (a sender, a head receiver, a member of a group receiver named
    by its members), class :data:`IN_PATH`, so :func:`circuit_edges` keeps exactly those edges."""
    if path.empty:
        return pd.DataFrame(columns=["layer", "head", "class", "rule"])
    direction = _direction(path, direction)
    sub = path[(path["estimator"] == "exact") & (path["direction"].astype(str) == direction)]
    sub = sub[sub["effect"].astype(float).abs() >= threshold]
    heads = set(zip(sub["sender_layer"].astype(int), sub["sender_head"].astype(int), strict=True))
    for name, la, h in zip(
        sub["receiver"].astype(str), sub["receiver_layer"], sub["receiver_head"], strict=True
    ):
        if int(h) >= 0:
            heads.add((int(la), int(h)))
        elif _MEMBER.match(name):
            heads |= {(int(a), int(b)) for a, b in _MEMBER.findall(name)}
    rule = f"an end of an exact path effect with |effect| >= {threshold:g} (no classes.csv)"
    rows = [{"layer": la, "head": h, "class": IN_PATH, "rule": rule} for la, h in sorted(heads)]
    return pd.DataFrame(rows, columns=["layer", "head", "class", "rule"])


def _direction(path: pd.DataFrame, direction: str | None) -> str:
    """The direction drawn: the one asked for, else the table's only one, else noising (section
    11's path patching: the sender's corrupt output into the clean run)."""
    have = list(dict.fromkeys(path["direction"].astype(str)))
    if direction is not None:
        if direction not in have:
            raise ValueError(f"path.csv has no {direction!r} rows; it has {', '.join(have)}.")
        return direction
    if not have:
        raise ValueError("path.csv has no rows.")
    return "noising" if "noising" in have else have[0]


def group_members(receiver: str, layer: int, classes: pd.DataFrame) -> list[str] | None:
    """The heads of a group receiver (a ``path.csv`` row with ``receiver_head`` -1 and a q, k or v
    input: several heads' inputs patched at once), read from its name, in (layer, head) order:

    * its members' names joined by ``+`` (``L9H6.q@END+L9H9.q@END``, a
      :class:`~headscope.circuits.receivers.ReceiverGroup` without a label);
    * ``CLASS.KIND@POSITION`` (``name_mover.q@END``, the label ``headscope circuit`` writes): every
      head of that class from ``layer`` up (the row's ``receiver_layer``, the lowest member's
      layer; the run leaves the class's layer-0 heads out, as nothing lies below them).

    ``None`` when a member is not a classed head (the diagram has no node to box) or the name
    names no head."""
    nodes = classed(classes)
    names = set(nodes.apply(lambda r: _head(r["layer"], r["head"]), axis=1))
    if _MEMBER.match(receiver):
        heads = sorted({(int(la), int(h)) for la, h in _MEMBER.findall(receiver)})
        members = [_head(la, h) for la, h in heads]
    else:
        cls = receiver.split(".", 1)[0]
        sub = nodes[(nodes["class"] == cls) & (nodes["layer"].astype(int) >= int(layer))]
        members = [_head(la, h) for la, h in sorted(zip(sub["layer"], sub["head"], strict=True))]
    return members if members and set(members) <= names else None


def circuit_edges(
    classes: pd.DataFrame, path: pd.DataFrame, threshold: float = 0.05, direction: str | None = None
) -> pd.DataFrame:
    """The diagram's edges: the exact ``path.csv`` rows of one direction (see :func:`_direction`)
    whose sender is a classed head and whose receiver is a classed head, the logits or a group
    whose heads are all classed (:func:`group_members`), with ``|effect| >= threshold`` (a NaN
    effect never qualifies); one edge per row, largest ``|effect|`` first, with ``source`` and
    ``target`` node names (a group's target is its receiver name) and ``members`` (the heads the
    path enters, space-separated: the receiver head, a group's heads, "" for the logits)
    added. An edge into a group of one head is left out when the same sender's edge into that
    head's own receiver (the same kind and position: the same path) is drawn."""
    nodes = set(classed(classes).apply(lambda r: _head(r["layer"], r["head"]), axis=1))
    if path.empty:
        return path.assign(source=[], target=[], members=[])
    direction = _direction(path, direction)
    sub = path[(path["estimator"] == "exact") & (path["direction"].astype(str) == direction)]
    source = [_head(la, h) for la, h in zip(sub["sender_layer"], sub["sender_head"], strict=True)]
    target, members = [], []
    for name, k, la, h in zip(
        sub["receiver"].astype(str),
        sub["receiver_kind"].astype(str),
        sub["receiver_layer"],
        sub["receiver_head"],
        strict=True,
    ):
        if k == LOGITS:
            target.append(LOGITS)
            members.append("")
        elif int(h) < 0:  # a group: path_table writes receiver_head -1
            heads = group_members(name, la, classes)
            target.append(name)
            members.append(" ".join(heads) if heads else "")
        else:
            target.append(_head(la, h))
            members.append(target[-1])
    sub = sub.assign(source=source, target=target, members=members)
    effect = sub["effect"].astype(float)
    keep = (
        sub["source"].isin(nodes)
        & (sub["target"].isin(nodes) | (sub["target"] == LOGITS) | _is_group(sub))
        & (effect.abs() >= threshold)
    )
    sub = sub[keep.to_numpy()]
    # a group of one head is that head's own receiver: the same path, measured twice; draw one
    pairs = set(zip(sub["source"], sub["receiver"].astype(str), strict=True))
    same = [
        _is_group(sub.loc[[i]]).iloc[0]
        and " " not in m
        and (src, m + name[name.index(".") :]) in pairs
        for i, src, m, name in zip(
            sub.index, sub["source"], sub["members"], sub["receiver"].astype(str), strict=True
        )
    ]
    sub = sub[~np.asarray(same, bool)]
    return sub.reindex(sub["effect"].abs().sort_values(ascending=False).index)


def _is_group(edges: pd.DataFrame) -> pd.Series:
    """The edges into a group receiver whose heads are all nodes (``members`` set)."""
    return (
        (edges["target"] != LOGITS)
        & (edges["target"] != edges["members"])
        & (edges["members"] != "")
    )


def _unsure(edges: pd.DataFrame) -> np.ndarray:
    """Per edge: does its effect's interval (``ci_low``, ``ci_high``) include 0? False where the
    interval is missing (NaN, or a table without it): nothing to say then."""
    if not len(edges) or not {"ci_low", "ci_high"} <= set(edges.columns):
        return np.zeros(len(edges), bool)
    lo = pd.to_numeric(edges["ci_low"], errors="coerce").to_numpy(float)
    hi = pd.to_numeric(edges["ci_high"], errors="coerce").to_numpy(float)
    with np.errstate(invalid="ignore"):
        return (lo <= 0.0) & (hi >= 0.0)


def _layout(nodes: pd.DataFrame, n_layers: int) -> tuple[dict, list[tuple[str, float]], float]:
    """Node positions in data units: x = layer, y = a row, classes in bands top to bottom (heads of
    one class in one layer stacked); the logits at x = ``n_layers - 1 + LOGITS_GAP`` (a column
    clear of the last layer's heads, whichever they are) and y = the middle row, or the nearest
    height between node rows when a node sits there (:func:`_free_y`). Returns ``{name: (x, y)}``,
    the band centres ``[(class, y)]`` and the number of rows."""
    pos: dict[str, tuple[float, float]] = {}
    bands = []
    row = 0.0
    for cls, sub in nodes.groupby("class", sort=False):
        depth = int(sub.groupby("layer").size().max())
        seen: dict[int, int] = {}
        for r in sub.itertuples():
            k = seen.get(int(r.layer), 0)
            seen[int(r.layer)] = k + 1
            pos[_head(r.layer, r.head)] = (float(r.layer), row + k)
        bands.append((str(cls), row + (depth - 1) / 2))
        row += depth + 0.6  # a gap between bands
    n_rows = max(row - 0.6, 1.0)
    heads = [y for _, y in pos.values()]
    pos[LOGITS] = (n_layers - 1 + LOGITS_GAP, _free_y(heads, (n_rows - 1) / 2))
    return pos, bands, n_rows


def _free_y(rows: list[float], centre: float) -> float:
    """``centre``, or, when a node row lies within half a row of it, the nearest height halfway
    between two node rows (or half a row below the last; a tie: the lower on the page): no node
    then sits in the logits' row, where a head's edge into the logits would run through it or hide
    behind it."""
    rows = sorted(set(rows))
    if all(abs(centre - y) >= 0.5 for y in rows):
        return centre
    free = [(a + b) / 2 for a, b in zip(rows, rows[1:], strict=False)] + [rows[-1] + 0.5]
    return min(free, key=lambda y: (abs(y - centre), -y))


def _group_boxes(edges: pd.DataFrame, pos: dict) -> dict[str, tuple[list[str], tuple]]:
    """The box of each group receiver of ``edges``, by its heads (``members``): ``{members:
    (group names, (x0, y0, x1, y1))}`` in data units, around the heads' nodes and their labels (y0
    the top). Groups of the same heads share a box."""
    boxes: dict[str, tuple[list[str], tuple]] = {}
    if not len(edges):
        return boxes
    for name, members in zip(edges["target"], edges["members"], strict=True):
        if name == LOGITS or name == members or not members:
            continue  # the logits or a single head
        if members in boxes:
            if name not in boxes[members][0]:
                boxes[members][0].append(name)
            continue
        xs, ys = zip(*(pos[m] for m in members.split()), strict=True)
        boxes[members] = ([name], (min(xs) - 0.4, min(ys) - 0.5, max(xs) + 0.4, max(ys) + 0.35))
    return boxes


def _box_end(start: tuple[float, float], box: tuple) -> tuple[float, float]:
    """Where an edge from ``start`` ends on a group's box: the middle of the side facing it (the
    left side for a sender below every member, as path patching's senders are)."""
    (x, y), (x0, y0, x1, y1) = start, box
    if x < x0:
        return x0, (y0 + y1) / 2
    if x > x1:
        return x1, (y0 + y1) / 2
    return (x0 + x1) / 2, (y0 if y < y0 else y1)


def _context(path: pd.DataFrame, model: str, task: str | None, direction: str) -> str:
    task = task if task is not None else (str(path["task"].iloc[0]) if len(path) else "?")
    n = path["n_pairs"].iloc[0] if len(path) and "n_pairs" in path else "?"
    n = int(n) if isinstance(n, (int, float, np.integer)) and n == n else n
    return f"{model + ': ' if model else ''}{task}, {direction}, n = {n} pairs"


def _widths(edges: pd.DataFrame) -> tuple[np.ndarray, float]:
    mags = edges["effect"].abs().to_numpy(float)
    top = float(mags.max()) if len(mags) else 1.0
    return MAX_WIDTH * mags / (top or 1.0), top


def circuit_diagram(
    classes: pd.DataFrame,
    path: pd.DataFrame,
    n_layers: int,
    threshold: float = 0.05,
    model: str = "",
    task: str | None = None,
    direction: str | None = None,
) -> Figure:
    """The circuit as a figure: classed heads as nodes, :func:`circuit_edges` as arrows (see the
    module docstring). Each edge is a ``FancyArrowPatch`` whose gid is ``edge:SOURCE->TARGET`` (a
    group's TARGET its receiver name), each node's marker collection has gid ``node:NAME`` (the
    logits' square has none), each group's box is a ``Rectangle`` with gid ``group:MEMBERS``."""
    nodes = classed(classes)
    names = list(dict.fromkeys(nodes["class"]))
    direction = _direction(path, direction) if len(path) else (direction or "noising")
    edges = circuit_edges(classes, path, threshold, direction) if len(path) else path
    pos, bands, n_rows = _layout(nodes, n_layers)
    fig = Figure(
        figsize=(max(8.0, 0.35 * n_layers + 6.5), max(4.0, 0.45 * n_rows + 2.2)),
        layout="constrained",
    )
    ax = fig.add_subplot()
    widths, top = _widths(edges) if len(edges) else (np.array([]), 1.0)
    boxes = _group_boxes(edges, pos)
    for members, (groups, (bx0, by0, bx1, by1)) in boxes.items():
        box = Rectangle(
            (bx0, by0),
            bx1 - bx0,
            by1 - by0,
            facecolor="none",
            edgecolor=GROUP_COLOUR,
            linestyle=(0, (4, 3)),
            linewidth=1.0,
            zorder=1,
        )
        box.set_gid(f"group:{members}")
        ax.add_patch(box)
        ax.text(
            bx0,
            by1,
            ", ".join(groups),
            fontsize=6.5,
            color=GROUP_COLOUR,
            va="top",
            zorder=4.5,  # over the edges into its box
            bbox=LABEL_BOX,
        )
    unsure = _unsure(edges)
    for r, w, pale in zip(edges.itertuples(), widths, unsure, strict=True):
        (x0, y0) = pos[r.source]
        group = r.target not in pos  # a group: the edge ends on its box
        (x1, y1) = _box_end((x0, y0), boxes[r.members][1]) if group else pos[r.target]
        kind = str(r.receiver_kind)
        colour = POSITIVE if r.effect > 0 else NEGATIVE
        colour = PALE[colour] if pale else colour
        arrow = FancyArrowPatch(
            (x0, y0),
            (x1, y1),
            arrowstyle="-|>",
            mutation_scale=8 + 2 * w,
            linewidth=w,
            linestyle=KIND_STYLE.get(kind, "solid"),
            color=colour,
            alpha=0.8,
            shrinkA=7,
            shrinkB=1 if group else 7,
            connectionstyle="arc3,rad=0.08",
            zorder=1.9 if pale else 2,  # the settled edges on top
        )
        arrow.set_gid(f"edge:{r.source}->{r.target}")
        ax.add_patch(arrow)
        if kind != LOGITS:
            ax.text(
                (x0 + x1) / 2,
                (y0 + y1) / 2,
                kind,
                fontsize=7,
                color=colour,
                ha="center",
                va="center",
                zorder=4,
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
            )
    for cls in names:
        sub = nodes[nodes["class"] == cls]
        for r in sub.itertuples():
            name = _head(r.layer, r.head)
            x, y = pos[name]
            dot = ax.scatter(
                [x],
                [y],
                s=170,
                color=class_colour(cls, names),
                zorder=3,
                edgecolors="black",
                linewidths=0.6,
            )
            dot.set_gid(f"node:{name}")
            ax.annotate(  # above the edges and their arrowheads, on white so that they stay legible
                name,
                (x, y),
                xytext=(0, 9),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                zorder=5,
                bbox=LABEL_BOX,
            )
    lx, ly = pos[LOGITS]
    ax.scatter([lx], [ly], s=260, marker="s", color="#dddddd", edgecolors="black", zorder=3)
    ax.annotate(
        LOGITS,
        (lx, ly),
        xytext=(0, 10),
        textcoords="offset points",
        ha="center",
        fontsize=8,
        zorder=5,
    )
    ax.set_xlim(-0.7, lx + 0.7)
    ax.set_ylim(n_rows - 0.3, -0.9)  # the first class at the top
    step = max(1, math.ceil(n_layers / 15))
    ticks = list(range(0, n_layers, step))
    ax.set_xticks([*ticks, lx], [*map(str, ticks), LOGITS], fontsize=8)
    ax.set_yticks([y for _, y in bands], [c.replace("_", " ") for c, _ in bands], fontsize=8)
    ax.set_xlabel("layer (sender -> receiver; the logits at the right)")
    ax.set_ylabel("head class")
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    if nodes.empty:
        ax.text(n_layers / 2, 0, "no head passed a class rule", ha="center", color="#666666")
    handles = [
        Line2D(
            [],
            [],
            marker="o",
            ls="",
            color=class_colour(c, names),
            markeredgecolor="black",
            label=c.replace("_", " "),
        )
        for c in names
    ]
    handles += [
        Line2D([], [], color=POSITIVE, lw=2, label="effect > 0 (path carries the gap)"),
        Line2D([], [], color=NEGATIVE, lw=2, label="effect < 0 (path works against it)"),
    ]
    if unsure.any():
        signs = np.sign(edges["effect"].astype(float).to_numpy())
        for colour, sign, what in ((POSITIVE, 1, "effect > 0"), (NEGATIVE, -1, "effect < 0")):
            if (unsure & (signs == sign)).any():
                handles.append(Line2D([], [], color=PALE[colour], lw=2, label=f"{UNSURE} ({what})"))
    kinds = [k for k in KINDS if k in set(edges["receiver_kind"].astype(str))] if len(edges) else []
    handles += [
        Line2D(
            [],
            [],
            color="#444444",
            lw=1.5,
            ls=KIND_STYLE[k],
            label=f"{k}: {KIND_WHAT[k]}" if k != LOGITS else KIND_WHAT[k],
        )
        for k in kinds
    ]
    if boxes:
        handles.append(
            Patch(
                facecolor="none",
                edgecolor=GROUP_COLOUR,
                linestyle=(0, (4, 3)),
                label="\n".join(GROUP_WHAT),
            )
        )
    if len(edges):
        handles += [
            Line2D([], [], color="#444444", lw=MAX_WIDTH * f, label=f"|effect| = {f * top:.2f}")
            for f in (1.0, 0.5)
        ]
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        fontsize=7,
        frameon=False,
        title="nodes / edges (width ~ |effect|)",
        title_fontsize=7,
    )
    ax.set_title(
        f"{_context(path, model, task, direction)}\ncircuit: exact path patching, "
        f"{len(edges)} edges with |effect| >= {threshold:g} (share of the clean-corrupt gap) "
        + (
            "\n(no classes.csv: the nodes are the paths' own heads)"
            if set(nodes["class"]) == {IN_PATH}
            else f"among classed heads\n{_unclassed_note(classes, threshold)}"
        ),
        fontsize=9,
    )
    return fig


def _unclassed_note(classes: pd.DataFrame, threshold: float) -> str:
    """What the diagram leaves out: heads in no class, however large their direct effect."""
    if "direct_effect" not in classes:
        return "heads in no class are not drawn"
    cls = classes["class"].fillna("").astype(str)
    direct = pd.to_numeric(classes["direct_effect"], errors="coerce").abs()
    big = classes[(cls == "") & (direct >= threshold)]
    if big.empty:
        return "heads in no class are not drawn (none has |direct effect| >= the threshold)"
    top = big.reindex(direct[big.index].sort_values(ascending=False).index)[:3]
    names = ", ".join(
        f"{_head(r.layer, r.head)} {float(r.direct_effect):+.2f}" for r in top.itertuples()
    )
    return (
        f"not drawn: {len(big)} head{'s' * (len(big) != 1)} in no class with |direct effect| "
        f">= {threshold:g} (largest: {names})"
    )


def _num(x, digits: int = 3) -> str:
    x = float(x)
    return "NaN" if x != x else f"{x:.{digits}f}"


def _node_title(r, cls: str) -> str:
    lines = [f"{_head(r['layer'], r['head'])}: {cls}"]
    if isinstance(r.get("rule"), str) and r["rule"]:
        lines.append(f"rule: {r['rule']}")
    for c in EVIDENCE:
        v = r.get(c)
        if v is not None and isinstance(v, (int, float, np.floating)) and v == v:
            lines.append(f"{c} = {_num(v)}")
    return "\n".join(lines)


def _edge_title(r, pale: bool) -> str:
    kind = str(r.receiver_kind)
    into = KIND_WHAT.get(kind, kind)
    group = r.target not in (LOGITS, r.members)  # an edge into a group receiver's box
    into += f" of the group {', '.join(r.members.split())} at once" if group else ""
    return (
        f"{r.sender} -> {r.receiver} ({into}), {r.direction}\n"
        f"effect {_num(r.effect)} [{_num(r.ci_low)}, {_num(r.ci_high)}]"
        + (" (the interval includes 0)" if pale else "")
        + f"\nmetric change {_num(r.delta)} [{_num(r.delta_ci_low)}, {_num(r.delta_ci_high)}]"
        f"\nMLPs {'frozen' if str(r.freeze_mlps).lower() == 'true' else 'not frozen'}, "
        f"n = {r.n_pairs} pairs"
    )


def diagram_svg(
    classes: pd.DataFrame,
    path: pd.DataFrame,
    n_layers: int,
    threshold: float = 0.05,
    model: str = "",
    task: str | None = None,
    direction: str | None = None,
) -> str:
    """:func:`circuit_diagram` as one ``<svg>`` element for the page (matplotlib's own SVG, text as
    text, nothing fetched), with a ``<title>`` tooltip on every edge (sender, receiver, effect and
    its interval, the raw metric change) and every node (class, rule, evidence): each is the SVG
    group of the artist whose gid names it."""
    import io

    import matplotlib

    from headscope.files import VECTOR_TEXT

    fig = circuit_diagram(classes, path, n_layers, threshold, model, task, direction)
    buf = io.StringIO()
    with matplotlib.rc_context(VECTOR_TEXT):
        fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]  # the element alone: no XML prolog or doctype in a page
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, count=1, flags=re.S)  # date, RDF
    tips = []  # (gid, tooltip) in drawing order: two edges may share a gid (q and k paths)
    if len(path):
        direction = _direction(path, direction)
        edges = circuit_edges(classes, path, threshold, direction)
        for r, pale in zip(edges.itertuples(), _unsure(edges), strict=True):
            tips.append((f"edge:{r.source}->{r.target}", _edge_title(r, pale)))
    for r in classed(classes).to_dict("records"):
        tips.append((f"node:{_head(r['layer'], r['head'])}", _node_title(r, r["class"])))
    after: dict[str, int] = {}
    for gid, tip in tips:
        tag = f'<g id="{html.escape(gid, quote=True)}">'
        at = svg.find(tag, after.get(gid, 0))
        if at >= 0:
            title = f"<title>{html.escape(tip, quote=False)}</title>"
            svg = svg[: at + len(tag)] + title + svg[at + len(tag) :]
            after[gid] = at + len(tag) + len(title)
    return svg


def _padded(values, share: float, at_least: float) -> tuple[float, float]:
    """Axis limits that hold every finite one of ``values`` strictly inside: their range widened
    on each side by ``share`` of its span, and by ``at_least`` at the least, so that the outermost
    point (and its interval bar) sits clear of the border, not on it."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    lo, hi = (float(v.min()), float(v.max())) if len(v) else (0.0, 1.0)
    margin = max(share * (hi - lo), at_least)
    return lo - margin, hi + margin


def _receiver_rows(path: pd.DataFrame, receiver: str, direction: str | None) -> pd.DataFrame:
    sub = path[(path["receiver"].astype(str) == receiver) & (path["estimator"] == "exact")]
    if sub.empty:
        raise ValueError(f"path.csv has no exact rows into {receiver!r}.")
    return sub[sub["direction"].astype(str) == _direction(sub, direction)]


# where a point's label may go, in points from the point (x, y, ha, va): up-right first
LABEL_SPOTS = (
    (3, 3, "left", "bottom"),
    (3, -3, "left", "top"),
    (-3, 3, "right", "bottom"),
    (-3, -3, "right", "top"),
    (3, 12, "left", "bottom"),
    (3, -12, "left", "top"),
    (-3, 12, "right", "bottom"),
    (-3, -12, "right", "top"),
)


def _label_points(ax, points: Sequence[tuple[str, float, float]], fontsize: float = 7) -> None:
    """Label each ``(text, x, y)`` beside its point, in the first of :data:`LABEL_SPOTS` whose box
    overlaps no label placed before it (points near each other, e.g. two senders with nearly
    equal z and effect, otherwise print their names over each other). Boxes are measured on the
    axes as they are now (the limits set), in points; the first spot is the fallback."""
    to_pt = 72.0 / ax.figure.dpi
    placed: list[tuple[float, float, float, float]] = []  # (x0, y0, x1, y1) in points
    for text, x, y in points:
        best = None
        for dx, dy, ha, va in LABEL_SPOTS:
            t = ax.annotate(
                text, (x, y), xytext=(dx, dy), textcoords="offset points",
                fontsize=fontsize, ha=ha, va=va,
            )  # fmt: skip
            bb = t.get_window_extent()
            box = (bb.x0 * to_pt, bb.y0 * to_pt, bb.x1 * to_pt, bb.y1 * to_pt)
            clear = all(
                box[2] <= o[0] or o[2] <= box[0] or box[3] <= o[1] or o[3] <= box[1] for o in placed
            )
            if clear or best is None:
                if best is not None:
                    best[0].remove()
                best = (t, box)
                if clear:
                    break
            else:
                t.remove()
        placed.append(best[1])


def agreement_figure(
    composition: pd.DataFrame,
    path: pd.DataFrame,
    agreement: pd.DataFrame,
    receivers: Sequence[str] | None = None,
    model: str = "",
    direction: str | None = None,
) -> Figure:
    """One panel per receiver (a head's q, k or v input, as ``path.csv`` names it, e.g.
    ``L9H1.k@END``; ``None``: every head receiver of ``agreement.csv``): x = each sender's
    composition z of the receiver's kind, y = its exact path-patching effect into the receiver with
    its interval, a line at z = 2; the top-k senders of each view ringed (k from
    ``agreement.csv``) and the 3 strongest of each named; the title gives the Spearman rho
    (interval) and the top-k overlap against chance from ``agreement.csv``; one key below."""
    if receivers is None:
        receivers = [r for r in dict.fromkeys(agreement["receiver"].astype(str)) if r != LOGITS]
    receivers = list(receivers)
    if not receivers:
        raise ValueError("No receiver to draw: agreement.csv has no head receivers.")
    n = len(receivers)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.2 * cols, 3.6 * rows + 0.5), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    labels = []  # (axes, points): placed once the layout is final
    for ax, receiver in zip(axes, receivers, strict=False):
        if receiver == LOGITS:
            raise ValueError("The logits have no composition score; pick head receivers.")
        sub = _receiver_rows(path, receiver, direction)
        kind = str(sub["receiver_kind"].iloc[0])
        layer, head = int(sub["receiver_layer"].iloc[0]), int(sub["receiver_head"].iloc[0])
        comp = composition[
            (composition["receiver_layer"] == layer)
            & (composition["receiver_head"] == head)
            & (composition["kind"].astype(str) == kind)
        ]
        both = sub.merge(comp[["sender", "z"]], on="sender", how="inner")
        y = both["effect"].to_numpy(float)
        lo = both["ci_low"].to_numpy(float)
        hi = both["ci_high"].to_numpy(float)
        err = np.vstack([np.nan_to_num(y - lo), np.nan_to_num(hi - y)])
        ax.errorbar(
            both["z"],
            y,
            yerr=err,
            fmt="o",
            ms=3.5,
            color="#333333",
            ecolor="#999999",
            elinewidth=0.8,
            capsize=1.5,
            label="sender (bar: its interval)",
        )
        ax.axvline(2.0, color="#b2182b", ls="--", lw=0.9, label="z = 2")
        ax.axhline(0.0, color="#aaaaaa", lw=0.8, zorder=0, label="path effect = 0")
        a = agreement[
            (agreement["receiver"].astype(str) == receiver)
            & (agreement["kind"].astype(str) == kind)
        ]
        k = int(a["top_k"].iloc[0]) if len(a) else 5
        z_order = both.sort_values("z", ascending=False)
        path_order = both.reindex(both["effect"].abs().sort_values(ascending=False).index)
        by_z, by_path = z_order[:k], path_order[:k]
        ax.scatter(
            by_z["z"],
            by_z["effect"],
            s=70,
            facecolors="none",
            edgecolors="#e66101",
            linewidths=1.2,
            label=f"top {k} by composition z",
            zorder=3,
        )
        ax.scatter(
            by_path["z"],
            by_path["effect"],
            s=130,
            marker="s",
            facecolors="none",
            edgecolors="#5e3c99",
            linewidths=1.0,
            label=f"top {k} by |path effect|",
            zorder=3,
        )
        # limits padded by a share of the span (z reaches 100s): every point, interval bar and
        # the z = 2 and 0 lines inside, none on the border
        ax.set_xlim(*_padded([2.0, *both["z"].astype(float)], 0.06, 0.5))
        ax.set_ylim(*_padded([0.0, *y, *(y - err[0]), *(y + err[1])], 0.08, 0.01))
        # the 3 strongest of each view named (a sender in both, once)
        named = pd.concat([path_order[:3], z_order[:3]]).drop_duplicates("sender")
        labels.append((ax, [(str(r.sender), r.z, r.effect) for r in named.itertuples()]))
        ax.set_xlabel(f"{kind}-composition z against the random-weight null")
        ax.set_ylabel(f"path effect into {receiver} (share of gap)", fontsize=8)
        if len(a):
            a = a.iloc[0]
            stats = (
                f"Spearman rho {_num(a['spearman'], 2)} [{_num(a['spearman_ci_low'], 2)}, "
                f"{_num(a['spearman_ci_high'], 2)}]\ntop-{int(a['top_k'])} overlap "
                f"{_num(a['overlap'], 0)} (chance {_num(a['overlap_chance'], 2)}, "
                f"p = {_num(a['p_overlap'], 3)}), {int(a['n_senders'])} senders"
            )
        else:
            stats = "not in agreement.csv"
        ax.set_title(f"{receiver}: {stats}", fontsize=8)
    task = str(path["task"].iloc[0]) if len(path) else "?"
    fig.suptitle(
        f"{model + ': ' if model else ''}{task}: composition (weights) against path patching "
        f"(exact, n = {int(path['n_pairs'].iloc[0])} pairs)",
        fontsize=10,
    )
    first = axes[0]  # one key below the panels: every panel draws the same marks
    fig.legend(
        *first.get_legend_handles_labels(),
        loc="outside lower center",
        ncol=5,
        fontsize=7,
        frameon=False,
    )
    fig.get_layout_engine().execute(fig)  # the axes' final size, so label boxes measure true
    for ax, points in labels:
        _label_points(ax, points)
    return fig


def save_circuit_figures(
    classes: pd.DataFrame,
    path: pd.DataFrame,
    composition: pd.DataFrame | None,
    agreement: pd.DataFrame | None,
    out: str | Path,
    n_layers: int,
    threshold: float = 0.05,
    model: str = "",
    formats: Sequence[str] | None = None,
) -> list[str]:
    """``circuit.png`` (the diagram) and, when the run has head receivers in ``agreement.csv``,
    ``agreement.png``, each as png (the default) or as each of ``formats``; returns the names."""
    out = Path(out)
    names: list[str] = []

    def save(fig, name: str) -> None:
        save_figure(fig, out / name, formats=formats)
        names.extend(p.name for p in figure_files(out / name, formats))

    save(circuit_diagram(classes, path, n_layers, threshold, model=model), "circuit.png")
    if composition is not None and agreement is not None and len(composition):
        heads = [r for r in dict.fromkeys(agreement["receiver"].astype(str)) if r != LOGITS]
        if heads:
            save(
                agreement_figure(composition, path, agreement, heads, model=model), "agreement.png"
            )
    return names
