"""Tidy tables, labels and summaries of a scan: from per-head sums to the text a reader sees first.

The primary output is a long table (:data:`headscope.result.COLUMNS`), one row per
(metric, layer, head). ``label`` is the metric's label (e.g. "induction head") when the score
passes its threshold, else empty. Wide ``layer x head`` matrices are a ``pivot`` away
(:func:`headscope.result.matrix`). Saving and loading a run directory is
:mod:`headscope.rundir.store`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from headscope.catalog import check_score_name, describe, is_below
from headscope.result import COLUMNS, NULL_PROBE, fmt, head_name
from headscope.uncertainty import STABLE

#: The extra column of a run with causal effects: which estimator gave each effect row.
ESTIMATOR = "estimator"
#: The extra columns of a run with a bootstrap (:mod:`headscope.uncertainty`).
INTERVAL = ["ci_low", "ci_high", "stability"]


def to_frame(
    model_name: str,
    n_layers: int,
    n_heads: int,
    results: Sequence,
    thresholds: dict,
    intervals: dict | None = None,
    nulls: dict | None = None,
) -> pd.DataFrame:
    """Long table from per-score results (``MetricScores`` of :mod:`headscope.engines.extract`, and
    the effect and circuit scores of :mod:`headscope.effects.heads` / :mod:`headscope.circuits`).

    A result with an ``estimator`` (a ``[layer, head]`` array) adds the ``estimator`` column:
    "exact" or "attribution" on effect rows, empty elsewhere. ``intervals`` (score name ->
    :class:`~headscope.uncertainty.Bootstrap`) adds ``ci_low``, ``ci_high`` and ``stability``
    (NaN for scores without one). ``nulls`` (score name -> ``[layer, head]``) adds ``null``: the
    score on the positional null probe (repeat metrics), or the control of a circuit score
    (``copying``: another token of ``R``); NaN elsewhere."""
    rows = []
    with_estimator = any(getattr(res, "estimator", None) is not None for res in results)
    nan = float("nan")
    for res in results:
        m = res.metric
        t = thresholds.get(m.name, m.threshold)
        score = res.score
        est = getattr(res, "estimator", None)
        boot = (intervals or {}).get(m.name)
        for layer in range(n_layers):
            chance = res.chance_at(layer) if hasattr(res, "chance_at") else res.chance
            for head in range(n_heads):
                s = float(score[layer, head])
                row = {
                    "model": model_name,
                    "metric": m.name,
                    "probe": m.probe,
                    "layer": layer,
                    "head": head,
                    "head_name": head_name(layer, head),
                    "score": s,
                    "chance": chance,
                    "n": int(res.count),
                    "label": m.label if m.passes(s, t) else "",
                }
                if nulls is not None:
                    row["null"] = float(nulls[m.name][layer, head]) if m.name in nulls else nan
                if intervals is not None:
                    row["ci_low"] = float(boot.ci_low[layer, head]) if boot is not None else nan
                    row["ci_high"] = float(boot.ci_high[layer, head]) if boot is not None else nan
                    stab = boot.stability if boot is not None else None
                    row["stability"] = float(stab[layer, head]) if stab is not None else nan
                if with_estimator:
                    row[ESTIMATOR] = str(est[layer, head]) if est is not None else ""
                rows.append(row)
    extra = (
        (["null"] if nulls is not None else [])
        + (INTERVAL if intervals is not None else [])
        + ([ESTIMATOR] if with_estimator else [])
    )
    return pd.DataFrame(rows, columns=COLUMNS + extra)


def top_heads(scores: pd.DataFrame, metric: str, k: int = 5) -> pd.DataFrame:
    """The ``k`` most characteristic heads of a metric (lowest first for ``below`` metrics)."""
    sub = scores[(scores["metric"] == metric) & scores["score"].notna()]
    return sub.nsmallest(k, "score") if is_below(metric) else sub.nlargest(k, "score")


def relabel(scores: pd.DataFrame, thresholds: dict[str, float]) -> pd.DataFrame:
    """A copy of ``scores`` with labels recomputed under new thresholds (by metric name).

    A ``stability`` column, measured at the run's own thresholds, becomes NaN for the relabelled
    metrics (rerun the scan with ``--threshold`` to measure it at the new one)."""
    out = scores.copy()
    for name, t in thresholds.items():
        m = check_score_name(name)
        sel = out["metric"] == name
        out.loc[sel, "label"] = [m.label if m.passes(s, t) else "" for s in out.loc[sel, "score"]]
        if "stability" in out:
            # measured at the run's threshold, not this one
            out.loc[sel, "stability"] = float("nan")
    return out


# ------------------------------------------------------------------------------ summaries


def chance_text(chance: pd.Series) -> str:
    """One metric's chance: one number, or ``lo-hi`` when layers differ (sliding-window layers).

    >>> chance_text(pd.Series([0.25, 0.25])), chance_text(pd.Series([0.0833, 0.25, 0.25]))
    ('0.250', '0.083-0.250')
    """
    values = chance.dropna()
    if values.empty:
        return fmt(float("nan"))
    lo, hi = float(values.min()), float(values.max())
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


def summary_table(scores: pd.DataFrame, k: int = 3) -> str:
    """A plain-text table for stdout: per metric, the top heads, chance and labelled count."""
    w = max([16, *(len(m) for m in scores["metric"].unique())])
    lines = [f"{'metric':<{w}} {'chance':>7}  {'labelled':>8}  top heads"]
    for metric in scores["metric"].unique():
        sub = scores[scores["metric"] == metric]
        chance = chance_text(sub["chance"])
        top = top_heads(scores, metric, k)
        tops = (
            ", ".join(f"{r.head_name} {r.score:.3f}" for r in top.itertuples())
            or "NaN (see summary.md)"
        )
        labelled = int((sub["label"] != "").sum())
        lines.append(f"{metric:<{w}} {chance:>7}  {labelled:>8}  {tops}")
    return "\n".join(lines)


def headline(scores: pd.DataFrame) -> list[str]:
    """A few sentences a reader should see first."""
    out = []
    n_heads_total = scores[["layer", "head"]].drop_duplicates().shape[0]
    for metric in scores["metric"].unique():
        m = describe(metric)
        sub = scores[scores["metric"] == metric]
        if m is None or not m.label or sub["score"].isna().all():
            continue
        best = top_heads(scores, metric, 1).iloc[0]
        labelled = sub[sub["label"] != ""]
        word = "lowest" if m.below else "strongest"
        out.append(
            f"{metric}: {len(labelled)}/{n_heads_total} heads labelled '{m.label}'; {word} "
            f"{best.head_name} = {best.score:.3f} (chance {fmt(float(best.chance))})."
        )
        if "null" in sub and sub["null"].notna().any() and len(labelled):
            on_null = labelled[[bool(m.passes(v)) for v in labelled["null"]]]
            control = (
                "for another token of R (they raise R's tokens in general, not the attended one)"
                if metric == "copying"
                else "on sequences with no repetition (a fixed "
                "positional offset, not a copy of the current token)"
            )
            out.append(
                f"{metric}: {len(on_null)} of the {len(labelled)} labelled heads also pass "
                f"{control}" + (f": {', '.join(on_null['head_name'])}." if len(on_null) else ".")
            )
    sink = scores[scores["metric"] == "sink"]
    if not sink.empty:
        rate = float((sink["score"] > 0.3).mean())
        out.append(
            f"sink rate (share of heads with mean attention to position 0 > 0.3): {rate:.2f}."
        )
    return out


def summary_markdown(result) -> str:
    """``summary.md``: headline findings, top heads per behaviour, labelled heads, NaN reasons."""
    scores = result.scores
    md = result.metadata
    lines = [f"# headscope scan: {result.model_name}", ""]
    shape = f"{md.get('n_layers', '?')} layers x {md.get('n_heads', '?')} heads"
    kind = "causal decoder" if md.get("causal", True) else "bidirectional encoder"
    lines += [f"{shape}, {kind}. Source: {md.get('source', {}).get('source', '?')}.", ""]
    lines += ["## Headline findings", ""] + [f"- {s}" for s in headline(scores)] + [""]
    with_ci = "ci_low" in scores
    level = md.get("bootstrap", {}).get("level")
    what = f" (score [{level:.0%} interval])" if with_ci and level else ""
    lines += [
        "## Top heads per behaviour",
        "",
        f"| metric | chance | top heads{what} |",
        "| --- | --- | --- |",
    ]
    for metric in scores["metric"].unique():
        sub = scores[scores["metric"] == metric]
        top = top_heads(scores, metric, 5)
        tops = (
            ", ".join(f"{r.head_name} {r.score:.3f}" + _ci(r) + _null(r) for r in top.itertuples())
            or "NaN"
        )
        lines.append(f"| {metric} | {chance_text(sub['chance'])} | {tops} |")
    lines += ["", "## Labelled heads", ""]
    unstable_seen = False
    for metric in scores["metric"].unique():
        m = describe(metric)
        if m is not None and not m.label:
            continue  # estimates are never labelled
        sub = scores[(scores["metric"] == metric) & (scores["label"] != "")]
        t = result.thresholds.get(metric, m.threshold if m else float("nan"))
        rule = ("<=" if m and m.below else ">=") + f" {t:g}"
        names = []
        for r in sub.itertuples():
            stab = getattr(r, "stability", float("nan"))
            shaky = stab == stab and stab < STABLE
            unstable_seen |= shaky
            names.append(f"{r.head_name}" + (f" (stability {stab:.2f} †)" if shaky else ""))
        lines.append(
            f"- **{m.label if m else metric}** ({metric} {rule}): {', '.join(names) or 'none'}"
        )
    if unstable_seen:
        boot = md.get("bootstrap", {})
        lines += [
            "",
            f"† label stability under {STABLE}: the head passes the threshold in fewer than "
            f"{STABLE:.0%} of {boot.get('resamples', '?')} bootstrap resamples of the "
            "sequences, so the label depends on which sequences were drawn.",
        ]
    nan_metrics = [
        m for m in scores["metric"].unique() if scores[scores["metric"] == m]["score"].isna().all()
    ]
    if nan_metrics:
        lines += ["", "## Not measurable on this model", ""]
        for metric in nan_metrics:
            info = describe(metric)
            reason = info.nan_reason if info is not None else None
            lines.append(f"- `{metric}` is NaN: {reason or 'no qualifying queries'}.")
    lines += effects_markdown(scores, md)
    lines += [
        "",
        "Scores pool over every (sequence, qualifying query) pair; `chance` is the score of a "
        "head that spreads attention evenly over the keys it can see; `null` (repeat metrics) is "
        "the same head's score at the same positions of sequences with no repetition (for "
        "`copying`: the same output read against another token of R). Token ids of every scored "
        "sequence are in `tokens.jsonl`.",
        "",
    ]
    return "\n".join(lines)


def _null(row) -> str:
    v = getattr(row, "null", float("nan"))
    return f" (null {v:.3f})" if v == v else ""


def _ci(row) -> str:
    lo, hi = getattr(row, "ci_low", float("nan")), getattr(row, "ci_high", float("nan"))
    return f" [{lo:.3f}, {hi:.3f}]" if lo == lo and hi == hi else ""


def effects_markdown(scores: pd.DataFrame, md: dict, k: int = 10) -> list[str]:
    """The causal-effects section of ``summary.md``: per target, the heads whose ablation changes it
    most, with their pattern scores beside them, and the heads with a strong pattern but little
    effect."""
    effects = [m for m in scores["metric"].unique() if m.startswith("effect_")]
    if not effects:
        return []
    settings = md.get("effects", {})
    lines = ["", "## Does the head matter? Causal effects", ""]
    est = (
        scores.loc[scores["metric"].isin(effects), ESTIMATOR]
        if ESTIMATOR in scores
        else pd.Series(dtype=str)
    )
    lines.append(
        f"{settings.get('ablation', 'mean').capitalize()}-ablation of one head at a time (mode "
        f"`{settings.get('mode', '?')}`): {int((est == 'exact').sum())} effect rows are exact, "
        f"{int((est == 'attribution').sum())} are attribution-patching estimates (column "
        "`estimator`). "
        "An effect is the change in the target when the head is ablated; 0 is no effect."
    )
    for metric in effects:
        info = describe(metric)
        sub = scores[scores["metric"] == metric]
        probe = str(sub["probe"].iloc[0])
        others = [
            m
            for m in scores["metric"].unique()
            if not m.startswith(("effect_", "attribution_"))
            and scores.loc[scores["metric"] == m, "score"].notna().any()
        ]
        same = [m for m in others if scores.loc[scores["metric"] == m, "probe"].iloc[0] == probe]
        beside = same + [m for m in others if m not in same]  # the probe's own scores first
        wide = scores[scores["metric"].isin(beside)].pivot(
            index="head_name", columns="metric", values="score"
        )
        top = sub[sub["score"].notna()].nlargest(k, "score")
        lines += [
            "",
            f"### `{metric}`: {info.definition if info else metric}",
            "",
            "| head | effect | estimator | " + " | ".join(beside) + " |",
            "| --- | --- | --- | " + " | ".join("---" for _ in beside) + " |",
        ]
        for r in top.itertuples():
            cells = [
                fmt(float(wide.loc[r.head_name, m])) if r.head_name in wide.index else ""
                for m in beside
            ]
            lines.append(
                f"| {r.head_name} | {r.score:+.3f} | {getattr(r, ESTIMATOR, '')} | "
                + " | ".join(cells)
                + " |"
            )
        # the article's warning, in numbers: a strong pattern with little effect
        exact = sub[sub.get(ESTIMATOR, pd.Series("", index=sub.index)) == "exact"].set_index(
            "head_name"
        )["score"]
        quiet = []
        for m in beside:
            mi = describe(m)
            if mi is None or not mi.label:
                continue
            labelled = scores[(scores["metric"] == m) & (scores["label"] != "")]
            for r in labelled.itertuples():
                if (
                    r.head_name in exact.index
                    and abs(float(exact[r.head_name])) < (info.threshold if info else 0) / 5
                ):
                    quiet.append(
                        f"{r.head_name} ({m} {r.score:.3f}, effect "
                        f"{float(exact[r.head_name]):+.3f})"
                    )
        if quiet:
            lines += [
                "",
                "Strong pattern, little effect (labelled by a pattern score; exact "
                "effect under a fifth of "
                f"the '{info.label}' threshold): " + "; ".join(quiet[:12]) + ".",
            ]
    return lines


def written_names(out) -> list[str]:
    """The files of a run directory, in a line: tables and records by name, figures as ``*.png``
    (and ``*.svg``, ``*.pdf``)."""
    names = sorted(p.name for p in Path(out).iterdir() if p.is_file()) if Path(out).is_dir() else []
    order = ["scores.csv", "metadata.json", "tokens.jsonl", "controls.jsonl", "summary.md"]
    first = [n for n in order if n in names]
    figures = (".png", ".svg", ".pdf")
    rest = [n for n in names if n not in order and not n.endswith(figures)]
    return first + rest + [f"*{s}" for s in figures if any(n.endswith(s) for n in names)]


def console_summary(result, out=None, figures: bool = True) -> str:
    """What ``headscope scan`` prints on stdout: the model's shape, the summary table, why a metric
    is NaN, and what was written."""
    meta, scores = result.metadata, result.scores
    scored = sum(len(p) for p in result.probes if p.name != NULL_PROBE)
    controls = sum(len(p) for p in result.probes if p.name == NULL_PROBE)
    lines = [
        f"{meta.get('model', result.model_name)}: {meta.get('n_layers', '?')} layers x "
        f"{meta.get('n_heads', '?')} heads "
        f"({'causal' if meta.get('causal', True) else 'bidirectional'}), "
        f"{scored} sequences" + (f" (+ {controls} positional-null controls)" if controls else ""),
        summary_table(scores),
    ]
    for name in scores["metric"].unique():
        m = describe(name)
        if (
            m is not None
            and m.nan_reason
            and scores.loc[scores.metric == name, "score"].isna().all()
        ):
            lines.append(f"{name} is NaN: {m.nan_reason}")
    if out is not None:
        lines.append(f"wrote {out}/ ({', '.join(written_names(out))})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ a task's run


def _top(sub: pd.DataFrame, name: str, k: int = 3) -> str:
    """The ``k`` rows of ``sub`` with the largest |effect|, as ``NAME +0.12 [+0.05, +0.20]``."""
    top = sub.reindex(sub["effect"].abs().sort_values(ascending=False).index).head(k)
    return ", ".join(
        f"{getattr(r, name)} {r.effect:+.2f} [{r.ci_low:+.2f}, {r.ci_high:+.2f}]"
        for r in top.itertuples()
    )


def task_summary(result, out) -> str:
    """What ``headscope patch`` and ``headscope circuit`` print: the model, task and metric, each
    prompt's baseline with its interval, then the top heads of each slice of the table (patching:
    each activation, kv mode, direction and named position; circuit: each receiver's top senders,
    and the classes)."""
    b = result.baseline.set_index("prompt")
    lines = [
        f"{result.model} on {result.task}: {int(b['n_pairs'].iloc[0])} pairs, "
        f"metric {result.metric}"
    ]
    for p in b.index:
        lines.append(
            f"  {p:<16} {b.loc[p, 'mean']:+.3f} "
            f"[{b.loc[p, 'ci_low']:+.3f}, {b.loc[p, 'ci_high']:+.3f}]"
        )
    if hasattr(result, "path"):  # a circuit run
        t = result.path[result.path["estimator"] == "exact"]
        for receiver, sub in t.groupby("receiver", sort=False):
            lines.append(f"  into {receiver}: {_top(sub, 'sender')}")
        if result.classes is not None:
            named = result.classes[result.classes["class"] != ""]
            for cls, sub in named.groupby("class", sort=False):
                lines.append(f"  {cls}: {', '.join(sub['head_name'])}")
        lines.append(f"wrote {out}/ (path.csv, composition.csv, report.html)")
        return "\n".join(lines)
    if hasattr(result, "edges"):  # a discovery run
        lines += discovery_lines(result)
        lines.append(f"wrote {out}/ (edges.csv, curve.csv, circuit.json, report.html)")
        return "\n".join(lines)
    t = result.table
    named = t[~t["position"].astype(str).str.isdigit()]
    for (act, mode, direction, position), sub in named.groupby(
        ["activation", "kv_mode", "direction", "position"], sort=False
    ):
        est = "exact" if (sub["estimator"] == "exact").any() else "attribution"
        kv = f" ({mode})" if act in ("k", "v") else ""
        top = _top(sub[sub["estimator"] == est], "head_name")
        lines.append(f"  {act}{kv} {direction} at {position} ({est}): {top}")
    lines.append(f"wrote {out}/ (patching.csv, report.html)")
    return "\n".join(lines)


def discovery_lines(result) -> list[str]:
    """A discovery's top edges by each score, the exact ones beside them, CPR and CMD."""
    meta, e = result.metadata, result.edges
    lines = []
    for col in ("eap_ig", "eap", "exact"):
        if col in e.columns and e[col].notna().any():
            top = e.reindex(e[col].abs().sort_values(ascending=False).index).head(5)
            lines.append(
                f"  top edges by {col}: "
                + ", ".join(f"{r.edge} {getattr(r, col):+.3f}" for r in top.itertuples())
            )
    cpr, cmd = meta.get("cpr"), meta.get("cmd")
    if cpr and cmd:
        p = meta.get("cpr_rank_p", float("nan"))
        lines.append(
            f"  faithfulness (top by {meta.get('ranked_by')}, on "
            f"{meta.get('curve_pairs', '?')} {meta.get('curve_on', 'pairs')}): CPR {cpr[0]:.3f} "
            f"[{cpr[1]:.3f}, {cpr[2]:.3f}] (random orders p = {p:.3f}), "
            f"CMD {cmd[0]:.3f} [{cmd[1]:.3f}, {cmd[2]:.3f}]"
        )
    c = result.circuit
    lines.append(f"  circuit: {c['n_edges']} of {c['of_edges']} edges, f = {c['faithfulness']:.3f}")
    return lines
