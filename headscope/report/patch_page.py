"""``report.html`` of a patching run: one self-contained page (styles inline, figures as ``data:``
PNGs, nothing fetched), drawn from the run's saved tables alone, like :mod:`headscope.report.html`.

Top to bottom: the model (source, sha256), the task and its provenance, the settings and timings;
the baseline (clean and corrupt metric and their gap, each with its interval, and the share of
pairs answered correctly); per activation (and kv mode, and direction and position) the heatmap and
the top heads by |effect|, each with its interval, the raw metric change, the other estimator beside
it where the run has both, its direct logit attribution, and, when the run was made with ``--scan
RUN_DIR``, the head's pattern scores from that scan (induction, previous_token, duplicate_token,
sink, copying: those it has); the direct logit attribution's top heads; how to read it all.
"""

from __future__ import annotations

import pandas as pd

from headscope.report.html import (
    _ci,
    _e,
    _kv,
    _num,
    _readable,
    _table,
    figure_uri,
    page,
    recorded,
    source_pairs,
)
from headscope.result import fmt

TOP_K = 10
SCORES = ("induction", "previous_token", "duplicate_token", "sink", "copying")
READ = {
    "denoising": "share of the clean-corrupt gap restored when the head's clean activation is put "
    "into the corrupt run",
    "noising": "share of the gap destroyed when the head's corrupt activation is put into the "
    "clean run",
}


def _settings(meta: dict) -> list[tuple[str, str]]:
    src = meta.get("source") or {}
    pairs = [
        ("model", meta.get("model", "?")),
        (
            "shape",
            f"{meta.get('n_layers', '?')} layers x {meta.get('n_heads', '?')} query heads "
            f"({meta.get('n_kv_heads', '?')} KV heads)",
        ),
        ("source", src.get("source", src.get("kind", "?"))),
    ]
    pairs += source_pairs(src)
    pairs += [
        (
            "task",
            f"{meta.get('task', '?')}, {meta.get('n_pairs', '?')} pairs, "
            f"metric {meta.get('metric')}",
        ),
        ("task provenance", _readable(meta.get("task_provenance") or {})),
    ]
    scan = meta.get("scan")
    if scan:
        metrics = ", ".join(scan.get("metrics") or [])
        pairs.append(("pattern scores from", f"{scan.get('run_dir')} ({metrics})"))
    pairs += recorded(meta, ("settings_changed", "seed", "device", "dtype"))
    return pairs


def _baseline(baseline: pd.DataFrame) -> str:
    rows = []
    for r in baseline.itertuples():
        share = "" if r.share_correct != r.share_correct else fmt(float(r.share_correct), 2)
        rows.append(
            [
                f"<td>{_e(r.prompt)}</td>",
                f"<td>{_e(r.metric)}</td>",
                _num(r.mean),
                _ci(r.ci_low, r.ci_high),
                f'<td class="num">{_e(share)}</td>',
                f'<td class="num">{int(r.n_pairs)}</td>',
            ]
        )
    return _table(
        ["prompts", "metric", "mean over pairs", "interval", "share with logit_diff > 0", "pairs"],
        rows,
    )


def _scores_by_head(pattern: pd.DataFrame | None) -> dict[str, pd.Series]:
    if pattern is None or pattern.empty:
        return {}
    return {
        m: pattern[pattern["metric"] == m].set_index("head_name")["score"]
        for m in SCORES
        if (pattern["metric"] == m).any()
    }


def _slice(sub: pd.DataFrame, dla: pd.Series | None, scores: dict[str, pd.Series]) -> str:
    """The top heads of one (activation, kv_mode, direction, position) slice."""
    first = "exact" if (sub["estimator"] == "exact").any() else "attribution"
    main = sub[sub["estimator"] == first]
    other = sub[sub["estimator"] != first].set_index("head_name")
    main = main.reindex(main["effect"].abs().sort_values(ascending=False).index).head(TOP_K)
    kv = main["head_name"].str.contains("KV").any()
    header = ["head", f"effect ({first})", "interval", "metric change", "interval"]
    if len(other):
        header += ["estimate (attribution)" if first == "exact" else "exact", "interval"]
    if kv:
        header.append("query heads")
    if dla is not None and not kv:
        header.append("DLA (clean)")
    header += [] if kv else list(scores)
    rows = []
    for r in main.itertuples():
        cells = [
            f"<td>{_e(r.head_name)}</td>",
            _num(r.effect),
            _ci(r.ci_low, r.ci_high),
            _num(r.delta),
            _ci(r.delta_ci_low, r.delta_ci_high),
        ]
        if len(other):
            o = other.loc[r.head_name] if r.head_name in other.index else None
            cells += (
                [_num(o["effect"]), _ci(o["ci_low"], o["ci_high"])]
                if o is not None
                else ['<td class="num muted">not run</td>', "<td></td>"]
            )
        if kv:
            cells.append(f"<td>{_e(r.query_heads)}</td>")
        if dla is not None and not kv:
            cells.append(_num(dla.get(r.head_name, float("nan"))))
        if not kv:
            cells += [_num(s.get(r.head_name, float("nan"))) for s in scores.values()]
        rows.append(cells)
    return _table(header, rows)


