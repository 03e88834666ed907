"""Tidy tables, labels, summaries, and the run directory (saved atomically, loaded back).

The primary output is a long table, one row per (metric, layer, head)::

    model, metric, probe, layer, head, head_name, score, chance, n, label

``label`` is the metric's label (e.g. "induction head") when the score passes its threshold, else
empty. Wide ``layer x head`` matrices are a ``pivot`` away (see :func:`matrix`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from headscope.errors import HeadscopeError
from headscope.metrics import REGISTRY

COLUMNS = ["model", "metric", "probe", "layer", "head", "head_name", "score", "chance", "n", "label"]
FLOAT_FORMAT = "%.8g"


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


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


def matrix(scores: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The ``layer x head`` matrix of one metric (rows = layers, columns = heads)."""
    sub = scores[scores["metric"] == metric]
    if sub.empty:
        raise HeadscopeError(f"No rows for metric '{metric}'; this table has: {', '.join(scores['metric'].unique())}.")
    return sub.pivot(index="layer", columns="head", values="score")


def top_heads(scores: pd.DataFrame, metric: str, k: int = 5) -> pd.DataFrame:
    """The ``k`` most characteristic heads of a metric (lowest first for ``below`` metrics)."""
    sub = scores[(scores["metric"] == metric) & scores["score"].notna()]
    m = REGISTRY.get(metric)
    return sub.nsmallest(k, "score") if m is not None and m.below else sub.nlargest(k, "score")


def relabel(scores: pd.DataFrame, thresholds: dict[str, float]) -> pd.DataFrame:
    """A copy of ``scores`` with labels recomputed under new thresholds (by metric name)."""
    out = scores.copy()
    for name, t in thresholds.items():
        m = REGISTRY[name]
        sel = out["metric"] == name
        out.loc[sel, "label"] = [m.label if m.passes(s, t) else "" for s in out.loc[sel, "score"]]
    return out


# ------------------------------------------------------------------------------ summaries


def _fmt(x: float) -> str:
    return "NaN" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def summary_table(scores: pd.DataFrame, k: int = 3) -> str:
    """A plain-text table for stdout: per metric, the top heads, chance and labelled count."""
    lines = [f"{'metric':<16} {'chance':>7}  {'labelled':>8}  top heads"]
    for metric in scores["metric"].unique():
        sub = scores[scores["metric"] == metric]
        chance = float(sub["chance"].iloc[0])
        top = top_heads(scores, metric, k)
        tops = ", ".join(f"{r.head_name} {r.score:.3f}" for r in top.itertuples()) or "NaN (see summary.md)"
        labelled = int((sub["label"] != "").sum())
        lines.append(f"{metric:<16} {_fmt(chance):>7}  {labelled:>8}  {tops}")
    return "\n".join(lines)


def headline(scores: pd.DataFrame, causal: bool) -> list[str]:
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
            f"{best.head_name} = {best.score:.3f} (chance {_fmt(float(best.chance))})."
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
    lines += ["## Headline findings", ""] + [f"- {s}" for s in headline(scores, md.get("causal", True))] + [""]
    lines += ["## Top heads per behaviour", "", "| metric | chance | top heads |", "| --- | --- | --- |"]
    for metric in scores["metric"].unique():
        sub = scores[scores["metric"] == metric]
        top = top_heads(scores, metric, 5)
        tops = ", ".join(f"{r.head_name} {r.score:.3f}" for r in top.itertuples()) or "NaN"
        lines.append(f"| {metric} | {_fmt(float(sub['chance'].iloc[0]))} | {tops} |")
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


# ------------------------------------------------------------------------------ run directory


def check_out_dir(out: str | Path, force: bool) -> Path:
    """Refuse an existing output directory unless ``force`` (call before doing any work)."""
    out = Path(out)
    if out.exists() and not force:
        raise HeadscopeError(f"Output directory '{out}' already exists; pass --force to replace it or choose another --out.")
    if out.exists() and not out.is_dir():
        raise HeadscopeError(f"'{out}' exists and is not a directory; choose another --out.")
    return out


def save_run(result, out: str | Path, force: bool = False, figures: bool = True) -> Path:
    """Write the run directory atomically: everything goes to a temp dir that is renamed at the end.

    An existing ``out`` is replaced only with ``force``; on any error nothing is left behind.
    """
    out = check_out_dir(out, force)
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    try:
        result.scores.to_csv(tmp / "scores.csv", index=False, float_format=FLOAT_FORMAT, na_rep="NaN")
        try:
            import pyarrow  # noqa: F401

            result.scores.to_parquet(tmp / "scores.parquet", index=False)
        except ImportError:
            pass
        (tmp / "metadata.json").write_text(json.dumps(result.metadata | {"thresholds": result.thresholds},
                                                      indent=2, default=str) + "\n")
        with open(tmp / "tokens.jsonl", "w") as f:
            for probe in result.probes:
                for i, ids in enumerate(probe.sequences):
                    rec = {"probe": probe.name, "index": i, "token_ids": [int(t) for t in ids]}
                    if probe.repeat_len is not None:
                        rec["repeat_len"] = probe.repeat_len
                    f.write(json.dumps(rec) + "\n")
        (tmp / "summary.md").write_text(summary_markdown(result))
        if figures:
            from headscope.plots import save_figures

            save_figures(result.scores, tmp, n_sequences={p.name: len(p) for p in result.probes})
        os.chmod(tmp, 0o755)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.replace(out, old / "run")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_run(path: str | Path):
    """Read a run directory back: a :class:`~headscope.runner.ScanResult` without the model."""
    from headscope.probes import Probe
    from headscope.runner import ScanResult

    path = Path(path)
    if not (path / "scores.csv").is_file():
        raise HeadscopeError(f"'{path}' is not a headscope run directory (no scores.csv).")
    try:
        scores = pd.read_csv(path / "scores.csv", keep_default_na=False, na_values={"score": ["NaN", "nan", ""], "chance": ["NaN", "nan", ""]},
                             dtype={"label": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise HeadscopeError(f"'{path / 'scores.csv'}' cannot be read as a scores table ({exc}).") from None
    missing = [c for c in COLUMNS if c not in scores.columns]
    if missing:
        raise HeadscopeError(f"'{path / 'scores.csv'}' lacks column(s) {', '.join(missing)}; is it from `headscope scan`?")
    scores["label"] = scores["label"].fillna("")
    meta = json.loads((path / "metadata.json").read_text()) if (path / "metadata.json").is_file() else {}
    probes: dict[str, Probe] = {}
    if (path / "tokens.jsonl").is_file():
        for line in (path / "tokens.jsonl").read_text().splitlines():
            rec = json.loads(line)
            p = probes.setdefault(rec["probe"], Probe(rec["probe"], [], repeat_len=rec.get("repeat_len")))
            p.sequences.append(rec["token_ids"])
    model_name = str(scores["model"].iloc[0]) if len(scores) else meta.get("model", "?")
    return ScanResult(model_name=model_name, scores=scores, probes=list(probes.values()),
                      metadata=meta, thresholds=meta.get("thresholds", {}))
