"""A cross-model atlas: several models' head scores on one relative-depth axis.

Models differ in depth (MiniLM 6 layers, Gemma 3 270M 18, SmolLM2 30), so layers are compared
by relative depth ``layer / (n_layers - 1)`` (0: first layer, 1: last) and binned (thirds by
default: early, middle, late). :func:`atlas` stacks several runs' score tables into one tidy
table; :func:`depth_summary` gives, per metric, depth bin and model, the fraction of heads that
carry the metric's label and the mean score; :func:`atlas_figure` draws each model's per-layer
mean score against relative depth. Nothing here needs a model.

>>> import pandas as pd
>>> def table(model, n_layers, scores, labels):
...     return pd.DataFrame({"model": model, "metric": "sink", "layer": range(n_layers), "head": 0,
...                          "score": scores, "chance": 0.1, "label": labels})
>>> a = atlas([table("deep", 4, [0.1, 0.9, 0.8, 0.2], ["", "sink head", "sink head", ""]),
...            table("flat", 2, [0.5, 0.6], ["", "sink head"])])
>>> a[["model", "layer", "depth", "depth_bin", "labelled"]]
  model  layer     depth depth_bin  labelled
0  deep      0  0.000000     early     False
1  deep      1  0.333333    middle      True
2  deep      2  0.666667      late      True
3  deep      3  1.000000      late     False
4  flat      0  0.000000     early     False
5  flat      1  1.000000      late      True
>>> depth_summary(a)[["metric", "depth_bin", "model", "heads", "frac_labelled", "mean_score"]]
  metric depth_bin model  heads  frac_labelled  mean_score
0   sink     early  deep      1            0.0         0.1
1   sink     early  flat      1            0.0         0.5
2   sink    middle  deep      1            1.0         0.9
3   sink      late  deep      2            0.5         0.5
4   sink      late  flat      1            1.0         0.6
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from headscope.catalog import describe
from headscope.errors import HeadscopeError

#: The columns :func:`atlas` returns, in order.
ATLAS_COLUMNS = (
    "model",
    "metric",
    "layer",
    "n_layers",
    "depth",
    "depth_bin",
    "head",
    "score",
    "chance",
    "label",
    "labelled",
)
_NEEDED = ("metric", "layer", "head", "score", "chance")
BIN_NAMES = {3: ("early", "middle", "late"), 2: ("early", "late")}


def _table(run, name: str | None) -> tuple[pd.DataFrame, str, int | None]:
    """(scores, model name, n_layers if known) of one run given as a path, ScanResult or
    DataFrame."""
    n_layers = None
    if isinstance(run, (str, Path)):
        from headscope.rundir.store import load_run

        run = load_run(run)
    if hasattr(run, "scores") and isinstance(run.scores, pd.DataFrame):  # a ScanResult
        meta = getattr(run, "metadata", None) or {}
        n_layers = meta.get("n_layers")
        name = name or getattr(run, "model_name", None)
        run = run.scores
    if not isinstance(run, pd.DataFrame):
        raise HeadscopeError(
            f"atlas: cannot read a {type(run).__name__}; give run directories, "
            "headscope.load_run(...) results or score DataFrames."
        )
    missing = [c for c in _NEEDED if c not in run.columns]
    if missing:
        raise HeadscopeError(
            f"atlas: a score table lacks column(s) {', '.join(missing)}; "
            "it should be a headscope scores table."
        )
    if name is None:
        models = run["model"].dropna().unique() if "model" in run.columns else []
        if len(models) != 1:
            raise HeadscopeError(
                f"atlas: a table holds {len(models)} model names; name each run "
                "(pass a mapping {name: run})."
            )
        name = str(models[0])
    return run, name, None if n_layers is None else int(n_layers)


def depth_bins(depth: pd.Series | np.ndarray, bins: int = 3) -> pd.Categorical:
    """Equal-width bins of relative depth in [0, 1]: ``early``/``middle``/``late`` for thirds,
    ``early``/``late`` for halves, else ``d1`` .. ``dN``; the last bin includes 1.

    >>> list(depth_bins([0.0, 0.3, 0.34, 0.66, 0.67, 1.0]))
    ['early', 'early', 'middle', 'middle', 'late', 'late']
    """
    if bins < 1:
        raise HeadscopeError(f"atlas: bins must be at least 1, not {bins}.")
    names = BIN_NAMES.get(bins, tuple(f"d{i + 1}" for i in range(bins)))
    idx = np.minimum((np.asarray(depth, dtype=float) * bins).astype(int), bins - 1)
    return pd.Categorical.from_codes(idx, categories=list(names), ordered=True)


def atlas(
    runs: Sequence | Mapping, metrics: Sequence[str] | None = None, bins: int = 3
) -> pd.DataFrame:
    """One tidy table of several runs' head scores, with each layer's relative depth.

    ``runs``: run directories, :func:`headscope.load_run` results or score DataFrames (a list, or
    a mapping ``{model name: run}`` to name them yourself; otherwise each table's ``model``
    column names it). ``metrics``: keep only these (default: every metric the runs hold).

    Columns: ``model, metric, layer, n_layers, depth, depth_bin, head, score, chance, label,
    labelled``. ``depth = layer / (n_layers - 1)`` (0 for a one-layer model); ``n_layers`` comes
    from the run's metadata when known, else the table's deepest layer + 1. ``labelled``: the head
    carries the metric's label (e.g. "induction head") at the thresholds of its run.
    """
    items = list(runs.items()) if isinstance(runs, Mapping) else [(None, r) for r in runs]
    if not items:
        raise HeadscopeError("atlas: no runs given.")
    parts, seen = [], set()
    for name, run in items:
        scores, model, n_layers = _table(run, name)
        if model in seen:
            raise HeadscopeError(
                f"atlas: model '{model}' given twice; name the runs apart "
                "(pass a mapping {name: run})."
            )
        seen.add(model)
        df = scores.loc[:, [c for c in (*_NEEDED, "label") if c in scores.columns]].copy()
        n = n_layers if n_layers is not None else int(df["layer"].max()) + 1
        label = df["label"] if "label" in df.columns else pd.Series("", index=df.index)
        df["label"] = label.fillna("").astype(str).replace({"nan": "", "NaN": ""})
        df.insert(0, "model", model)
        df["n_layers"] = n
        df["depth"] = df["layer"] / (n - 1) if n > 1 else 0.0
        parts.append(df)
    out = pd.concat(parts, ignore_index=True)
    if metrics is not None:
        unknown = sorted(set(metrics) - set(out["metric"]))
        if unknown:
            raise HeadscopeError(
                f"atlas: no rows for {', '.join(unknown)}; the runs hold: "
                f"{', '.join(out['metric'].unique())}."
            )
        out = out[out["metric"].isin(metrics)]
    out["depth_bin"] = depth_bins(out["depth"], bins)
    out["labelled"] = out["label"] != ""
    out[["layer", "head", "n_layers"]] = out[["layer", "head", "n_layers"]].astype(int)
    return out.loc[:, list(ATLAS_COLUMNS)].reset_index(drop=True)


def depth_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per (metric, depth bin, model) of an :func:`atlas` table: how many heads, the fraction
    labelled, the mean and max score, and the mean chance value.

    Rows keep the metrics' order of appearance, then early -> late, then the models' order.
    Metrics whose scores are all NaN (``next_token`` of causal models) keep their rows with NaN
    means, so a missing behaviour is visible rather than dropped.
    """
    missing = [c for c in ATLAS_COLUMNS if c not in table.columns]
    if missing:
        raise HeadscopeError(
            f"depth_summary: not an atlas table (no {', '.join(missing)}); make one with atlas()."
        )
    t = table.assign(
        metric=pd.Categorical(
            table["metric"], categories=list(table["metric"].unique()), ordered=True
        ),
        model=pd.Categorical(
            table["model"], categories=list(table["model"].unique()), ordered=True
        ),
    )
    out = (
        t.groupby(["metric", "depth_bin", "model"], observed=True)
        .agg(
            heads=("score", "size"),
            frac_labelled=("labelled", "mean"),
            mean_score=("score", "mean"),
            max_score=("score", "max"),
            chance=("chance", "mean"),
        )
        .reset_index()
    )
    for col in ("metric", "depth_bin", "model"):
        out[col] = out[col].astype(str)
    return out


