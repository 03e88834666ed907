"""Matplotlib figures from a report table; never needs the model, never touches pyplot state.

Conventions: x = head, y = layer with layer 0 at the top, a fixed 0-1 colour range (entropy: 0 to
the largest value, in nats; causal effects: a diverging map centred on 0, no effect), values
written on the labelled cells (those that pass the run's threshold, as its ``label`` column says),
model and n in the title. With effects, one more figure per behaviour: each head's pattern score
against its effect (:func:`effect_scatter`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import patheffects
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from headscope.catalog import describe, is_below, pattern_names
from headscope.files import figure_files, figure_formats, save_figure
from headscope.result import HeadPattern, matrix
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


def draw_matrix(ax, values: np.ndarray, cmap: str, vmin: float, vmax: float):
    """A layer x head grid on ``ax``: x = head, y = layer with layer 0 at the top; return the
    image."""
    im = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    n_layers, n_heads = values.shape
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    # tick labels as large as a row (column) allows, 5-9 points: 30 layers on a tall panel read
    # at 9 points where a fixed 7 came out tiny
    fig_w, fig_h = ax.figure.get_size_inches()
    pos = ax.get_position()
    row = fig_h * pos.height * 72 / max(n_layers, 1)  # points per layer
    col = fig_w * pos.width * 72 / max(n_heads, 1)  # points per head
    ax.tick_params(axis="y", labelsize=float(np.clip(0.7 * row, 5.0, 9.0)))
    ax.tick_params(axis="x", labelsize=float(np.clip(0.45 * col, 5.0, 9.0)))
    return im


def write_cells(ax, values: np.ndarray, show: np.ndarray, fmt: str = "{:.2f}", dark=None) -> None:
    """Write the values of the cells ``show`` (``[layer, head]`` booleans), sized to fit a cell,
    with a halo so they stay readable over any colour (and any hatching). ``dark(v)``: white ink.
    Each value is two texts: its halo (a stroke only, in ``path_effects``) and the value itself."""
    size = _cell_font(ax, *values.shape)
    for (layer, head), v in np.ndenumerate(values):
        if np.isfinite(v) and show[layer, head]:
            ink, halo = ("white", "black") if dark is not None and dark(v) else ("black", "white")
            # the halo drawn apart (a stroke only), so the value itself stays text in SVG and PDF
            ax.text(
                head,
                layer,
                fmt.format(v),
                ha="center",
                va="center",
                fontsize=size,
                color=ink,
                path_effects=[patheffects.Stroke(linewidth=1.5, foreground=halo, alpha=0.8)],
            )
            ax.text(head, layer, fmt.format(v), ha="center", va="center", fontsize=size, color=ink)


def draw_heatmap(
    ax, scores: pd.DataFrame, metric: str, annotate: bool = True, title: str | None = None
):
    """Draw one metric's layer x head heatmap on ``ax``; return the image (for a colour bar)."""
    values = matrix(scores, metric).to_numpy(dtype=float)
    vmin, vmax = _range(metric, values)
    im = draw_matrix(ax, values, _cmap(metric), vmin, vmax)
    n_layers, n_heads = values.shape
    if annotate and n_layers * n_heads <= 400:
        labelled = _labelled(scores, metric)  # [layer, head]
        # [layer, head]: labels that depend on the draw
        shaky = _unstable(scores, metric) & labelled
        for layer, head in zip(*np.nonzero(shaky), strict=True):
            ax.add_patch(
                Rectangle(
                    (head - 0.5, layer - 0.5),
                    1,
                    1,
                    fill=False,
                    hatch="///",
                    edgecolor="0.55",
                    linewidth=0,
                    alpha=0.7,
                )
            )
        if is_effect(metric):
            write_cells(ax, values, labelled, dark=lambda v: abs(v) / (vmax + 1e-9) > 0.6)
        else:
            write_cells(
                ax, values, labelled, dark=lambda v: (v - vmin) / (vmax - vmin + 1e-9) <= 0.6
            )
    if np.isnan(values).all():
        info = describe(metric)
        reason = info.nan_reason if info is not None else None
        ax.text(
            0.5,
            0.5,
            "NaN: " + (reason or "not measurable").split(":")[0],
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9,
            wrap=True,
        )
    if title is not None:
        ax.set_title(title, fontsize=10)
    return im


def _cell_font(ax, n_rows: int, n_cols: int) -> float:
    """A font size (points) that fits "0.88" in one cell of an ``n_rows x n_cols`` grid on
    ``ax``."""
    fig_w, fig_h = ax.figure.get_size_inches()
    pos = ax.get_position()
    cell_w = fig_w * pos.width * 72 / max(n_cols, 1)  # points
    cell_h = fig_h * pos.height * 72 / max(n_rows, 1)
    return float(np.clip(min(cell_w / 2.6, cell_h * 0.8), 5.0, 10.0))


