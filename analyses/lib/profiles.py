"""Per-layer views of a scan table, the view of Clark et al. (2019), "What does BERT look at?".

Clark et al. plot, for each layer, the attention heads put on [CLS], [SEP] and punctuation on
average. Here that is the mean over a layer's heads of the ``sink`` (position 0: BOS or [CLS]),
``separator`` and ``punctuation`` scores of a headscope scan. Nothing here needs the model.

>>> import pandas as pd
>>> scores = pd.DataFrame({"model": "m", "metric": "sink", "layer": [0, 0, 1, 1],
...                        "head": [0, 1, 0, 1], "head_name": ["L0H0", "L0H1", "L1H0", "L1H1"],
...                        "score": [0.2, 0.4, 0.9, 0.7], "chance": 0.1,
...                        "label": ["", "", "sink head", "sink head"]})
>>> layer_means(scores, ["sink"])[["metric", "layer", "mean", "max"]]
  metric  layer  mean  max
0   sink      0   0.3  0.4
1   sink      1   0.8  0.9
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure

from headscope.errors import HeadscopeError
from headscope.metrics import REGISTRY
from headscope.uncertainty import STABLE

CLARK_METRICS = ("sink", "separator", "punctuation")


def layer_means(
    scores: pd.DataFrame, metrics: Sequence[str] = CLARK_METRICS, run: str | None = None
) -> pd.DataFrame:
    """Per (metric, layer): the mean and max score over the layer's heads, and the chance value.

    ``run`` names the table in a ``run`` column (default: its model name), so tables of several
    models or conditions can be concatenated and drawn with :func:`layer_curves`. NaN scores
    (e.g. ``next_token`` on a causal model) give NaN means.
    """
    missing = [m for m in metrics if m not in set(scores["metric"])]
    if missing:
        raise HeadscopeError(
            f"No rows for {', '.join(missing)}; this table has: "
            f"{', '.join(scores['metric'].unique())}."
        )
    sub = scores[scores["metric"].isin(metrics)]
    out = (
        sub.groupby(["model", "metric", "layer"], sort=False)
        .agg(
            mean=("score", "mean"),
            max=("score", "max"),
            chance=("chance", "first"),
            heads=("score", "size"),
        )
        .reset_index()
    )
    out.insert(0, "run", run if run is not None else out["model"])
    order = {m: i for i, m in enumerate(metrics)}
    return out.sort_values(
        ["metric", "layer"], key=lambda c: c.map(order) if c.name == "metric" else c, kind="stable"
    ).reset_index(drop=True)


def layer_curves(
    table: pd.DataFrame, panels: str = "run", lines: str = "metric", title: str | None = None
) -> Figure:
    """Per-layer mean curves from :func:`layer_means` tables (concatenated).

    One panel per value of ``panels``, one line per value of ``lines``; each line's chance value is
    drawn dashed in the same colour and written in the panel's title. With ``ci_low`` /
    ``ci_high`` columns (e.g. merged from :func:`lib.controls.layer_intervals`)
    each line gets its interval as a shaded band. y runs 0-1; x is the layer. The key sits below
    the panels, never over a curve.
    """
    for col in (panels, lines):
        if col not in table.columns:
            raise HeadscopeError(
                f"layer_curves: no column '{col}'; use one of {', '.join(table.columns)}."
            )
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    bands = {"ci_low", "ci_high"} <= set(table.columns)
    groups = list(dict.fromkeys(table[panels]))
    names = list(dict.fromkeys(table[lines]))
    colours = {name: f"C{i}" for i, name in enumerate(names)}
    fig = Figure(figsize=(4.6 * len(groups), 3.9), layout="constrained")
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, group in zip(axes, groups, strict=True):
        sub = table[table[panels] == group]
        said = []  # each line's chance value, for the title: close dashed lines hide each other
        for name, line in sub.groupby(lines, sort=False):
            colour = colours[name]
            ch = line["chance"].dropna()
            if len(ch):
                said.append(f"{name} {ch.iloc[0]:.3f}" if ch.nunique() == 1 else f"{name} varies")
            if bands:
                ax.fill_between(
                    line["layer"], line["ci_low"], line["ci_high"], color=colour, alpha=0.25, lw=0
                )
            ax.plot(line["layer"], line["mean"], marker="o", ms=3, color=colour)
            ax.plot(line["layer"], line["chance"], ls="--", lw=0.8, color=colour)
        ax.set_ylim(0, 1)
        ax.set_xlabel("layer")
        ax.set_ylabel("mean score over the layer's heads")
        ax.set_title(
            str(group) + (f"\nchance: {', '.join(said)}" if said else ""),
            fontsize=10 if not said else 9,
        )
    keys = [Line2D([], [], marker="o", ms=3, color=colours[n], label=str(n)) for n in names]
    keys.append(
        Line2D([], [], ls="--", lw=0.8, color="0.4", label="chance (a uniform head), line's colour")
    )
    if bands:
        level = table["level"].iloc[0] if "level" in table.columns else None
        said = f"{level:.0%} interval" if level is not None else "interval"
        keys.append(Patch(color="0.4", alpha=0.25, label=f"shaded: {said} (resampled sequences)"))
    fig.legend(
        handles=keys, loc="outside lower center", ncol=min(len(keys), 5), fontsize=8, frameon=False
    )
    fig.suptitle(title or "mean attention per layer (dashed: a uniform head)", fontsize=11)
    return fig


def side_by_side(
    runs: Mapping[str, pd.DataFrame],
    metric: str | Mapping[str, str],
    title: str | None = None,
    vmax: float | None = None,
    thresholds: Mapping[str, float] | None = None,
    marks: Mapping[str, float] | None = None,
    outline: tuple[str, Mapping[str, Iterable[tuple[int, int]]]] | None = None,
) -> Figure:
    """Layer x head heatmaps of several tables (``{label: scores}``) in one figure.

    ``metric`` is one metric for every panel, or ``{label: metric}`` to draw a different metric
    in each panel (e.g. one model's ``sink`` next to its ``separator``). The colour bar names the
    score and marks each panel's chance value with a red line, one line style per value (the value
    is also in the panel's title); a key below the panels names each red line's panels and value,
    the numbers (labelled heads, with the label's cut: the metric's threshold unless
    ``thresholds`` gives the run's) and the hatching (labels whose bootstrap stability is under
    0.9). ``vmax``: the top of the colour scale (default: the metric's own, 0-1 for shares), e.g. to
    make scores near a small chance value visible. Each chance line also gets a red marker left of
    the bar, one shape and place per value, so that two close values stay apart. ``marks``: other
    values to mark on the bar (``{what: value}``, e.g. a cut the text counts heads above), black,
    named in the key. ``outline``: ``(what, {panel label: [(layer, head), ...]})``, heads to draw a
    black box around (e.g. the heads above chance on a scale where they are dark), named in the
    key as ``what``.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.transforms import ScaledTranslation

    from headscope.report.figures import _labelled, _unstable, colour_label, draw_heatmap
    from headscope.uncertainty import STABLE

    chosen = {label: metric if isinstance(metric, str) else metric[label] for label in runs}
    shapes = {label: (s["layer"].nunique(), s["head"].nunique()) for label, s in runs.items()}
    widths = [max(2.5, 0.4 * h + 1.5) for _, h in shapes.values()]
    height = max(2.4, 0.22 * max(n for n, _ in shapes.values())) + 1.2  # panels + titles, axes
    fig = Figure(figsize=(sum(widths) + 1.0, height), layout="constrained")
    axes = fig.subplots(1, len(runs), squeeze=False, width_ratios=widths)[0]
    chances = {}  # panel label -> its chance value
    for label, scores in runs.items():
        sub = scores[scores["metric"] == chosen[label]]
        if "chance" in sub and sub["chance"].notna().any():
            chances[label] = float(sub["chance"].iloc[0])
    for ax, (label, scores) in zip(axes, runs.items(), strict=True):
        m = chosen[label]
        n = int(scores.loc[scores["metric"] == m, "n"].iloc[0]) if "n" in scores else None
        name = label if isinstance(metric, str) else f"{label}: {m}"
        said = [f"n = {n} queries"] if n else []
        if label in chances:
            said.append(f"chance {chances[label]:.3f}")
        im = draw_heatmap(ax, scores, m, title=name + (f" ({'; '.join(said)})" if said else ""))
        if vmax is not None:
            im.set_clim(0.0, vmax)
        for layer, head in outline[1].get(label, ()) if outline else ():
            ax.add_patch(
                Rectangle(
                    (head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.6
                )
            )
    metrics = list(dict.fromkeys(chosen.values()))
    bar = fig.colorbar(
        im,
        ax=list(axes),
        shrink=1.0,  # as tall as the panels: a short bar crowds its marks
        pad=0.06,  # room for the chance markers left of it
        label=colour_label(metrics[0])
        if len(metrics) == 1
        else "score (" + ", ".join(metrics) + ")",
    )
    # each chance value is a red line on the colour bar, one line style per value, named in the key
    # with its panels and value (two labels of close values written on the bar would overprint
    # each other; two close lines in one style could not be told apart). Styles follow the panels'
    # order, so the first panel's chance is solid in every figure of the same runs.
    styles = [("-", "solid"), ("--", "dashed"), (":", "dotted"), ("-.", "dash-dot")]
    by_value = {}  # chance value -> the panels that have it, in panel order
    for label, value in chances.items():
        by_value.setdefault(value, []).append(label)
    shapes = [(">", "triangle"), ("D", "diamond"), ("s", "square"), ("o", "circle")]
    keys = []
    for i, (value, labels) in enumerate(by_value.items()):
        ls, said = styles[i % len(styles)]
        mk, shape = shapes[i % len(shapes)]
        bar.ax.axhline(value, color="red", lw=1.2, ls=ls)
        left = ScaledTranslation(-(6 + 9 * (i % len(shapes))) / 72, 0, fig.dpi_scale_trans)
        bar.ax.plot(  # beside the bar, each value its own distance (points) from it
            [0.0],
            [value],
            marker=mk,
            ms=5,
            color="red",
            ls="",
            transform=bar.ax.get_yaxis_transform() + left,
            clip_on=False,
        )
        keys.append(
            Line2D(
                [],
                [],
                color="red",
                lw=1.2,
                ls=ls,
                marker=mk,
                ms=5,
                label=f"colour bar, red {said} line and {shape}: chance of {', '.join(labels)} "
                f"({value:.3f})",
            )
        )
    for what, value in (marks or {}).items():
        bar.ax.axhline(value, color="black", lw=1.6)
        keys.append(Line2D([], [], color="black", lw=1.6, label=f"colour bar, black: {what}"))
    if keys:
        keys.append(
            Patch(
                facecolor="none",
                edgecolor="none",
                label="chance: a head spreading its attention evenly",
            )
        )
    if any(_labelled(s, chosen[label]).any() for label, s in runs.items()):
        cuts = []
        for m in metrics:
            info = REGISTRY[m] if m in REGISTRY else None
            if info is not None:
                t = (thresholds or {}).get(m, info.threshold)
                cuts.append(f"{m} {'<=' if info.below else '>='} {t:g}")
        keys.append(
            Patch(
                facecolor="none",
                edgecolor="none",
                label="numbers: the labelled heads' scores"
                + (f" (labelled: {', '.join(cuts)})" if cuts else ""),
            )
        )
    if any(
        (_unstable(s, chosen[label]) & _labelled(s, chosen[label])).any()
        for label, s in runs.items()
    ):
        keys.append(
            Patch(
                facecolor="none",
                edgecolor="0.45",
                hatch="///",
                label=f"hatched: label stability < {STABLE} (stability: the share of bootstrap "
                "resamples of the sequences in which the head keeps its label)",
            )
        )
    if outline and any(outline[1].values()):
        keys.append(
            Patch(
                facecolor="none", edgecolor="black", linewidth=1.6, label=f"outlined: {outline[0]}"
            )
        )
    if keys:  # below the panels, outside them: never over an axis label
        fig.legend(handles=keys, loc="outside lower center", fontsize=7, frameon=False)
        fig.set_figheight(height + 0.16 * len(keys))  # room for the key, not taken from the panels
    fig.suptitle(
        title or (metric if isinstance(metric, str) else ", ".join(dict.fromkeys(chosen.values()))),
        fontsize=11,
    )
    return fig


def labelled_heads(scores: pd.DataFrame, max_names: int | None = 12) -> pd.DataFrame:
    """One row per label: the metric, how many heads carry it, and their names (strongest first).

    At most ``max_names`` names are listed (``None``: all), then how many more there are. With a
    ``stability`` column (a bootstrapped scan), ``stable`` counts the labelled heads that pass the
    threshold in at least 90% of resamples, and ``borderline`` names every head, labelled or not,
    that passes in between 10% and 90% of them: the heads a label count hinges on.
    """
    rows = []
    with_stability = "stability" in scores.columns
    for metric in scores["metric"].unique():
        every = scores[scores["metric"] == metric]
        sub = every[every["label"] != ""]
        if sub.empty:
            continue
        below = REGISTRY[metric].below if metric in REGISTRY else False
        sub = sub.sort_values("score", ascending=below)
        names = list(sub["head_name"])
        shown = names if max_names is None else names[:max_names]
        more = f", ... ({len(names) - len(shown)} more)" if len(shown) < len(names) else ""
        row = {
            "model": sub["model"].iloc[0],
            "label": sub["label"].iloc[0],
            "metric": metric,
            "heads": len(sub),
            "names": ", ".join(shown) + more,
        }
        if with_stability:
            row["stable"] = int((sub["stability"] >= STABLE).sum())
            edge = every[(every["stability"] > 1 - STABLE) & (every["stability"] < STABLE)]
            edge = edge.sort_values("score", ascending=below)
            row["borderline"] = ", ".join(
                f"{h} ({s:.2f})" for h, s in zip(edge["head_name"], edge["stability"], strict=True)
            )
        rows.append(row)
    columns = ["model", "label", "metric", "heads", "names"] + (
        ["stable", "borderline"] if with_stability else []
    )
    return pd.DataFrame(rows, columns=columns)
