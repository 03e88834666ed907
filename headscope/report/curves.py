"""Curves: values against a setting (a budget, a training step, a length), as matplotlib Figures.

One function draws every line figure headscope makes (the KV plan, sweeps, threshold sweeps, the
notebooks' helpers), so they share one look: labelled axes, a legend that names every mark, and
error bars or bands that say what they span. No pyplot state: a :class:`~matplotlib.figure.Figure`
is built and returned.

A line is a dict: ``x``, ``y`` (sequences), optionally ``low``/``high`` (the same length: drawn as
error bars, or as a band with ``"band": True``; what they span belongs in the ``label``), ``style``
(a matplotlib format string, default ``"o-"``), ``colour``, ``label``, ``size`` (marker size),
``zorder`` (higher is drawn over lower) and ``notes`` (a text per point, written beside it; what
the texts are belongs in the ``label``). A panel is a dict: ``lines``, ``xlabel``, ``ylabel``,
optionally ``title``, ``chance`` (a dashed horizontal line, labelled "chance") and ``ylim``.

>>> line = {"x": [0, 1], "y": [0.2, 0.2], "low": [0.2, 0.2], "high": [0.2, 0.2]}
>>> fig = curve_panels([{"lines": [line], "xlabel": "budget", "ylabel": "accuracy"}])
>>> len(fig.axes)
1
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure


def error_bars(y: Sequence[float], low: Sequence[float], high: Sequence[float]) -> np.ndarray:
    """``[2, n]`` distances from ``y`` down to ``low`` and up to ``high``, never negative.

    A value equal to both ends (every seed scored the same) gives 0, even when its mean differs
    from them in the last bit (``mean([0.2] * 3)`` is ``0.20000000000000004``).

    >>> error_bars([0.2], [0.20000000000000004], [0.2]).tolist()
    [[0.0], [0.0]]
    """
    y, low, high = (np.asarray(v, dtype=float) for v in (y, low, high))
    return np.clip(np.stack([y - low, high - y]), 0.0, None)


def draw_lines(ax, lines: Sequence[dict]) -> None:
    """Every line of one panel on ``ax``."""
    for line in lines:
        x, y = np.asarray(line["x"], dtype=float), np.asarray(line["y"], dtype=float)
        style, colour, label = line.get("style", "o-"), line.get("colour"), line.get("label")
        size, z = line.get("size"), line.get("zorder")
        if "low" in line and line.get("band"):
            ax.plot(x, y, style, color=colour, label=label, ms=size, zorder=z)
            ax.fill_between(x, line["low"], line["high"], color=colour, alpha=0.2, linewidth=0)
        elif "low" in line:
            ax.errorbar(
                x,
                y,
                yerr=error_bars(y, line["low"], line["high"]),
                fmt=style,
                color=colour,
                capsize=3,
                label=label,
                ms=size,
                zorder=z,
            )
        else:
            ax.plot(x, y, style, color=colour, label=label, ms=size, zorder=z)
        for xi, yi, note in zip(x, y, line.get("notes") or [], strict=False):
            ax.annotate(
                str(note),
                (xi, yi),
                xytext=(5, 4),
                textcoords="offset points",
                fontsize=7,
                color=colour,
            )


def curve_panels(
    panels: Sequence[dict],
    title: str | None = None,
    legend_panel: int | None = None,
    cols: int | None = None,
    panel_size: tuple[float, float] = (5.0, 4.0),
) -> Figure:
    """A figure of one or more panels of curves (see the module docstring for the dicts).

    ``legend_panel``: the panel that carries the legend (None: every panel with labels; ``-1``:
    one key below the panels naming every labelled curve once, for panels that share curves)."""
    n = max(1, len(panels))
    cols = cols or min(n, 3)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(panel_size[0] * cols, panel_size[1] * rows), layout="constrained")
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        draw_lines(ax, panel.get("lines", []))
        if panel.get("chance") is not None:
            ax.axhline(
                float(panel["chance"]), color="grey", linestyle=":", linewidth=1, label="chance"
            )
        ax.set_xlabel(panel.get("xlabel", ""))
        ax.set_ylabel(panel.get("ylabel", ""))
        if panel.get("title"):
            ax.set_title(panel["title"], fontsize=10)
        if panel.get("ylim") is not None:
            ax.set_ylim(*panel["ylim"])
        ax.grid(alpha=0.3)
        if (legend_panel is None or legend_panel == i) and ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=7)
    if legend_panel == -1:
        keyed: dict[str, object] = {}
        for ax in fig.axes:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                keyed.setdefault(label, handle)
        if keyed:
            fig.legend(
                list(keyed.values()),
                list(keyed),
                loc="outside lower center",
                ncol=2,
                fontsize=8,
                frameon=False,
            )
    if title:
        fig.suptitle(title, fontsize=11)
    return fig