def colour_label(metric: str) -> str:
    """What a heatmap's colour bar measures: the score, its unit, and its scale."""
    info = describe(metric)
    unit = getattr(info, "unit", "") or ""
    if is_effect(metric):
        return f"{metric}" + (f" ({unit})" if unit else "") + "; 0 = no effect"
    if metric == "entropy":
        return "entropy (nats); low = focused"
    return f"{metric} score" + (f" ({unit})" if unit else "")


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


def _one_chance(sub: pd.DataFrame) -> float | None:
    """The chance value every head of ``sub`` shares (None: none, or they differ)."""
    if "chance" not in sub:
        return None
    values = pd.to_numeric(sub["chance"], errors="coerce").dropna().unique()
    return float(values[0]) if len(values) == 1 and np.isfinite(values[0]) else None


def heatmap(
    scores: pd.DataFrame,
    metric: str,
    n_sequences: int | None = None,
    thresholds: dict[str, float] | None = None,
) -> Figure:
    """A layer x head heatmap of one metric, titled with the model, n and the chance value (a red
    line on the colour bar too); a key below names the line, the numbers (the labelled heads, with
    the label's cut: the run's ``thresholds``, else the metric's default) and the hatching."""
    sub = scores[scores["metric"] == metric]
    n_layers, n_heads = sub["layer"].nunique(), sub["head"].nunique()
    fig = Figure(
        figsize=(max(4.0, 0.45 * n_heads + 2.5), max(3.0, 0.3 * n_layers + 1.5)),
        layout="constrained",
    )
    ax = fig.add_subplot()
    model = sub["model"].iloc[0]
    n_pairs = int(sub["n"].iloc[0])
    info = describe(metric)
    pattern = metric in pattern_names()  # effects and circuit scores use a subset of the sequences
    seqs = f"{n_sequences} seqs, " if n_sequences and pattern else ""
    unit = (
        " (nats)" if metric == "entropy" else f" ({info.unit})" if getattr(info, "unit", "") else ""
    )
    what = "target tokens" if is_effect(metric) else "queries" if pattern else "positions"
    shaky = "stability" in sub and bool(((sub["stability"] < STABLE) & (sub["label"] != "")).any())
    chance = _one_chance(sub) if not is_effect(metric) else None
    said = f"; chance {chance:.3g}" if chance is not None else ""
    im = draw_heatmap(
        ax, scores, metric, title=f"{model}: {metric}{unit}\n{seqs}n = {n_pairs} {what}{said}"
    )
    bar = fig.colorbar(im, ax=ax, shrink=0.8, label=colour_label(metric))
    keys = []
    if chance is not None and im.norm.vmin <= chance <= im.norm.vmax:
        bar.ax.axhline(chance, color="red", lw=1.2)
        keys.append(Line2D([], [], color="red", lw=1.2, label="red line on the colour bar: chance"))
    n_cells = n_layers * n_heads
    if n_cells <= 400 and _labelled(scores, metric).any():
        cut = ""
        if info is not None and getattr(info, "label", ""):
            t = (thresholds or {}).get(metric, info.threshold)
            cut = f" ({info.label}: {metric} {'<=' if is_below(metric) else '>='} {t:g})"
        keys.append(
            Patch(facecolor="none", edgecolor="none", label=f"numbers: the labelled heads{cut}")
        )
    if shaky:
        keys.append(
            Patch(
                facecolor="none",
                edgecolor="0.45",
                hatch="///",
                label=f"label stability < {STABLE} (bootstrap)",
            )
        )
    if keys:  # below the axes, outside them: never over the "head" axis label
        fig.legend(handles=keys, loc="outside lower center", fontsize=7, frameon=False)
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
        fig.colorbar(im, ax=ax, shrink=0.7, label=colour_label(metric))
    fig.suptitle(f"{scores['model'].iloc[0]}: every head, every behaviour")
    return fig


