"""Saved runs side by side: different models, or one model under different seeds.

Everything here reads ``scores.csv`` tables; no model is ever loaded.

    >>> runs = load_runs(["runs/smollm2-135m", "runs/all-minilm-l6-v2"])   # doctest: +SKIP
    >>> summary(runs)           # per metric and run: max, mean, labelled, chance  # doctest: +SKIP
    >>> head_differences(runs)  # per-head differences, runs of one shape          # doctest: +SKIP
    >>> write_comparison(runs, "compare/")                                  # doctest: +SKIP

``runs`` is an ordered ``{label: scores}`` dict; labels are the models' short names, or the run
directories' names when two runs hold the same model (seeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from headscope.catalog import is_below
from headscope.errors import HeadscopeError, setting
from headscope.files import (
    FIGURE_FORMATS,
    check_replaceable,
    figure_files,
    optional,
    save_figure,
    write_atomic,
)
from headscope.files import figure_formats as check_figure_formats
from headscope.report.compare import (
    difference_figure,
    distribution_figure,
    metric_order,
    same_shape,
)
from headscope.result import fmt, head_name, model_slug

# ------------------------------------------------------------------------------ reading runs


def read_run(path: str | Path):
    """A saved run (:func:`headscope.rundir.store.load_run`, which explains a missing or non-run
    folder)."""
    from headscope.rundir.store import load_run

    return load_run(path)


def run_labels(models: Sequence[str], paths: Sequence[Path]) -> list[str]:
    """Short model names; run directory names when two runs hold the same model.

    >>> run_labels(["org/a", "b"], [Path("x"), Path("y")])
    ['a', 'b']
    >>> run_labels(["m", "m"], [Path("runs/m-s0"), Path("runs/m-s1")])
    ['m-s0', 'm-s1']
    """
    for labels in (
        [model_slug(m) for m in models],
        [p.name for p in paths],
        [f"{p.parent.name}/{p.name}" for p in paths],
    ):
        if len(set(labels)) == len(labels):
            return labels
    return [f"{model_slug(m)}#{i}" for i, m in enumerate(models)]


def load_runs(paths: Sequence[str | Path]) -> dict[str, pd.DataFrame]:
    """Read two or more distinct run directories into ``{label: scores}`` (in the order given)."""
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        raise HeadscopeError(
            f"compare needs at least two run directories, got {len(paths)}; "
            "e.g. headscope compare runs/a runs/b."
        )
    seen: dict[Path, Path] = {}
    for p in paths:
        key = p.resolve()
        if key in seen:
            raise HeadscopeError(
                f"'{seen[key]}' and '{p}' are the same run directory; give distinct runs."
            )
        seen[key] = p
    results = [read_run(p) for p in paths]
    labels = run_labels([r.model_name for r in results], paths)
    return {label: r.scores for label, r in zip(labels, results, strict=True)}


# ------------------------------------------------------------------------------ tables


def summary(runs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (metric, run): heads, max, mean, labelled heads, chance, top head and its score.

    ``max``/``mean`` are over the run's heads (NaN scores skipped); ``top_head`` is the highest
    head, or the lowest for metrics whose label goes to low scores (entropy), and ``top_score``
    its own score (for entropy the minimum, not ``max``).
    """
    rows = []
    for metric in metric_order(runs):
        below = is_below(metric)
        for label, scores in runs.items():
            sub = scores[scores["metric"] == metric]
            if sub.empty:
                continue
            valid = sub[sub["score"].notna()]
            top = (
                valid.loc[valid["score"].idxmin() if below else valid["score"].idxmax()]
                if len(valid)
                else None
            )
            rows.append(
                {
                    "metric": metric,
                    "run": label,
                    "model": str(sub["model"].iloc[0]),
                    "heads": len(sub),
                    "max": sub["score"].max(),
                    "mean": sub["score"].mean(),
                    "labelled": int((sub["label"] != "").sum()),
                    "chance": float(sub["chance"].iloc[0]),
                    "top_head": _head_name(top) if top is not None else "",
                    "top_score": float(top["score"]) if top is not None else float("nan"),
                }
            )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _head_name(row) -> str:
    return head_name(row["layer"], row["head"])


