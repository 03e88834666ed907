"""The figures of a discovery run, drawn from its saved tables alone (``curve.csv``,
``circuit.json``): the faithfulness curve against random circuits, and the chosen circuit.

* :func:`curve_figure`: ``f`` against the share of edges kept (log axis), the ranking with its
  interval over pairs, every random order's curve behind it, CPR and CMD in the title;
* :func:`circuit_figure`: the circuit's components placed by layer (bottom to top) and head (left
  to right; an MLP right of its heads, a KV head below its query heads), each edge a line from
  writer to reader coloured by what it reads (query, key, value, MLP, logits), its width by
  ``|score|``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from headscope.files import save_figure

KIND_COLOURS = {"q": "#1f77b4", "k": "#2ca02c", "v": "#ff7f0e", "in": "#7f7f7f", "logits": "#000"}


def curve_figure(curve: pd.DataFrame, meta: dict) -> Figure:
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.subplots()
    for _, sub in curve[curve["order"] == "random"].groupby("draw"):
        ax.plot(sub["share"], sub["f"], color="0.75", lw=0.8, zorder=1)
    top = curve[curve["draw"] == 0]
    label = top["order"].iloc[0] if len(top) else "ranking"
    ax.fill_between(top["share"], top["f_low"], top["f_high"], color="#1f77b4", alpha=0.2, lw=0)
    ax.plot(top["share"], top["f"], "o-", color="#1f77b4", ms=3, label=label, zorder=3)
    ax.plot([], [], color="0.75", label="random orders")
    ax.axhline(1, color="k", lw=0.6, ls="--")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("share of edges kept")
    ax.set_ylabel("faithfulness f")
    cpr, cmd = meta.get("cpr"), meta.get("cmd")
    title = f"{meta.get('model', '')} on {meta.get('task', '')}"
    if cpr and cmd:
        title += f"\nCPR {cpr[0]:.3f} [{cpr[1]:.3f}, {cpr[2]:.3f}], CMD {cmd[0]:.3f}"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def _place(name: str, n_heads: int, n_kv: int, n_layers: int) -> tuple[float, float]:
    """Where a writer or reader sits: (x, y)."""
    if name == "embed":
        return (n_heads - 1) / 2, -1.0
    if name == "logits":
        return (n_heads - 1) / 2, float(n_layers)
    if m := re.fullmatch(r"L(\d+)H(\d+)(\.q)?", name):
        return float(m[2]), float(m[1])
    if m := re.fullmatch(r"L(\d+)H(\d+)\.([kv])", name):  # one query head's key or value
        return float(m[2]), int(m[1]) - (0.25 if m[3] == "k" else 0.5)
    if m := re.fullmatch(r"L(\d+)KV(\d+)\.([kv])", name):
        g = n_heads // max(n_kv, 1)
        return int(m[2]) * g + (g - 1) / 2, int(m[1]) - (0.25 if m[3] == "k" else 0.5)
    if m := re.fullmatch(r"MLP(\d+)(\.in)?", name):
        return float(n_heads) + 0.5, int(m[1]) + 0.35
    raise ValueError(name)


def circuit_figure(circuit: dict, meta: dict) -> Figure:
    n_layers, n_heads = int(meta.get("n_layers", 1)), int(meta.get("n_heads", 1))
    n_kv = int(meta.get("n_kv_heads", n_heads) or n_heads)
    fig = Figure(
        figsize=(min(12, max(6, 2 + 0.5 * n_heads)), min(12, max(4, 1.5 + 0.3 * n_layers)))
    )
    ax = fig.subplots()
    edges = circuit.get("edges", [])
    top = max((abs(e["score"]) for e in edges), default=1.0) or 1.0
    nodes = set()
    for e in edges:
        w, r = e["writer"], e["reader"]
        kind = r.rsplit(".", 1)[-1] if "." in r else "logits"
        (x0, y0), (x1, y1) = _place(w, n_heads, n_kv, n_layers), _place(r, n_heads, n_kv, n_layers)
        ax.plot([x0, x1], [y0, y1], color=KIND_COLOURS.get(kind, "0.5"),
                lw=0.4 + 2.6 * abs(e["score"]) / top, alpha=0.7, zorder=1)  # fmt: skip
        nodes.update([w, r.split(".")[0] if kind in ("q", "in") else r])
    for name in nodes:
        x, y = _place(name, n_heads, n_kv, n_layers)
        ax.scatter([x], [y], s=28, color="white", edgecolor="k", zorder=2)
        ax.annotate(name, (x, y), fontsize=6, ha="center", va="bottom", xytext=(0, 3),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlim(-1, n_heads + 1.5)
    ax.set_ylim(-1.6, n_layers + 0.6)
    ax.set_xlabel("head (MLP: right of the heads; KV head: below its group)")
    ax.set_ylabel("layer")
    handles = [Line2D([], [], color=c, label=k) for k, c in KIND_COLOURS.items()]
    ax.legend(
        handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), title="reads",
        title_fontsize=7,
    )  # fmt: skip
    ax.set_title(
        f"{circuit.get('n_edges', 0)} edges of {circuit.get('of_edges', '?')} (top "
        f"{100 * circuit.get('share', 0):.3g}% by {circuit.get('ranked_by', '?')}), f = "
        f"{circuit.get('faithfulness', float('nan')):.3f}",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def save_discover_figures(run_dir: Path, meta: dict, formats=None) -> list[str]:
    """``curve`` and ``circuit`` in each of ``formats`` (default png), from ``run_dir``'s tables."""
    run_dir = Path(run_dir)
    curve = pd.read_csv(run_dir / "curve.csv")
    circuit = json.loads((run_dir / "circuit.json").read_text())
    written = []
    for name, fig in (
        ("curve", curve_figure(curve, meta)),
        ("circuit", circuit_figure(circuit, meta)),
    ):
        save_figure(fig, run_dir / f"{name}.png", formats=formats)
        written += [f"{name}.{fmt}" for fmt in formats or ("png",)]
    return written