def effect_pairs(scores: pd.DataFrame) -> list[tuple[str, str]]:
    """``(pattern metric, effect metric)`` pairs a scatter is drawn for: every score that is not an
    effect, against the effect measured on its probe (encoders: the embedding effect, text
    probe)."""
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
    b = scores[scores["metric"] == effect][
        ["head_name", "score", "label"] + (["estimator"] if "estimator" in scores else [])
    ]
    # one row per head
    both = a.merge(b, on="head_name", suffixes=("_x", "_y")).set_index("head_name")
    fig = Figure(figsize=(6.0, 4.6), layout="constrained")
    ax = fig.add_subplot()
    exact = (
        both["estimator"] == "exact" if "estimator" in both else pd.Series(True, index=both.index)
    )
    ax.scatter(
        both.loc[exact, "score_x"],
        both.loc[exact, "score_y"],
        s=18,
        color="C0",
        label="exact",
        zorder=3,
    )
    if (~exact).any():
        ax.scatter(
            both.loc[~exact, "score_x"],
            both.loc[~exact, "score_y"],
            s=18,
            facecolors="none",
            edgecolors="C1",
            label="attribution estimate",
            zorder=3,
        )
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=0.8)
    named = both[(both["label_x"] != "") | (both["label_y"] != "")]
    for name, r in named.iterrows():
        ax.annotate(
            name,
            (r["score_x"], r["score_y"]),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    unit = getattr(describe(effect), "unit", "")
    ax.set_xlabel(f"{metric} score")
    ax.set_ylabel(f"{effect}" + (f" ({unit})" if unit else ""))
    ax.set_title(
        f"{scores['model'].iloc[0]}: where a head looks vs what ablating it does", fontsize=10
    )
    ax.legend(fontsize=8, loc="best")
    return fig


def threshold_sweep(scores: pd.DataFrame, thresholds: dict[str, float] | None = None) -> Figure:
    """Labelled heads against the threshold, one panel per labelled behaviour, the run's threshold
    marked: how much a label count depends on where the cut falls."""
    thresholds = thresholds or {}
    metrics = [
        m
        for m in scores["metric"].unique()
        if getattr(describe(m), "label", "")
        and scores.loc[scores["metric"] == m, "score"].notna().any()
    ]
    cols = min(4, max(1, len(metrics)))
    rows = max(1, math.ceil(len(metrics) / cols))
    fig = Figure(figsize=(3.4 * cols, 2.8 * rows), layout="constrained")
    said: set[bool] = set()  # whether any panel drew a chance line
    for i, metric in enumerate(metrics):
        info = describe(metric)
        values = scores.loc[scores["metric"] == metric, "score"].dropna().to_numpy(dtype=float)
        lo, hi = (
            _range(metric, values)
            if not is_effect(metric)
            else (min(0.0, values.min()), values.max())
        )
        grid = np.linspace(lo, hi, 101)
        counts = [(values <= t).sum() if info.below else (values >= t).sum() for t in grid]
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.plot(grid, counts, color="C0")
        t = thresholds.get(metric, info.threshold)
        ax.axvline(t, color="C3", linestyle="--", linewidth=1)
        chance = scores.loc[scores["metric"] == metric, "chance"].dropna()
        if len(chance) and lo <= float(chance.mean()) <= hi:  # a uniform head's score
            said.add(True)
            ax.axvline(float(chance.mean()), color="0.35", linestyle=":", linewidth=1)
        sign = "<=" if info.below else ">="
        n = int((values <= t).sum() if info.below else (values >= t).sum())
        ax.set_title(f"{metric}: {n} at {sign} {t:g}", fontsize=9)
        unit = getattr(info, "unit", "")
        ax.set_xlabel(f"threshold t{f' ({unit})' if unit else ''}", fontsize=8)
        ax.set_ylabel(f"heads with score {sign} t", fontsize=8)
        ax.tick_params(labelsize=7)
    keys = [
        Line2D([], [], color="C0", label="heads labelled at threshold t"),
        Line2D(
            [], [], color="C3", ls="--", lw=1, label="this run's threshold (count in each title)"
        ),
    ]
    if said:
        keys.append(
            Line2D(
                [],
                [],
                color="0.35",
                ls=":",
                lw=1,
                label="chance: a uniform head's score (its mean where it varies by layer)",
            )
        )
    skipped = [
        m
        for m in scores["metric"].unique()
        if getattr(describe(m), "label", "")
        and scores.loc[scores["metric"] == m, "score"].isna().all()
    ]
    if skipped:  # a labelled behaviour this model cannot have: said, not silently missing
        keys.append(
            Line2D([], [], ls="", label=f"not drawn (NaN for every head): {', '.join(skipped)}")
        )
    fig.legend(handles=keys, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"{scores['model'].iloc[0]}: labelled heads against the threshold")
    return fig


def save_figures(
    scores: pd.DataFrame,
    out: str | Path,
    n_sequences: dict[str, int] | None = None,
    dpi: int = 110,
    thresholds: dict[str, float] | None = None,
    formats: Sequence[str] = ("png",),
) -> list[Path]:
    """Write ``<metric>.png`` for every metric, ``summary.png``, ``thresholds.png`` (labelled heads
    against the threshold) and, with effects, one ``<metric>_vs_<effect>.png`` scatter per
    behaviour, each in every one of ``formats`` (png, svg, pdf); return the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(fig: Figure, name: str) -> None:
        save_figure(fig, out / name, dpi, formats)
        paths.extend(figure_files(out / name, formats))

    for metric in scores["metric"].unique():
        probe = scores.loc[scores["metric"] == metric, "probe"].iloc[0]
        save(heatmap(scores, metric, (n_sequences or {}).get(probe), thresholds), f"{metric}.png")
    save(summary_figure(scores), "summary.png")
    save(threshold_sweep(scores, thresholds), "thresholds.png")
    for metric, effect in effect_pairs(scores):
        save(effect_scatter(scores, metric, effect), f"{metric}_vs_{effect}.png")
    return paths


def figure_names(scores: pd.DataFrame, formats: Sequence[str] = ("png",)) -> list[str]:
    """The files :func:`save_figures` writes for ``scores`` (in ``formats``)."""
    stems = (
        [str(m) for m in scores["metric"].unique()]
        + ["summary", "thresholds"]
        + [f"{m}_vs_{e}" for m, e in effect_pairs(scores)]
    )
    return [f"{stem}.{fmt}" for stem in stems for fmt in figure_formats(formats)]


# ------------------------------------------------------------------------------ one head's pattern


def _visible(hp: HeadPattern) -> np.ma.MaskedArray:
    """The pattern with the keys a causal query cannot see masked (drawn grey, not as a weight of
    0)."""
    p = np.asarray(hp.pattern, dtype=float)
    hidden = np.triu(np.ones_like(p, dtype=bool), 1) if hp.causal else np.zeros_like(p, dtype=bool)
    return np.ma.masked_array(p, mask=hidden)


def _pattern_cmap():
    import matplotlib

    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad("0.85")  # keys the query cannot see
    return cmap


def pattern_figure(hp: HeadPattern) -> Figure:
    """Query rows x key columns, colour 0-1, tokens on both axes, model and head in the title; keys
    a causal query cannot see are grey, not the colour of a zero weight."""
    n = len(hp.tokens)
    side = float(np.clip(0.28 * n + 2.5, 4.0, 24.0))
    fig = Figure(figsize=(side + 1.2, side), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(_visible(hp), cmap=_pattern_cmap(), vmin=0.0, vmax=1.0, interpolation="nearest")
    step = max(1, int(np.ceil(n / 150)))  # keep labels legible on long texts
    ticks = list(range(0, n, step))
    size = 9 if n <= 30 else 7 if n <= 60 else 5
    ax.set_xticks(ticks, [hp.tokens[i] for i in ticks], rotation=90, fontsize=size)
    ax.set_yticks(ticks, [hp.tokens[i] for i in ticks], fontsize=size)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if n <= 16:  # write the weights on a small grid
        for (q, k), v in np.ndenumerate(hp.pattern):
            if v >= 0.05 and not (hp.causal and k > q):
                ax.text(
                    k,
                    q,
                    f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if v > 0.6 else "white",
                )
    kind = "causal: grey keys are hidden by the mask" if hp.causal else "bidirectional"
    ax.set_title(f"{hp.model}: {hp.head_name} attention ({kind}, {n} tokens)", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8, label="attention weight (each row sums to 1)")
    return fig


def layer_figure(hps: list[HeadPattern]) -> Figure:
    """Every head of one layer side by side (query rows x key columns, colour 0-1, one shared
    scale);
    tokens label the first column's rows and the last row's columns when there are few enough."""
    n_heads, n = len(hps), len(hps[0].tokens)
    cols = int(np.ceil(np.sqrt(n_heads)))
    rows = int(np.ceil(n_heads / cols))
    labelled = n <= 40
    panel = 2.6 if not labelled else float(np.clip(0.13 * n + 1.6, 2.6, 6.0))
    fig = Figure(figsize=(panel * cols + 1.2, panel * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    im = None
    size = 7 if n <= 20 else 5
    for i, (ax, hp) in enumerate(zip(axes.flat, hps, strict=False)):
        im = ax.imshow(
            _visible(hp), cmap=_pattern_cmap(), vmin=0.0, vmax=1.0, interpolation="nearest"
        )
        ax.set_title(hp.head_name, fontsize=9)
        row, col = divmod(i, cols)
        last_row = row == rows - 1 or i + cols >= n_heads
        if labelled and col == 0:
            ax.set_yticks(range(n), hp.tokens, fontsize=size)
        else:
            ax.set_yticks([])
        if labelled and last_row:
            ax.set_xticks(range(n), hp.tokens, rotation=90, fontsize=size)
        else:
            ax.set_xticks([])
    for ax in list(axes.flat)[n_heads:]:
        ax.set_axis_off()
    kind = "causal: grey keys are hidden" if hps[0].causal else "bidirectional"
    fig.suptitle(
        f"{hps[0].model}: layer {hps[0].layer}, every head ({kind}, {n} tokens; rows: "
        "queries, columns: keys)",
        fontsize=10,
    )
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight")
    return fig