def head_differences(runs: dict[str, pd.DataFrame], k: int | None = None) -> pd.DataFrame:
    """Per-head scores of every run side by side, largest ``|diff|`` first within each metric.

    Two runs: ``diff = second - first``. More runs: ``diff = max - min`` over runs (the spread).
    Only metrics every run has; heads with a NaN score in any run are left out. ``k`` keeps the
    ``k`` largest per metric. Needs :func:`same_shape`.
    """
    if not same_shape(runs):
        raise HeadscopeError(
            "Per-head differences need runs with the same layers x heads; these differ "
            f"({', '.join(f'{k}: {_shape(s)}' for k, s in runs.items())})."
        )
    labels = list(runs)
    common = [m for m in metric_order(runs) if all((s["metric"] == m).any() for s in runs.values())]
    parts = []
    with_ci = all({"ci_low", "ci_high"} <= set(s.columns) for s in runs.values())

    def side_by_side(metric: str, column: str) -> pd.DataFrame:  # [(layer, head), run]
        return pd.concat(
            {
                la: runs[la][runs[la]["metric"] == metric].set_index(["layer", "head"])[column]
                for la in labels
            },
            axis=1,
        )

    for metric in common:
        wide = side_by_side(metric, "score").dropna()
        diff = (
            wide[labels[1]] - wide[labels[0]]
            if len(labels) == 2
            else wide.max(axis=1) - wide.min(axis=1)
        )
        part = wide.assign(diff=diff, abs_diff=diff.abs())
        # the runs' intervals do not all overlap: a difference beyond the sampling noise
        if with_ci:
            lows = side_by_side(metric, "ci_low").reindex(part.index)
            highs = side_by_side(metric, "ci_high").reindex(part.index)
            part["beyond_ci"] = (lows.max(axis=1) > highs.min(axis=1)) & lows.notna().all(axis=1)
        part = part.reset_index()
        part = part.sort_values(["abs_diff", "layer", "head"], ascending=[False, True, True])
        if k is not None:
            part = part.head(k)
        part.insert(0, "metric", metric)
        part.insert(
            3,
            "head_name",
            [head_name(la, h) for la, h in zip(part["layer"], part["head"], strict=True)],
        )
        parts.append(part)
    cols = ["metric", "layer", "head", "head_name", *labels, "diff", "abs_diff"] + (
        ["beyond_ci"] if with_ci else []
    )
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


def _shape(scores: pd.DataFrame) -> str:
    return f"{scores['layer'].nunique()}x{scores['head'].nunique()}"


def format_summary(table: pd.DataFrame) -> str:
    """The :func:`summary` table as plain text for stdout."""
    w = max([12, *(len(r) for r in table["run"])])
    lines = [
        f"{'metric':<16} {'run':<{w}} {'max':>7} {'mean':>7} {'labelled':>9} {'chance':>7}  "
        "top head"
    ]
    for r in table.itertuples():
        top = f"{r.top_head} {fmt(r.top_score)}" if r.top_head else ""
        lines.append(
            f"{r.metric:<16} {r.run:<{w}} {fmt(r.max):>7} {fmt(r.mean):>7} "
            f"{f'{r.labelled}/{r.heads}':>9} {fmt(r.chance):>7}  {top}"
        )
    return "\n".join(lines)


