"""Matplotlib figures from a report table; never needs the model, never touches pyplot state.

Conventions: x = head, y = layer with layer 0 at the top, a fixed 0-1 colour range (entropy: 0 to
the largest value, in nats; causal effects: a diverging map centred on 0, no effect), values
written on the labelled cells (those that pass the run's threshold, as its ``label`` column says),
model and n in the title. With effects, one more figure per behaviour: each head's pattern score
against its effect (:func:`effect_scatter`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from headscope.catalog import describe, is_below
from headscope.metrics import REGISTRY
from headscope.outputs import save_figure
from headscope.result import matrix
from headscope.uncertainty import STABLE


def is_effect(metric: str) -> bool:
    return metric.startswith(("effect_", "attribution_"))


def _range(metric: str, values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if metric == "entropy":
        top = finite.max() if finite.size else 1.0
        return 0.0, float(max(1.0, math.ceil(top)))
    if is_effect(metric):  # centred on "no effect"
        lim = float(np.abs(finite).max()) if finite.size else 1.0
        return -(lim or 1.0), lim or 1.0
    return 0.0, 1.0


def _cmap(metric: str) -> str:
    return "RdBu_r" if is_effect(metric) else "viridis_r" if is_below(metric) else "viridis"


def draw_heatmap(ax, scores: pd.DataFrame, metric: str, annotate: bool = True, title: str | None = None):
    """Draw one metric's layer x head heatmap on ``ax``; return the image (for a colour bar)."""
    mat = matrix(scores, metric)
    values = mat.to_numpy(dtype=float)
    vmin, vmax = _range(metric, values)
    im = ax.imshow(values, cmap=_cmap(metric), vmin=vmin, vmax=vmax,
                   aspect="auto", interpolation="nearest")  # row 0 (layer 0) at the top
    n_layers, n_heads = values.shape
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    ax.tick_params(labelsize=7 if max(n_layers, n_heads) > 16 else 9)
    if annotate and n_layers * n_heads <= 400:
        labelled = _labelled(scores, metric)  # [layer, head]
        shaky = _unstable(scores, metric) & labelled  # [layer, head]: labels that depend on the draw
        for (layer, head) in zip(*np.nonzero(shaky), strict=True):
            ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, hatch="////", edgecolor="white",
                                   linewidth=0))
        for (layer, head), v in np.ndenumerate(values):
            if np.isfinite(v) and labelled[layer, head]:
                dark = abs(v) / (vmax + 1e-9) > 0.6 if is_effect(metric) else (v - vmin) / (vmax - vmin + 1e-9) <= 0.6
                ax.text(head, layer, f"{v:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if dark else "black")
    if np.isnan(values).all():
        info = describe(metric)
        reason = info.nan_reason if info is not None else None
        ax.text(0.5, 0.5, "NaN: " + (reason or "not measurable").split(":")[0], transform=ax.transAxes,
                ha="center", va="center", fontsize=9, wrap=True)
    if title is not None:
        ax.set_title(title, fontsize=10)
    return im


def _unstable(scores: pd.DataFrame, metric: str) -> np.ndarray:
    """``[layer, head]``: labels whose bootstrap stability is under ``STABLE`` (hatched)."""
    sub = scores[scores["metric"] == metric]
    if "stability" not in sub.columns:
        return np.zeros((sub["layer"].nunique(), sub["head"].nunique()), dtype=bool)
    st = sub.pivot(index="layer", columns="head", values="stability").to_numpy(dtype=float)
    return np.nan_to_num(st, nan=1.0) < STABLE


def _labelled(scores: pd.DataFrame, metric: str) -> np.ndarray:
    """``[layer, head]`` booleans: the heads the table labels for ``metric`` (its run's thresholds);
    a table without labels falls back to the metric's default threshold."""
    sub = scores[scores["metric"] == metric]
    if "label" in sub.columns:
        flags = sub.assign(on=sub["label"].fillna("").astype(str) != "")
    else:
        m = describe(metric)
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
    info = describe(metric)
    pattern = metric in REGISTRY  # effects and circuit scores use a subset of the sequences
    seqs = f"{n_sequences} seqs, " if n_sequences and pattern else ""
    unit = " (nats)" if metric == "entropy" else f" ({info.unit})" if getattr(info, "unit", "") else ""
    what = "target tokens" if is_effect(metric) else "queries" if pattern else "positions"
    shaky = "stability" in sub and bool(((sub["stability"] < STABLE) & (sub["label"] != "")).any())
    note = f"; hatched: label stability < {STABLE}" if shaky else ""
    im = draw_heatmap(ax, scores, metric, title=f"{model}: {metric}{unit}\n{seqs}n = {n_pairs} {what}{note}")
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


def effect_pairs(scores: pd.DataFrame) -> list[tuple[str, str]]:
    """``(pattern metric, effect metric)`` pairs a scatter is drawn for: every score that is not an
    effect, against the effect measured on its probe (encoders: the embedding effect, text probe)."""
    effects = [m for m in scores["metric"].unique() if m.startswith("effect_")]
    pairs = []
    for metric in scores["metric"].unique():
        if is_effect(metric) or scores.loc[scores["metric"] == metric, "score"].isna().all():
            continue
        probe = scores.loc[scores["metric"] == metric, "probe"].iloc[0]
        same = [e for e in effects if scores.loc[scores["metric"] == e, "probe"].iloc[0] == probe]
        if same:
            pairs.append((metric, same[0]))
    return pairs


def effect_scatter(scores: pd.DataFrame, metric: str, effect: str) -> Figure:
    """Every head's ``metric`` score (x) against its ``effect`` (y); labelled heads are named.

    Filled dots are exact effects, open dots attribution estimates; the dashed line is no effect.
    Where a weight is not importance, a head sits far right on the zero line."""
    a = scores[scores["metric"] == metric][["head_name", "score", "label"]]
    b = scores[scores["metric"] == effect][["head_name", "score", "label"] + (["estimator"] if "estimator" in scores else [])]
    both = a.merge(b, on="head_name", suffixes=("_x", "_y")).set_index("head_name")  # one row per head
    fig = Figure(figsize=(6.0, 4.6), layout="constrained")
    ax = fig.add_subplot()
    exact = both["estimator"] == "exact" if "estimator" in both else pd.Series(True, index=both.index)
    ax.scatter(both.loc[exact, "score_x"], both.loc[exact, "score_y"], s=18, color="C0", label="exact", zorder=3)
    if (~exact).any():
        ax.scatter(both.loc[~exact, "score_x"], both.loc[~exact, "score_y"], s=18, facecolors="none",
                   edgecolors="C1", label="attribution estimate", zorder=3)
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=0.8)
    named = both[(both["label_x"] != "") | (both["label_y"] != "")]
    for name, r in named.iterrows():
        ax.annotate(name, (r["score_x"], r["score_y"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    unit = getattr(describe(effect), "unit", "")
    ax.set_xlabel(f"{metric} score")
    ax.set_ylabel(f"{effect}" + (f" ({unit})" if unit else ""))
    ax.set_title(f"{scores['model'].iloc[0]}: where a head looks vs what ablating it does", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    return fig


def threshold_sweep(scores: pd.DataFrame, thresholds: dict[str, float] | None = None) -> Figure:
    """Labelled heads against the threshold, one panel per labelled behaviour, the run's threshold
    marked: how much a label count depends on where the cut falls."""
    thresholds = thresholds or {}
    metrics = [m for m in scores["metric"].unique()
               if getattr(describe(m), "label", "") and scores.loc[scores["metric"] == m, "score"].notna().any()]
    cols = min(4, max(1, len(metrics)))
    rows = max(1, math.ceil(len(metrics) / cols))
    fig = Figure(figsize=(3.4 * cols, 2.8 * rows), layout="constrained")
    for i, metric in enumerate(metrics):
        info = describe(metric)
        values = scores.loc[scores["metric"] == metric, "score"].dropna().to_numpy(dtype=float)
        lo, hi = _range(metric, values) if not is_effect(metric) else (min(0.0, values.min()), values.max())
        grid = np.linspace(lo, hi, 101)
        counts = [(values <= t).sum() if info.below else (values >= t).sum() for t in grid]
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.plot(grid, counts, color="C0")
        t = thresholds.get(metric, info.threshold)
        ax.axvline(t, color="C3", linestyle="--", linewidth=1)
        n = int((values <= t).sum() if info.below else (values >= t).sum())
        ax.set_title(f"{metric}: {n} at {'<=' if info.below else '>='} {t:g}", fontsize=9)
        ax.set_xlabel("threshold", fontsize=8)
        ax.set_ylabel("heads labelled", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"{scores['model'].iloc[0]}: labelled heads against the threshold")
    return fig


def save_figures(scores: pd.DataFrame, out: str | Path, n_sequences: dict[str, int] | None = None,
                 dpi: int = 110, thresholds: dict[str, float] | None = None) -> list[Path]:
    """Write ``<metric>.png`` for every metric, ``summary.png``, ``thresholds.png`` (labelled heads
    against the threshold) and, with effects, one ``<metric>_vs_<effect>.png`` scatter per
    behaviour; return the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric in scores["metric"].unique():
        probe = scores.loc[scores["metric"] == metric, "probe"].iloc[0]
        fig = heatmap(scores, metric, (n_sequences or {}).get(probe))
        paths.append(save_figure(fig, out / f"{metric}.png", dpi))
    paths.append(save_figure(summary_figure(scores), out / "summary.png", dpi))
    paths.append(save_figure(threshold_sweep(scores, thresholds), out / "thresholds.png", dpi))
    for metric, effect in effect_pairs(scores):
        paths.append(save_figure(effect_scatter(scores, metric, effect), out / f"{metric}_vs_{effect}.png", dpi))
    return paths


def figure_names(scores: pd.DataFrame) -> list[str]:
    """The files :func:`save_figures` writes for ``scores``."""
    return ([f"{m}.png" for m in scores["metric"].unique()] + ["summary.png", "thresholds.png"]
            + [f"{m}_vs_{e}.png" for m, e in effect_pairs(scores)])