def layer_profile(table: pd.DataFrame) -> pd.DataFrame:
    """Per (model, metric, layer): the relative depth, the mean and max score over the layer's
    heads, the fraction labelled and the chance value (what :func:`atlas_figure` draws)."""
    return (
        table.groupby(["model", "metric", "layer"], sort=False)
        .agg(
            depth=("depth", "first"),
            mean_score=("score", "mean"),
            max_score=("score", "max"),
            frac_labelled=("labelled", "mean"),
            chance=("chance", "mean"),
        )
        .reset_index()
    )


def _unit(metric: str) -> str:
    """The score's unit (``nats`` for entropy), empty for shares and for scores headscope does not
    know."""
    try:
        return describe(metric).unit
    except HeadscopeError:
        return ""


def atlas_figure(
    table: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    stat: str = "mean_score",
    ncols: int = 4,
    intervals: pd.DataFrame | None = None,
) -> Figure:
    """One panel per metric: each model's per-layer ``stat`` (``mean_score``, ``max_score`` or
    ``frac_labelled``) against relative depth, the model's chance value dashed in the same colour
    (score stats only); light lines split the depth bins (thirds). ``intervals`` (with
    ``mean_score``): per (model, metric, layer) ``ci_low`` / ``ci_high`` of the layer mean, as
    :func:`lib.controls.layer_intervals` gives them, shaded around each curve and
    keyed; a model or metric it has no rows for is drawn without a band."""
    if stat not in ("mean_score", "max_score", "frac_labelled"):
        raise HeadscopeError(
            f"atlas_figure: unknown stat '{stat}'; use mean_score, max_score or frac_labelled."
        )
    metrics = list(table["metric"].unique()) if metrics is None else list(metrics)
    unknown = [m for m in metrics if m not in set(table["metric"])]
    if unknown or not metrics:
        raise HeadscopeError(f"atlas_figure: no rows for {', '.join(unknown) or 'any metric'}.")
    prof = layer_profile(table[table["metric"].isin(metrics)])
    if intervals is not None:
        if stat != "mean_score":
            raise HeadscopeError("atlas_figure: intervals are of the layer mean; use mean_score.")
        need = {"model", "metric", "layer", "ci_low", "ci_high"}
        if not need <= set(intervals.columns):
            raise HeadscopeError(
                f"atlas_figure: intervals need columns {sorted(need)}; got "
                f"{sorted(intervals.columns)} (controls.layer_intervals makes them)."
            )
        prof = prof.merge(
            intervals[["model", "metric", "layer", "ci_low", "ci_high"]],
            on=["model", "metric", "layer"],
            how="left",
        )
    banded = False
    ncols = max(1, min(ncols, len(metrics)))
    nrows = -(-len(metrics) // ncols)
    fig = Figure(figsize=(3.6 * ncols, 2.8 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    models = list(table["model"].unique())
    colours = {m: f"C{i}" for i, m in enumerate(models)}
    # one dash pattern per model, so chance lines that coincide can still be told apart
    dashes = {m: [(4, 2), (1, 1.5), (6, 1.5, 1, 1.5), (2, 3)][i % 4] for i, m in enumerate(models)}
    bin_names = (
        [str(c) for c in table["depth_bin"].cat.categories]
        if hasattr(table["depth_bin"], "cat")
        else ["early", "middle", "late"]
    )
    nbins = len(bin_names)
    for ax, metric in zip(axes, metrics, strict=False):
        sub = prof[prof["metric"] == metric]
        said = []
        for model, rows in sub.groupby("model", sort=False):
            ax.plot(
                rows["depth"],
                rows[stat],
                marker="o",
                ms=3,
                lw=1.2,
                color=colours[model],
                label=model,
            )
            if "ci_low" in rows and rows["ci_low"].notna().any():
                ax.fill_between(
                    rows["depth"],
                    rows["ci_low"],
                    rows["ci_high"],
                    color=colours[model],
                    alpha=0.25,
                    linewidth=0,
                )
                banded = True
            if stat != "frac_labelled" and rows["chance"].notna().any():
                ax.plot(
                    rows["depth"],
                    rows["chance"],
                    lw=0.9,
                    color=colours[model],
                    dashes=dashes[model],
                )
                ch = rows["chance"].dropna()
                said.append(f"{ch.iloc[0]:.3f}" if ch.nunique() == 1 else "varies by layer")
        for edge in np.arange(1, nbins) / nbins:
            ax.axvline(edge, color="0.85", lw=0.8, zorder=0)
        top = ax.secondary_xaxis("top")  # each bin named on the axis, not only in the key
        top.set_xticks((np.arange(nbins) + 0.5) / nbins, bin_names, fontsize=7, color="0.4")
        top.tick_params(length=0, pad=1)
        ax.set_title(
            metric + (f"\nchance {' / '.join(said)}" if said else ""),
            fontsize=10 if not said else 9,
        )
        ax.set_xlim(-0.03, 1.03)
        ax.set_xlabel("relative depth (layer / (n_layers - 1))", fontsize=8)
        unit = _unit(metric) if stat != "frac_labelled" else ""
        what = {
            "mean_score": "mean over the layer's heads",
            "max_score": "max over the layer's heads",
            "frac_labelled": "share of the layer's heads labelled",
        }[stat]
        low = "; low = focused" if metric == "entropy" and stat != "frac_labelled" else ""
        ax.set_ylabel(what + (f" ({unit}{low})" if unit else low), fontsize=8)
        if sub[stat].isna().all():
            ax.text(
                0.5,
                0.5,
                "NaN for these models",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=8,
                color="0.4",
            )
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    keys = [Line2D([], [], marker="o", ms=3, lw=1.2, color=colours[m], label=m) for m in models]
    if stat != "frac_labelled":
        keys += [
            Line2D([], [], lw=0.9, color=colours[m], dashes=dashes[m], label=f"chance, {m}")
            for m in models
        ]
    if banded:
        keys.append(
            Patch(
                facecolor="0.6",
                alpha=0.4,
                label="shaded: 95% interval of the layer mean (resampling sequences)",
            )
        )
    keys.append(Line2D([], [], color="0.85", lw=0.8, label="depth thirds (early | middle | late)"))
    fig.legend(
        handles=keys,
        loc="outside lower center",
        ncol=min(len(keys), 4),
        fontsize=7,
        frameon=False,
        title=f"chance values in each title, in the order {' / '.join(models)}"
        if stat != "frac_labelled"
        else None,
        title_fontsize=7,
    )
    what = {"mean_score": "mean", "max_score": "max", "frac_labelled": "share labelled"}[stat]
    fig.suptitle(
        f"per-layer {what} over each layer's heads, against relative depth ({', '.join(models)})",
        fontsize=10,
    )
    return fig