def format_differences(diffs: pd.DataFrame, labels: Sequence[str], k: int = 3) -> str:
    """The ``k`` largest per-head differences of each metric as plain text."""
    what = f"{labels[1]} - {labels[0]}" if len(labels) == 2 else "max - min over runs"
    lines = [f"largest per-head differences ({what}):"]
    for metric, sub in diffs.groupby("metric", sort=False):
        sign = "+" if len(labels) == 2 else ""  # a spread is never negative
        items = ", ".join(
            f"{r.head_name} {r.diff:{sign}.3f}" + ("*" if getattr(r, "beyond_ci", False) else "")
            for r in sub.head(k).itertuples()
        )
        lines.append(f"  {metric:<16} {items}")
    if "beyond_ci" in diffs and bool(diffs["beyond_ci"].fillna(False).astype(bool).any()):
        lines.append(
            "  * the runs' bootstrap intervals do not overlap: a difference beyond sampling noise"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------ figures


# ------------------------------------------------------------------------------ writing


SUMMARY_COLUMNS = [
    "metric",
    "run",
    "model",
    "heads",
    "max",
    "mean",
    "labelled",
    "chance",
    "top_head",
    "top_score",
]
# before top_score: still ours
_OLD_SUMMARY_HEADER = "metric,run,model,heads,max,mean,labelled,chance,top_head"


def check_folder(out: str | Path) -> Path:
    """Refuse an ``--out`` for a comparison that exists and is not a directory."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise HeadscopeError(f"--out '{out}' exists and is not a directory; choose another --out.")
    return out


def write_comparison(
    runs: dict[str, pd.DataFrame],
    out: str | Path,
    dpi: int = 110,
    say=None,
    figure_formats: Sequence[str] = ("png",),
) -> list[Path]:
    """Write ``compare.csv``, ``distributions.png`` and, for runs of one shape, ``head_diffs.csv``
    (and, for two runs, ``difference.png``) into ``out``; return the paths. The figures are
    written in each of ``figure_formats`` (png, svg, pdf).

    Files already in ``out`` are replaced only if headscope wrote them (:mod:`headscope.files`);
    otherwise nothing is written."""
    out = check_folder(out)
    tables = {"compare.csv": summary(runs)}
    figures = {"distributions.png": distribution_figure}
    if same_shape(runs):
        tables["head_diffs.csv"] = head_differences(runs)
        if len(runs) == 2:
            figures["difference.png"] = difference_figure
    names = ["compare.csv", "distributions.png", "head_diffs.csv", "difference.png"]
    formats = check_figure_formats(figure_formats)
    wanted = [out / n for n in names if n in tables or n in figures]
    targets = [f for t in wanted for f in ([t] if t.name in tables else figure_files(t, formats))]
    every = [
        f
        for n in names
        for f in ([out / n] if n.endswith(".csv") else figure_files(out / n, FIGURE_FORMATS))
    ]
    stale = [f for f in every if f not in targets and f.exists()]
    # head_diffs.csv's header names the runs: any runs' table of ours has this head and tail
    headers = {
        "compare.csv": lambda line: line in (",".join(SUMMARY_COLUMNS), _OLD_SUMMARY_HEADER),
        "head_diffs.csv": lambda line: (
            line.startswith("metric,layer,head,head_name,")
            and line.endswith((",diff,abs_diff", ",diff,abs_diff,beyond_ci"))
        ),
    }
    check_replaceable(targets + stale, headers)
    out.mkdir(parents=True, exist_ok=True)
    # an earlier comparison's file that this one does not write: ours, and out of date
    for path in stale:
        path.unlink()
    written = []
    # the tables first: a figure cannot cost them
    for path in [t for t in targets if t.name in tables]:
        table = tables[path.name]
        written.append(
            write_atomic(
                path,
                lambda tmp, t=table: t.to_csv(tmp, index=False, float_format="%.8g", na_rep="NaN"),
            )
        )
    notes: dict = {}
    for path in [t for t in wanted if t.name in figures]:
        draw = lambda p=path: save_figure(figures[p.name](runs), p, dpi, formats)  # noqa: E731
        if optional(path.name, draw, notes, "figures_skipped", say) is not None:
            written.extend(figure_files(path, formats))
    return written


def compare_dirs(
    run_dirs: Sequence[str | Path],
    out: str | Path | None = None,
    top: int = 3,
    figure_formats: Sequence[str] = ("png",),
) -> tuple[str, list[Path]]:
    """``headscope compare``: read the runs, write the comparison to ``out``; return (text, paths).

    ``out`` defaults to ``./compare-<A>-vs-<B>``; the text is the summary table and, for runs of
    one shape, the ``top`` largest per-head differences per metric."""
    if top < 0:
        raise HeadscopeError(f"{setting('top')} must be 0 or more, got {top}.")
    figure_formats = check_figure_formats(figure_formats)
    runs = load_runs(run_dirs)
    labels = list(runs)
    if out is None:
        name = (
            "-vs-".join(model_slug(la) for la in labels)
            if len(labels) <= 3
            else f"{len(labels)}-runs"
        )
        out = Path(f"compare-{name}")
    check_folder(out)
    text = [format_summary(summary(runs))]
    if not same_shape(runs):
        text.append("runs differ in layers x heads: no per-head differences.")
    elif identical(runs):
        text.append(
            f"the {len(runs)} runs are identical: every head has the same score in each "
            "(differences all 0)."
        )
    elif top:
        text.append(format_differences(head_differences(runs, k=top), labels, k=top))
    return "\n".join(text), write_comparison(runs, out, figure_formats=figure_formats)


def identical(runs: dict[str, pd.DataFrame]) -> bool:
    """Whether every run holds the same scores for the same (metric, layer, head)s (NaN equal to
    NaN)."""
    tables = [s.set_index(["metric", "layer", "head"])["score"].sort_index() for s in runs.values()]
    first = tables[0]
    return all(
        t.index.equals(first.index)
        and np.array_equal(t.to_numpy(float), first.to_numpy(float), equal_nan=True)
        for t in tables[1:]
    )
