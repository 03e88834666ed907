"""Figures of a patching run, from its tables alone (never the model): matplotlib Figures, no
pyplot.

The grids are :mod:`headscope.report.figures`' (:func:`~headscope.report.figures.draw_matrix`,
:func:`~headscope.report.figures.write_cells`): x = head, y = layer with layer 0 at the top.

* :func:`effect_heatmap`: layer x head (KV heads for group-mode k/v) of one (activation, position,
  direction) slice, a fixed diverging range -1..1 (the effect is a share of the clean-corrupt
  gap: 0 carries nothing, 1 everything; values beyond are clipped in colour and written in the
  cell), values written on strong cells (|effect| >= :data:`STRONG`);
* :func:`position_grid`: the heads with the largest |effect| at any single position, by position
  (columns labelled with the first pair's tokens);
* :func:`dla_heatmap`: every head's direct logit attribution, logit units, symmetric around 0.

:func:`save_patch_figures` writes all of them into a run directory (:func:`figure_name` names them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headscope.files import figure_files, save_figure
from headscope.report.figures import draw_matrix, write_cells

CMAP = "RdBu_r"
STRONG = 0.1
WHAT = {"denoising": "share of the gap restored", "noising": "share of the gap destroyed"}


def _select(table: pd.DataFrame, **where) -> pd.DataFrame:
    sub = table
    for k, v in where.items():
        if v is not None:
            sub = sub[sub[k].astype(str) == str(v)]
    if sub.empty:
        raise ValueError(f"No rows for {where}.")
    return sub


def _estimator(sub: pd.DataFrame, estimator: str | None) -> str:
    """The estimator drawn: the one asked for, else exact where the slice has exact rows."""
    if estimator is not None:
        return estimator
    return "exact" if (sub["estimator"] == "exact").any() else "attribution"


def _size(n_rows: int, n_cols: int) -> tuple[float, float]:
    return max(4.0, 0.5 * n_cols + 2.5), max(3.0, 0.28 * n_rows + 1.5)


def effect_heatmap(
    table: pd.DataFrame,
    activation: str,
    position: str = "all",
    direction: str = "denoising",
    estimator: str | None = None,
    kv_mode: str | None = None,
    model: str = "",
) -> Figure:
    """Layer x head heatmap of one (activation, position, direction[, estimator, kv_mode]) slice.

    ``estimator`` None: exact where the slice has exact rows (heads not patched exactly are blank),
    else attribution. k/v rows of both kv modes need ``kv_mode``."""
    sub = _select(
        table, activation=activation, position=position, direction=direction, kv_mode=kv_mode
    )
    estimator = _estimator(sub, estimator)
    sub = _select(sub, estimator=estimator)
    if sub["kv_mode"].nunique() > 1:
        raise ValueError(f"{activation} has rows of both kv modes; pass kv_mode='group' or 'head'.")
    grid = sub.pivot_table(
        index="layer", columns="head", values="effect", aggfunc="first", dropna=False
    )
    values = grid.to_numpy(float)
    fig = Figure(figsize=_size(*values.shape), layout="constrained")
    ax = fig.add_subplot()
    im = draw_matrix(ax, np.clip(values, -1.0, 1.0), CMAP, -1.0, 1.0)
    write_cells(ax, values, np.nan_to_num(np.abs(values)) >= STRONG, dark=lambda v: abs(v) > 0.6)
    kv = "KV" in str(sub["head_name"].iloc[0])
    if kv:
        ax.set_xlabel("KV head (its query heads all read the patch)")
    mode = f", kv_mode={sub['kv_mode'].iloc[0]}" if activation in ("k", "v") else ""
    blank = (
        " (blank: not patched exactly)" if estimator == "exact" and np.isnan(values).any() else ""
    )
    label = "estimate (attribution)" if estimator == "attribution" else "exact"
    ax.set_title(
        f"{model + ': ' if model else ''}{sub['task'].iloc[0]}, {activation} at {position}{mode}\n"
        f"{direction}, {label}, n = {int(sub['n_pairs'].iloc[0])} pairs{blank}",
        fontsize=9,
    )
    fig.colorbar(
        im, ax=ax, shrink=0.8, label=f"{WHAT[direction]}; 0 = carries nothing, 1 = everything"
    )
    return fig


def position_grid(
    table: pd.DataFrame,
    activation: str = "z",
    direction: str = "denoising",
    estimator: str | None = None,
    kv_mode: str | None = None,
    tokens: list[str] | None = None,
    top: int = 20,
    model: str = "",
) -> Figure:
    """The ``top`` heads by largest |effect| at any single token position, by position."""
    sub = table[table["position"].astype(str).str.isdigit()]
    sub = _select(sub, activation=activation, direction=direction, kv_mode=kv_mode)
    estimator = _estimator(sub, estimator)
    sub = _select(sub, estimator=estimator).assign(p=lambda d: d["position"].astype(int))
    grid = sub.pivot_table(index="head_name", columns="p", values="effect", aggfunc="first")
    order = grid.abs().max(axis=1).sort_values(ascending=False).index[:top]
    grid = grid.loc[order]
    values = grid.to_numpy(float)
    fig = Figure(
        figsize=(max(5.0, 0.55 * values.shape[1] + 2.5), max(3.0, 0.3 * len(grid) + 1.8)),
        layout="constrained",
    )
    ax = fig.add_subplot()
    im = draw_matrix(ax, np.clip(values, -1.0, 1.0), CMAP, -1.0, 1.0)
    write_cells(ax, values, np.nan_to_num(np.abs(values)) >= STRONG, dark=lambda v: abs(v) > 0.6)
    cols = list(grid.columns)
    ax.set_xticks(
        range(len(cols)),
        [f"{p}\n{tokens[p]!r}" if tokens and p < len(tokens) else str(p) for p in cols],
        fontsize=6,
    )
    ax.set_yticks(range(len(grid)), list(grid.index), fontsize=7)
    ax.set_xlabel("position (token of pair 0's clean prompt)")
    ax.set_ylabel("head")
    label = "estimate (attribution)" if estimator == "attribution" else "exact"
    ax.set_title(
        f"{model + ': ' if model else ''}{sub['task'].iloc[0]}, {activation} by position, "
        f"{direction}, "
        f"{label}\ntop {len(grid)} heads by max |effect|, n = {int(sub['n_pairs'].iloc[0])} pairs",
        fontsize=9,
    )
    fig.colorbar(
        im, ax=ax, shrink=0.8, label=f"{WHAT[direction]}; 0 = carries nothing, 1 = everything"
    )
    return fig


def dla_heatmap(dla: pd.DataFrame, prompt: str = "clean", model: str = "") -> Figure:
    """Layer x head heatmap of the direct logit attribution (logit units) on one prompt side."""
    sub = _select(dla, prompt=prompt)
    values = sub.pivot_table(index="layer", columns="head", values="dla", aggfunc="first").to_numpy(
        float
    )
    lim = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    lim = lim or 1.0
    fig = Figure(figsize=_size(*values.shape), layout="constrained")
    ax = fig.add_subplot()
    im = draw_matrix(ax, values, CMAP, -lim, lim)
    write_cells(
        ax, values, np.nan_to_num(np.abs(values)) >= 0.25 * lim, dark=lambda v: abs(v) > 0.6 * lim
    )
    ax.set_title(
        f"{model + ': ' if model else ''}{sub['task'].iloc[0]}, direct logit attribution at the "
        f"last position\n{prompt} prompts, n = {int(sub['n_pairs'].iloc[0])} pairs",
        fontsize=9,
    )
    fig.colorbar(
        im, ax=ax, shrink=0.8, label="logit[answer] - logit[wrong] written directly (logits)"
    )
    return fig


def figure_slices(table: pd.DataFrame) -> list[dict]:
    """Every (activation, position, direction, kv_mode, estimator) slice that gets a heatmap
    (single token positions are drawn in the position grid instead)."""
    named = table[~table["position"].astype(str).str.isdigit()]
    keys = named[["activation", "position", "direction", "kv_mode", "estimator"]].drop_duplicates()
    return [dict(zip(keys.columns, row, strict=True)) for row in keys.itertuples(index=False)]


def figure_name(s: dict) -> str:
    """The file of one slice's heatmap: ``z-all-denoising-exact.png``,
    ``v-group-S2-noising-attribution.png`` (``position`` ``by-position`` for the grid)."""
    mode = f"-{s['kv_mode']}" if s["activation"] in ("k", "v") else ""
    return f"{s['activation']}{mode}-{s['position']}-{s['direction']}-{s['estimator']}.png"


def save_patch_figures(
    table: pd.DataFrame,
    dla: pd.DataFrame | None,
    out: str | Path,
    model: str = "",
    tokens: list[str] | None = None,
    formats: Sequence[str] | None = None,
) -> list[str]:
    """Every figure of a patching run into ``out``, each as png (the default) or as each of
    ``formats`` (png, svg, pdf); returns the file names."""
    out = Path(out)
    names: list[str] = []

    def save(fig, name: str) -> None:
        save_figure(fig, out / name, formats=formats)
        names.extend(p.name for p in figure_files(out / name, formats))

    for s in figure_slices(table):
        save(effect_heatmap(table, model=model, **s), figure_name(s))
    grid = table[table["position"].astype(str).str.isdigit()]
    for (act, direction, kv, est), _ in grid.groupby(
        ["activation", "direction", "kv_mode", "estimator"]
    ):
        name = figure_name(
            {
                "activation": act,
                "kv_mode": kv,
                "position": "by-position",
                "direction": direction,
                "estimator": est,
            }
        )
        save(
            position_grid(table, act, direction, est, kv_mode=kv, tokens=tokens, model=model), name
        )
    if dla is not None and len(dla):
        for prompt in dla["prompt"].unique():
            name = "dla.png" if prompt == "clean" else f"dla-{prompt}.png"
            save(dla_heatmap(dla, prompt, model=model), name)
    return names
