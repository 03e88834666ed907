"""Tidy tables, labels and summaries of a scan: from per-head sums to the text a reader sees first.

The primary output is a long table (:data:`headscope.result.COLUMNS`), one row per
(metric, layer, head). ``label`` is the metric's label (e.g. "induction head") when the score
passes its threshold, else empty. Wide ``layer x head`` matrices are a ``pivot`` away
(:func:`headscope.result.matrix`). Saving and loading a run directory is :mod:`headscope.rundir`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from headscope.metrics import REGISTRY, get_metric
from headscope.result import COLUMNS, fmt, head_name


def to_frame(model_name: str, n_layers: int, n_heads: int, results: Sequence, thresholds: dict) -> pd.DataFrame:
    """Long table from per-metric ``MetricScores`` (see :mod:`headscope.extract`)."""
    rows = []
    for res in results:
        m = res.metric
        t = thresholds.get(m.name, m.threshold)
        score = res.score
        for layer in range(n_layers):
            for head in range(n_heads):
                s = float(score[layer, head])
                rows.append({
                    "model": model_name, "metric": m.name, "probe": m.probe, "layer": layer,
                    "head": head, "head_name": head_name(layer, head), "score": s,
                    "chance": res.chance, "n": int(res.count),
                    "label": m.label if m.passes(s, t) else "",
                })
    return pd.DataFrame(rows, columns=COLUMNS)


def top_heads(scores: pd.DataFrame, metric: str, k: int = 5) -> pd.DataFrame:
    """The ``k`` most characteristic heads of a metric (lowest first for ``below`` metrics)."""
    sub = scores[(scores["metric"] == metric) & scores["score"].notna()]
    m = REGISTRY.get(metric)
    return sub.nsmallest(k, "score") if m is not None and m.below else sub.nlargest(k, "score")


def relabel(scores: pd.DataFrame, thresholds: dict[str, float]) -> pd.DataFrame:
    """A copy of ``scores`` with labels recomputed under new thresholds (by metric name)."""
    out = scores.copy()
    for name, t in thresholds.items():
        m = get_metric(name)
        sel = out["metric"] == name
        out.loc[sel, "label"] = [m.label if m.passes(s, t) else "" for s in out.loc[sel, "score"]]
    return out


# ------------------------------------------------------------------------------ summaries


def summary_table(scores: pd.DataFrame, k: int = 3) -> str:
    """A plain-text table for stdout: per metric, the top heads, chance and labelled count."""
    lines = [f"{'metric':<16} {'chance':>7}  {'labelled':>8}  top heads"]
    for metric in scores["metric"].unique():
        sub = scores[scores["metric"] == metric]
        chance = float(sub["chance"].iloc[0])
        top = top_heads(scores, metric, k)
        tops = ", ".join(f"{r.head_name} {r.score:.3f}" for r in top.itertuples()) or "NaN (see summary.md)"
        labelled = int((sub["label"] != "").sum())
        lines.append(f"{metric:<16} {fmt(chance):>7}  {labelled:>8}  {tops}")
    return "\n".join(lines)


def headline(scores: pd.DataFrame) -> list[str]:
    """A few sentences a reader should see first."""
    out = []
    n_heads_total = scores[["layer", "head"]].drop_duplicates().shape[0]
    for metric in scores["metric"].unique():
        m = REGISTRY.get(metric)
        sub = scores[scores["metric"] == metric]
        if m is None or sub["score"].isna().all():
            continue
        best = top_heads(scores, metric, 1).iloc[0]
        labelled = sub[sub["label"] != ""]
        word = "lowest" if m.below else "strongest"
        out.append(
            f"{metric}: {len(labelled)}/{n_heads_total} heads labelled '{m.label}'; {word} "
            f"{best.head_name} = {best.score:.3f} (chance {fmt(float(best.chance))})."
        )
    sink = scores[scores["metric"] == "sink"]
    if not sink.empty:
        rate = float((sink["score"] > 0.3).mean())
        out.append(f"sink rate (share of heads with mean attention to position 0 > 0.3): {rate:.2f}.")
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
    lines += ["## Top heads per behaviour", "", "| metric | chance | top heads |", "| --- | --- | --- |"]
    for metric in scores["metric"].unique():
        sub = scores[scores["metric"] == metric]
        top = top_heads(scores, metric, 5)
        tops = ", ".join(f"{r.head_name} {r.score:.3f}" for r in top.itertuples()) or "NaN"
        lines.append(f"| {metric} | {fmt(float(sub['chance'].iloc[0]))} | {tops} |")
    lines += ["", "## Labelled heads", ""]
    for metric in scores["metric"].unique():
        m = REGISTRY.get(metric)
        sub = scores[(scores["metric"] == metric) & (scores["label"] != "")]
        t = result.thresholds.get(metric, m.threshold if m else float("nan"))
        rule = ("<=" if m and m.below else ">=") + f" {t:g}"
        names = ", ".join(sub["head_name"]) if not sub.empty else "none"
        lines.append(f"- **{m.label if m else metric}** ({metric} {rule}): {names}")
    nan_metrics = [m for m in scores["metric"].unique() if scores[scores["metric"] == m]["score"].isna().all()]
    if nan_metrics:
        lines += ["", "## Not measurable on this model", ""]
        for metric in nan_metrics:
            reason = REGISTRY[metric].nan_reason if metric in REGISTRY else None
            lines.append(f"- `{metric}` is NaN: {reason or 'no qualifying queries'}.")
    lines += ["", "Scores pool over every (sequence, qualifying query) pair; `chance` is the score of a head "
              "that spreads attention evenly over the keys it can see. Token ids of every scored "
              "sequence are in `tokens.jsonl`.", ""]
    return "\n".join(lines)


def console_summary(result, out=None, figures: bool = True) -> str:
    """What ``headscope scan`` prints on stdout: the model's shape, the summary table, why a metric
    is NaN, and what was written."""
    meta, scores = result.metadata, result.scores
    lines = [f"{meta.get('model', result.model_name)}: {meta.get('n_layers', '?')} layers x "
             f"{meta.get('n_heads', '?')} heads ({'causal' if meta.get('causal', True) else 'bidirectional'}), "
             f"{sum(len(p) for p in result.probes)} sequences",
             summary_table(scores)]
    for name in scores["metric"].unique():
        m = REGISTRY.get(name)
        if m is not None and m.nan_reason and scores.loc[scores.metric == name, "score"].isna().all():
            lines.append(f"{name} is NaN: {m.nan_reason}")
    if out is not None:
        lines.append(f"wrote {out}/ (scores.csv, metadata.json, tokens.jsonl, summary.md{', *.png' if figures else ''})")
    return "\n".join(lines)
