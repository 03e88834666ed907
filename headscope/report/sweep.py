"""A sweep's figures, from its atlas alone (never a model): scores against training step, and the
models side by side. ``matplotlib.figure.Figure`` objects, no pyplot state."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

__all__ = ["labelled_heads", "models_figure", "steps_figure"]


def _done(atlas: pd.DataFrame, setting: int | None = None) -> pd.DataFrame:
    """Finished rows of one probe setting (``setting``; None: the lowest): scores of different
    settings are different measurements and are never pooled in one curve."""
    done = atlas[(atlas["status"] == "done") & atlas["score"].notna()]
    if not len(done):
        return done
    return done[done["setting"] == (done["setting"].min() if setting is None else setting)]


def _suffix(atlas: pd.DataFrame, setting: int | None) -> str:
    """`` (setting k)`` in a title when the sweep has several probe settings."""
    return f" (setting {setting})" if setting is not None and atlas["setting"].nunique() > 1 else ""


def labelled_heads(atlas: pd.DataFrame) -> pd.DataFrame:
    """Per (model, metric), the heads labelled at any step or seed: ``model, metric, head_name``."""
    done = _done(atlas)
    labelled = done[done["label"].notna() & (done["label"].astype(str) != "")]
    return labelled[["model", "metric", "head_name"]].drop_duplicates().reset_index(drop=True)


def steps_figure(atlas: pd.DataFrame, top: int = 3, setting: int | None = None) -> Figure | None:
    """Each labelled head's score against the training step (mean over seeds, the band spanning the
    seeds' lowest to highest when there are several), one panel per (model, metric), chance dotted;
    a metric with no labelled head shows its ``top`` heads at the last step instead, and says so.
    One probe ``setting`` (None: the lowest). None when no job has a step."""
    from headscope.report.curves import curve_panels

    done = _done(atlas, setting)
    done = done[done["step"].notna()]
    if not len(done):
        return None
    heads = labelled_heads(done)
    n_seeds = int(done["seed"].nunique())
    panels = []
    for model, metric in done[["model", "metric"]].drop_duplicates().values.tolist():
        part = done[(done["model"] == model) & (done["metric"] == metric)]
        names = list(heads[(heads["model"] == model) & (heads["metric"] == metric)]["head_name"])
        note = "labelled heads"
        if not names:
            last = part[part["step"] == part["step"].max()].groupby("head_name")["score"].mean()
            names, note = list(last.nlargest(top).index), f"top {top} heads (none labelled)"
        lines = []
        for k, name in enumerate(names):
            g = part[part["head_name"] == name].groupby("step")["score"]
            line = {
                "x": list(g.mean().index.astype(int)),
                "y": list(g.mean()),
                "style": "o-",
                "size": 3,
                "colour": f"C{k % 10}",
                "label": name,
            }
            if n_seeds > 1:
                line.update(low=list(g.min()), high=list(g.max()), band=True)
            lines.append(line)
        chance = part.groupby("step")["chance"].mean()
        lines.append(
            {
                "x": list(chance.index.astype(int)),
                "y": list(chance),
                "style": "k:",
                "label": "chance",
            }
        )
        panels.append(
            {
                "lines": lines,
                "xlabel": "training step",
                "ylabel": f"{metric} score",
                "title": f"{model}: {metric}, {note}{_suffix(atlas, setting)}",
            }
        )
    seeds = f"mean of {n_seeds} seeds, band: lowest to highest seed" if n_seeds > 1 else "one seed"
    return curve_panels(
        panels, title=f"scores against the training step ({seeds})", panel_size=(4.6, 3.4)
    )


def models_figure(atlas: pd.DataFrame, setting: int | None = None) -> Figure | None:
    """The models side by side: per metric, each model's top head score (its last step, mean over
    seeds) beside its chance, for one probe ``setting`` (None: the lowest). None for a sweep of one
    model."""
    done = _done(atlas, setting)
    if not len(done) or done["model"].nunique() < 2:
        return None
    parts = []
    for _, part in done.groupby("model", sort=False):
        steps = part["step"].dropna()
        # its last checkpoint
        parts.append(part[part["step"] == steps.max()] if len(steps) else part)
    done = pd.concat(parts)
    top = (
        done.groupby(["model", "metric", "seed"])["score"]
        .max()
        .groupby(["model", "metric"])
        .mean()
        .unstack("model")
    )
    chance = done.groupby(["model", "metric"])["chance"].mean().unstack("model")
    fig = Figure(figsize=(max(6, 0.9 * len(top) * top.shape[1] ** 0.5), 3.8), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / top.shape[1]
    for j, model in enumerate(top.columns):
        x = [i + j * width for i in range(len(top))]
        ax.bar(x, top[model].values, width, label=model)
        ax.scatter(
            x, chance[model].reindex(top.index).values, color="k", marker="_", s=80, zorder=3
        )
    ax.set_xticks(
        [i + width * (top.shape[1] - 1) / 2 for i in range(len(top))],
        top.index,
        rotation=30,
        ha="right",
    )
    ax.set_ylabel("top head score (— chance)")
    ax.set_title(f"models side by side: top head per metric{_suffix(atlas, setting)}")
    ax.legend(fontsize=8)
    return fig