def _dla(dla: pd.DataFrame, figures: bool) -> str:
    from headscope.report.patching import dla_heatmap

    clean = dla[dla["prompt"] == "clean"]
    top = clean.reindex(clean["dla"].abs().sort_values(ascending=False).index).head(TOP_K)
    corrupt = dla[dla["prompt"] == "corrupt"].set_index("head_name")["dla"]
    rows = [
        [
            f"<td>{_e(r.head_name)}</td>",
            _num(r.dla),
            _ci(r.ci_low, r.ci_high),
            _num(corrupt.get(r.head_name, float("nan"))),
        ]
        for r in top.itertuples()
    ]
    parts = [
        '<h2 id="dla">Direct logit attribution</h2>',
        '<p class="muted">Each head\'s output at the last position, through the output projection '
        "and the final norm with its scale frozen at that run's (the clean run's for DLA clean), "
        "projected on W_U[answer] - W_U[wrong] (logit "
        "units; what the head writes directly, not through later layers).</p>",
    ]
    if figures and len(clean):
        parts.append(f'<img alt="DLA heatmap" src="{figure_uri(dla_heatmap(dla, "clean"))}">')
    parts.append(_table(["head", "DLA clean", "interval", "DLA corrupt"], rows))
    return "".join(parts)


def patch_page_html(
    table: pd.DataFrame,
    baseline: pd.DataFrame,
    dla: pd.DataFrame | None,
    meta: dict,
    pattern: pd.DataFrame | None = None,
    figures: bool = True,
) -> str:
    """The whole page of a patching run (see the module docstring); ``figures=False``: tables."""
    from headscope.report.patching import effect_heatmap

    title = f"headscope patch: {meta.get('model', '?')} on {meta.get('task', '?')}"
    scores = _scores_by_head(pattern)
    dla_clean = None if dla is None else dla[dla["prompt"] == "clean"].set_index("head_name")["dla"]
    groups = list(table.groupby(["activation", "kv_mode"], sort=False))
    body = [
        f"<h1>{_e(title)}</h1>",
        _kv(_settings(meta)),
        "<nav>"
        + "".join(
            f'<a href="#a-{_e(a)}-{_e(m)}">{_e(a)}{"" if a not in ("k", "v") else " " + m}</a>'
            for (a, m), _ in groups
        )
        + ('<a href="#dla">direct logit attribution</a>' if dla is not None else "")
        + "</nav>",
        "<h2>Baseline</h2>",
        _baseline(baseline),
    ]
    for (act, mode), sub in groups:
        what = {
            "z": "head output (the head's slice of the output projection's input)",
            "q": "query",
            "k": "key",
            "v": "value",
            "pattern": "attention pattern (post-softmax rows)",
        }.get(act, act)
        kv = (
            ""
            if act not in ("k", "v")
            else (
                " · kv_mode group: the KV head, every query head sharing it sees the patch"
                if mode == "group"
                else " · kv_mode head: only what one query head reads"
            )
        )
        body.append(f'<h2 id="a-{_e(act)}-{_e(mode)}">{_e(act)}: {_e(what)}{_e(kv)}</h2>')
        for (direction, position), part in sub.groupby(["direction", "position"], sort=False):
            if str(position).isdigit() and len(sub["position"].unique()) > 8:
                continue  # single positions of a grid: in its figure and in patching.csv
            body.append(
                f"<h3>{_e(direction)} at {_e(position)}</h3>"
                f'<p class="muted">{_e(READ[direction])}.</p>'
            )
            if figures:
                est = "exact" if (part["estimator"] == "exact").any() else "attribution"
                fig = effect_heatmap(
                    table, act, str(position), direction, est, mode, meta.get("model", "")
                )
                body.append(
                    f'<img alt="{_e(act)} {_e(direction)} {_e(position)}" src="{figure_uri(fig)}">'
                )
            body.append(_slice(part, dla_clean if act == "z" else None, scores))
    if dla is not None:
        body.append(_dla(dla, figures))
    n_exact = int((table["estimator"] == "exact").sum())
    body.append(
        '<p class="muted">Effects are ratios of means over pairs; intervals are bootstrap '
        "percentile intervals over pairs (one draw shared by every row). <i>attribution</i> rows "
        "are first-order estimates (gradient times the activation difference), never "
        "measurements; <i>exact</i> rows "
        f"patch the head for real ({n_exact} rows here). Every pair's token ids are in the run's "
        "<code>tokens.jsonl</code>, every row in <code>patching.csv</code>."
        + ("" if figures else " This page was built without figures.")
        + "</p>"
    )
    return page(title, body)
