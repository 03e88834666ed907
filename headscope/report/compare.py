"""The figures of ``headscope compare``, from the runs' score tables alone (never a model): each
metric's distribution of head scores per run, and (two runs of one shape) the per-head
difference."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headscope.errors import HeadscopeError


def metric_order(runs: dict[str, pd.DataFrame]) -> list[str]:
    """Every metric of any run, in the order first seen."""
    return list(dict.fromkeys(m for s in runs.values() for m in s["metric"].unique()))


def same_shape(runs: dict[str, pd.DataFrame]) -> bool:
    """Whether every run has the same set of (layer, head) pairs."""
    shapes = [set(zip(s["layer"], s["head"], strict=True)) for s in runs.values()]
    return all(sh == shapes[0] for sh in shapes[1:])


def _vrange(metric: str, values: np.ndarray) -> tuple[float, float]:
    if metric == "entropy" and np.isfinite(values).any():
        return 0.0, float(max(1.0, math.ceil(np.nanmax(values))))
    return 0.0, 1.0


def distribution_figure(runs: dict[str, pd.DataFrame]) -> Figure:
    """Per metric, each run's head scores as a box with every head drawn as a dot; chance as a
    dash."""
    metrics = metric_order(runs)
    labels = list(runs)
    cols = min(4, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    width = max(3.2, 0.9 * len(labels) + 1.5)
    fig = Figure(figsize=(width * cols, 3.4 * rows), layout="constrained")
    rng = np.random.default_rng(0)  # jitter only; a local generator, no global RNG
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(rows, cols, i + 1)
        values = [
            runs[la].loc[runs[la]["metric"] == metric, "score"].to_numpy(dtype=float)
            for la in labels
        ]
        finite = [v[np.isfinite(v)] for v in values]
        pos = [j for j, v in enumerate(finite) if len(v)]
        if pos:
            ax.boxplot(
                [finite[j] for j in pos],
                positions=pos,
                widths=0.5,
                showfliers=False,
                medianprops={"color": "black"},
            )
        for j, v in enumerate(finite):
            ax.scatter(
                j + rng.uniform(-0.15, 0.15, len(v)),
                v,
                s=8,
                alpha=0.6,
                color=f"C{j % 10}",
                zorder=3,
                label=labels[j],
            )
            sub = runs[labels[j]][runs[labels[j]]["metric"] == metric]
            if len(sub) and np.isfinite(sub["chance"].iloc[0]):
                ax.hlines(
                    float(sub["chance"].iloc[0]), j - 0.35, j + 0.35, colors="grey", linestyles="--"
                )
            if len(sub) and not len(v):
                ax.text(
                    j,
                    0.5,
                    "NaN",
                    ha="center",
                    va="center",
                    fontsize=8,
                    transform=ax.get_xaxis_transform(),
                )
        lo, hi = _vrange(metric, np.concatenate(values))
        ax.set_ylim(lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo))
        ax.set_xticks(
            range(len(labels)),
            labels,
            rotation=30 if len(labels) > 2 else 0,
            ha="right" if len(labels) > 2 else "center",
            fontsize=8,
        )
        ax.set_xlim(-0.6, len(labels) - 0.4)
        ax.set_title(metric + (" (nats)" if metric == "entropy" else ""), fontsize=10)
    fig.suptitle("head scores per run (dot = one head, dashed = chance)")
    return fig


def difference_limit(d: np.ndarray) -> float:
    """The colour range of a difference heatmap: the largest |difference|, rounded up to 1, 2 or 5
    times a power of ten, so seed-to-seed differences of 0.05 are as visible as model-to-model 0.8.

    >>> difference_limit(np.array([0.03, -0.12])), difference_limit(np.array([0.0]))
    (0.2, 0.001)
    """
    top = float(np.nanmax(np.abs(d))) if np.isfinite(d).any() else 0.0
    if top <= 1e-3:
        return 1e-3
    scale = 10 ** math.floor(math.log10(top))
    return next(m * scale for m in (1, 2, 5, 10) if top <= m * scale + 1e-12)


def difference_figure(runs: dict[str, pd.DataFrame]) -> Figure:
    """Two runs of the same shape: per metric, a layer x head heatmap of ``second - first``, its
    colour range the metric's largest difference (written in the colour bar's label)."""
    from headscope.report.figures import draw_matrix, write_cells

    if len(runs) != 2 or not same_shape(runs):
        raise HeadscopeError(
            "A difference heatmap needs exactly two runs with the same layers x heads."
        )
    (la, a), (lb, b) = runs.items()
    metrics = [
        m for m in metric_order(runs) if (a["metric"] == m).any() and (b["metric"] == m).any()
    ]
    cols = min(4, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    n_layers, n_heads = a["layer"].nunique(), a["head"].nunique()
    fig = Figure(
        figsize=(max(3.4, 0.3 * n_heads + 2.0) * cols, max(2.8, 0.18 * n_layers + 1.4) * rows),
        layout="constrained",
    )
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(rows, cols, i + 1)
        pa = a[a["metric"] == metric].pivot(index="layer", columns="head", values="score")
        pb = b[b["metric"] == metric].pivot(index="layer", columns="head", values="score")
        d = (pb - pa).to_numpy(dtype=float)  # [layer, head]
        lim = difference_limit(d)
        im = draw_matrix(ax, d, "RdBu_r", -lim, lim)
        if n_layers * n_heads <= 400:
            write_cells(
                ax,
                d,
                np.abs(np.nan_to_num(d)) >= 0.25 * lim,
                fmt="{:+.2f}",
                dark=lambda v, lim=lim: abs(v) > 0.6 * lim,
            )
        if not np.isfinite(d).any():
            ax.text(0.5, 0.5, "NaN", transform=ax.transAxes, ha="center", va="center")
        ax.set_title(metric, fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.7, label=f"{lb} - {la} (range +-{lim:g})")
    fig.suptitle(f"per-head score difference: {lb} - {la}")
    return fig
