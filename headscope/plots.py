"""Matplotlib figures from a report table; never needs the model, never touches pyplot state.

Conventions: x = head, y = layer with layer 0 at the top, a fixed 0-1 colour range (entropy: 0 to
the largest value, in nats), values written on the labelled cells (those that pass the run's
threshold, as its ``label`` column says), model and n in the title.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headscope.metrics import REGISTRY
from headscope.outputs import save_figure
from headscope.result import matrix


def _range(metric: str, values: np.ndarray) -> tuple[float, float]:
    if metric == "entropy":
        top = np.nanmax(values) if np.isfinite(values).any() else 1.0
        return 0.0, float(max(1.0, math.ceil(top)))
    return 0.0, 1.0


def draw_heatmap(ax, scores: pd.DataFrame, metric: str, annotate: bool = True, title: str | None = None):
    """Draw one metric's layer x head heatmap on ``ax``; return the image (for a colour bar)."""
    mat = matrix(scores, metric)
    values = mat.to_numpy(dtype=float)
    vmin, vmax = _range(metric, values)
    below = REGISTRY[metric].below if metric in REGISTRY else False
    im = ax.imshow(values, cmap="viridis_r" if below else "viridis", vmin=vmin, vmax=vmax,
                   aspect="auto", interpolation="nearest")  # row 0 (layer 0) at the top
    n_layers, n_heads = values.shape
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    ax.tick_params(labelsize=7 if max(n_layers, n_heads) > 16 else 9)
    if annotate and n_layers * n_heads <= 400:
        labelled = _labelled(scores, metric)  # [layer, head]
        for (layer, head), v in np.ndenumerate(values):
            if np.isfinite(v) and labelled[layer, head]:
                ax.text(head, layer, f"{v:.2f}", ha="center", va="center", fontsize=6,
                        color="black" if (v - vmin) / (vmax - vmin + 1e-9) > 0.6 else "white")
    if np.isnan(values).all():
        reason = REGISTRY[metric].nan_reason if metric in REGISTRY else None
        ax.text(0.5, 0.5, "NaN: " + (reason or "not measurable").split(":")[0], transform=ax.transAxes,
                ha="center", va="center", fontsize=9, wrap=True)
    if title is not None:
        ax.set_title(title, fontsize=10)
    return im


def _labelled(scores: pd.DataFrame, metric: str) -> np.ndarray:
    """``[layer, head]`` booleans: the heads the table labels for ``metric`` (its run's thresholds);
    a table without labels falls back to the metric's default threshold."""
    sub = scores[scores["metric"] == metric]
    if "label" in sub.columns:
        flags = sub.assign(on=sub["label"].fillna("").astype(str) != "")
    else:
        m = REGISTRY.get(metric)
        flags = sub.assign(on=[bool(m and m.passes(v)) for v in sub["score"]])
    return flags.pivot(index="layer", columns="head", values="on").to_numpy(dtype=bool)


def heatmap(scores: pd.DataFrame, metric: str, n_sequences: int | None = None) -> Figure:
    """A layer x head heatmap of one metric, titled with the model and n."""
    sub = scores[scores["metric"] == metric]
    n_layers, n_heads = sub["layer"].nunique(), sub["head"].nunique()
    fig = Figure(figsize=(max(4.0, 0.45 * n_heads + 2.5), max(3.0, 0.3 * n_layers + 1.5)), layout="constrained")
    ax = fig.add_subplot()
    model = sub["model"].iloc[0]
    n_pairs = int(sub["n"].iloc[0])
    seqs = f"{n_sequences} seqs, " if n_sequences else ""
    unit = " (nats)" if metric == "entropy" else ""
    im = draw_heatmap(ax, scores, metric, title=f"{model}: {metric}{unit}\n{seqs}n = {n_pairs} queries")
    fig.colorbar(im, ax=ax, shrink=0.8)
    return fig


def summary_figure(scores: pd.DataFrame) -> Figure:
    """All metrics' heatmaps side by side, one panel each."""
    metrics = list(scores["metric"].unique())
    cols = min(4, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    n_layers = scores["layer"].nunique()
    fig = Figure(figsize=(3.6 * cols, max(3.0, 0.16 * n_layers + 1.2) * rows), layout="constrained")
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(rows, cols, i + 1)
        im = draw_heatmap(ax, scores, metric, annotate=False, title=metric)
        fig.colorbar(im, ax=ax, shrink=0.7)
    fig.suptitle(f"{scores['model'].iloc[0]}: every head, every behaviour")
    return fig


def save_figures(scores: pd.DataFrame, out: str | Path, n_sequences: dict[str, int] | None = None,
                 dpi: int = 110) -> list[Path]:
    """Write ``<metric>.png`` for every metric and ``summary.png``; return the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric in scores["metric"].unique():
        probe = scores.loc[scores["metric"] == metric, "probe"].iloc[0]
        fig = heatmap(scores, metric, (n_sequences or {}).get(probe))
        paths.append(save_figure(fig, out / f"{metric}.png", dpi))
    paths.append(save_figure(summary_figure(scores), out / "summary.png", dpi))
    return paths


def figure_names(scores: pd.DataFrame) -> list[str]:
    """The files :func:`save_figures` writes for ``scores``."""
    return [f"{m}.png" for m in scores["metric"].unique()] + ["summary.png"]
