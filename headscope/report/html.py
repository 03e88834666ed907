"""One page per run: ``report.html``, a self-contained file a person opens from disk and shares.

Everything the page shows is inside it: styles and its one script inline, figures as ``data:`` PNGs,
no link, no font, image or script fetched from anywhere, so it opens offline and looks the same
everywhere. It is drawn from the run's saved files alone (never the model), so ``headscope report
RUN_DIR`` rebuilds the same page from a saved run.

What it holds, top to bottom: the model (source, sha256), the scan's settings and timings; the
headline findings; for every behaviour its definition, heatmap and top heads with chance, interval,
null, label stability and, when the run measured them, each head's causal effects; the labelled
heads; the threshold sweep; where the strongest heads look on one example of each probe
(interactive: hover a head, then a cell; the patterns were kept by the scan,
:mod:`headscope.scanner.examples`); what could not be measured and why. :func:`summary_html` is the
short form a notebook shows for a scan result.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from headscope.catalog import describe, is_below
from headscope.files import HTML_GENERATOR, PNG_METADATA, VIRIDIS_JS
from headscope.report.tables import chance_text, headline, top_heads
from headscope.result import NULL_PROBE, ScanResult, fmt
from headscope.uncertainty import STABLE

TOP_K = 10  # heads per behaviour in the page's tables
DPI = 90  # figure resolution in the page: a 30 x 9 model's report stays near 1 MB

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; margin: 0 auto;
       max-width: 1100px; padding: 1.5em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: #666; } .shaky { color: #a15c00; } img { max-width: 100%; height: auto; }
nav a { margin-right: 0.8em; } code { background: #f4f4f4; padding: 0 3px; }
.hs-heads button { font-family: monospace; margin: 0 4px 6px 0; padding: 2px 6px; border: 1px solid #999;
                   background: #fff; cursor: pointer; } .hs-heads button.sel { background: #ffd54f; }
.hs-readout { font-family: monospace; min-height: 1.4em; white-space: pre; }
table.hs-grid { border-collapse: collapse; font-family: monospace; font-size: 10px; }
table.hs-grid td { width: 7px; height: 7px; padding: 0; border: 0; }
table.hs-grid th { font-weight: normal; padding: 0 2px; white-space: pre; border: 0; background: none; }
table.hs-grid th.k { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }
table.hs-grid th.on { background: #ffd54f; }
"""  # noqa: E501 (a template: its lines are the page's)

# The views' script: decodes each example's uint16 patterns and draws one head at a time.
_SCRIPT = """
(function () {
  const D = JSON.parse(document.getElementById("hs-views").textContent);
__COLOUR__
  D.examples.forEach(function (ex, e) {
    const root = document.getElementById("hs-view-" + e), T = ex.tokens, n = T.length;
    const bin = atob(ex.data), W = new Float32Array(bin.length / 2);
    for (let i = 0; i < W.length; i++) W[i] = (bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8)) / 65535;
    const grid = root.querySelector("table.hs-grid"), out = root.querySelector(".hs-readout");
    const top = grid.insertRow(); top.appendChild(document.createElement("th"));
    const keys = [], queries = [], cells = [];
    T.forEach(function (t) { const th = document.createElement("th"); th.className = "k"; th.textContent = t;
                             top.appendChild(th); keys.push(th); });
    for (let q = 0; q < n; q++) {
      const row = grid.insertRow(), th = document.createElement("th");
      th.textContent = T[q]; row.appendChild(th); queries.push(th);
      for (let k = 0; k < n; k++) { const td = row.insertCell(); td.dataset.q = q; td.dataset.k = k; cells.push(td); }
    }
    let h = 0, lit = [];
    const buttons = [];
    function select(i) {
      h = i; out.textContent = D.heads[i];
      cells.forEach(function (td) { td.style.background = colour(W[(h * n + (+td.dataset.q)) * n + (+td.dataset.k)]); });
      buttons.forEach(function (b, j) { b.classList.toggle("sel", j === i); });
    }
    D.heads.forEach(function (name, i) {
      const b = document.createElement("button"); b.textContent = name; buttons.push(b);
      b.addEventListener("mouseover", function () { select(i); });
      b.addEventListener("click", function () { select(i); });
      root.querySelector(".hs-heads").appendChild(b);
    });
    grid.addEventListener("mouseover", function (ev) {
      const td = ev.target.closest("td"); if (!td) return;
      const q = +td.dataset.q, k = +td.dataset.k;
      lit.forEach(function (c) { c.classList.remove("on"); });
      lit = [queries[q], keys[k]]; lit.forEach(function (c) { c.classList.add("on"); });
      out.textContent = D.heads[h] + "  query " + q + " " + JSON.stringify(T[q]) + " -> key " + k + " " +
        JSON.stringify(T[k]) + "  weight " + W[(h * n + q) * n + k].toFixed(4);
    });
    select(0);
  });
})();
"""  # noqa: E501 (a template: its lines are the page's)


_SCRIPT = _SCRIPT.replace("__COLOUR__", VIRIDIS_JS)


def figure_uri(fig: Figure, dpi: int = DPI) -> str:
    """A figure as a ``data:image/png;base64,...`` URI (tagged as headscope's, no timestamp)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata=PNG_METADATA)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _e(x) -> str:
    return html.escape(str(x))


def _num(x, digits: int = 3) -> str:
    """A number's cell (None: NaN; text that is no number: the text, escaped)."""
    try:
        text = "NaN" if x is None else fmt(float(x), digits)
    except (TypeError, ValueError):
        text = str(x)
    return f'<td class="num">{_e(text)}</td>'


def _ci(lo, hi, digits: int = 3) -> str:
    """An interval's cell, empty where it is missing."""
    ok = lo is not None and lo == lo
    text = f"[{fmt(float(lo), digits)}, {fmt(float(hi), digits)}]" if ok else ""
    return f'<td class="num">{_e(text)}</td>'


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cells) + "</tr>" for cells in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(title: str, body: list[str], style: str = "") -> str:
    """A self-contained HTML page (nothing fetched): ``title``, the shared style (plus ``style``)
    and the ``body`` parts, one a line; what every report page of headscope is."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        + HTML_GENERATOR
        + f"<title>{_e(title)}</title><style>{_STYLE}{style}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _kv(pairs: list[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs)
    return f"<table><tbody>{rows}</tbody></table>"


def _settings(result: ScanResult) -> list[tuple[str, str]]:
    md = result.metadata
    src = md.get("source", {}) or {}
    pairs = [
        ("model", md.get("model", result.model_name)),
        (
            "shape",
            f"{md.get('n_layers', '?')} layers x {md.get('n_heads', '?')} heads, "
            + ("causal decoder" if md.get("causal", True) else "bidirectional encoder"),
        ),
        ("source", src.get("source", "?")),
    ]
    pairs += source_pairs(src)
    for name, probe in (md.get("probes") or {}).items():
        pairs.append((f"probe {name}", _readable(probe)))
    pairs += recorded(md, ("engine", "device", "dtype", "seed", "bootstrap", "effects"))
    if md.get("settings_changed"):
        pairs.append(("settings changed from the defaults", _readable(md["settings_changed"])))
    return pairs


def source_pairs(src: dict) -> list[tuple[str, str]]:
    """The header rows that identify the weights of a run's ``source`` record."""
    names = (
        ("repo_id", "original"),
        ("weights_sha256", "weights sha256"),
        ("state_dict_sha256", "weights sha256 (in memory)"),
    )
    return [(label, src[key]) for key, label in names if src.get(key)]


def recorded(meta: dict, keys: tuple[str, ...]) -> list[tuple[str, str]]:
    """The header rows of ``keys`` then versions and timings, as recorded in ``meta``, and what
    the run skipped (figures, page)."""
    pairs = [
        (key.replace("_", " "), _readable(meta[key], seconds=key == "timings"))
        for key in (*keys, "versions", "timings")
        if key in meta
    ]
    skipped = ("figures_skipped", "report_skipped")
    return pairs + [(k.replace("_", " "), _readable(meta[k])) for k in skipped if meta.get(k)]


def _readable(value, seconds: bool = False) -> str:
    """A recorded value as a person reads it: ``key: value`` pairs, lists joined, long text kept
    whole."""
    if isinstance(value, dict):
        parts = []
        for k, v in value.items():
            if isinstance(v, float) and seconds:
                parts.append(f"{k.removesuffix('_s')} {v:.1f} s")
            else:
                parts.append(f"{k}: {_readable(v)}")
        return "; ".join(parts) or "(none)"
    if isinstance(value, (list, tuple)):
        return ", ".join(_readable(v) for v in value) or "(none)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _effects_of(scores: pd.DataFrame) -> list[str]:
    return [m for m in scores["metric"].unique() if m.startswith(("effect_", "attribution_"))]


def _top_rows(scores: pd.DataFrame, metric: str, effects: list[str]) -> list[list[str]]:
    by_head = {e: scores[scores["metric"] == e].set_index("head_name")["score"] for e in effects}
    rows = []
    for r in top_heads(scores, metric, TOP_K).itertuples():
        stab = getattr(r, "stability", float("nan"))
        shaky = stab == stab and stab < STABLE and r.label
        lo, hi = getattr(r, "ci_low", float("nan")), getattr(r, "ci_high", float("nan"))
        ci = f"[{fmt(lo)}, {fmt(hi)}]" if lo == lo else ""
        cells = [
            f"<td>{_e(r.head_name)}</td>",
            _num(r.score),
            f'<td class="num">{_e(ci)}</td>',
            _num(r.chance),
            _num(getattr(r, "null", float("nan"))),
            "<td "
            f'class="num{" shaky" if shaky else ""}">'
            f"{_e(fmt(stab, 2)) if stab == stab else ''}</td>",
            f"<td>{_e(r.label)}</td>",
        ]
        cells += [_num(by_head[e].get(r.head_name, float("nan"))) for e in effects]
        rows.append(cells)
    return rows


def _behaviour(result: ScanResult, metric: str, figures: bool, n_sequences: dict[str, int]) -> str:
    from headscope.report.figures import heatmap

    scores = result.scores
    sub = scores[scores["metric"] == metric]
    info = describe(metric)
    parts = [f'<h2 id="m-{_e(metric)}">{_e(metric)}</h2>']
    if info is not None:
        t = result.thresholds.get(metric, getattr(info, "threshold", math.inf))
        rule = (
            f"; label '{info.label}' at {'<=' if is_below(metric) else '>='} {t:g}"
            if info.label
            else ""
        )
        parts.append(
            f'<p class="muted">{_e(info.definition)} (probe: {_e(info.probe)}{_e(rule)})</p>'
        )
    if sub["score"].isna().all():
        reason = getattr(info, "nan_reason", None) or "no qualifying queries"
        return "".join(parts) + f"<p>NaN for every head: {_e(reason)}.</p>"
    if figures:
        probe = str(sub["probe"].iloc[0])
        fig = heatmap(
            scores, metric, n_sequences=n_sequences.get(probe), thresholds=result.thresholds
        )
        parts.append(f'<img alt="{_e(metric)} heatmap" src="{figure_uri(fig)}">')
    effects = [] if metric in _effects_of(scores) else _effects_of(scores)
    header = ["head", "score", "interval", "chance", "null", "stability", "label"] + effects
    parts.append(_table(header, _top_rows(scores, metric, effects)))
    return "".join(parts)


def _views(result: ScanResult) -> str:
    """The interactive section: one grid per kept example, a button per head (empty without
    views)."""
    views = result.views or {}
    if not views.get("examples"):
        return ""
    scores = result.scores
    names = []
    for layer, head in views["heads"]:
        tops = [
            m
            for m in scores["metric"].unique()
            if len(top := top_heads(scores, m, 1))
            and (int(top["layer"].iloc[0]), int(top["head"].iloc[0])) == (layer, head)
        ]
        names.append(f"L{layer}H{head}" + (f" ({', '.join(tops)})" if tops else ""))
    data = {"heads": names, "examples": []}
    parts = [
        '<h2 id="views">Where the top heads look</h2>',
        '<p class="muted">The strongest head of each labelled behaviour on the first sequence '
        "of each probe, as the scan kept it. Hover (or click) a head, then hover a cell: rows are "
        "queries, columns keys, colour 0 (dark) to 1 (yellow); weights are stored to 1/65535.</p>",
    ]
    for i, ex in enumerate(views["examples"]):
        pattern = np.asarray(ex["pattern"], dtype=np.float64)  # [head, query, key]
        n = pattern.shape[-1]
        q16 = np.round(np.clip(pattern, 0.0, 1.0) * 65535).astype("<u2")
        data["examples"].append(
            {"tokens": list(ex["tokens"]), "data": base64.b64encode(q16.tobytes()).decode("ascii")}
        )
        cut = (
            f", the first {n} of its {ex['n_full']} tokens" if ex["n_full"] > n else f", {n} tokens"
        )
        parts.append(
            f'<h3>{_e(ex["probe"])} probe, sequence 0{_e(cut)}</h3><div id="hs-view-{i}">'
            '<div class="hs-heads"></div><div class="hs-readout"></div>'
            '<div style="overflow-x: auto"><table class="hs-grid"></table></div></div>'
        )
    blob = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
    parts.append(
        f'<script type="application/json" id="hs-views">{blob}</script><script>{_SCRIPT}</script>'
    )
    parts.append(
        "<noscript>The views above need JavaScript (inline; nothing is fetched).</noscript>"
    )
    return "".join(parts)


def report_html(result: ScanResult, figures: bool = True) -> str:
    """The whole page of a run (see the module docstring). ``figures=False``: tables only."""
    from headscope.report.figures import threshold_sweep

    scores = result.scores
    metrics = list(scores["metric"].unique())
    n_sequences = {p.name: len(p) for p in result.probes} or {
        name: s.get("n_sequences") for name, s in (result.metadata.get("probes") or {}).items()
    }
    title = f"headscope scan: {result.model_name}"
    body = [
        f"<h1>{_e(title)}</h1>",
        _kv(_settings(result)),
        "<nav>"
        + "".join(f'<a href="#m-{_e(m)}">{_e(m)}</a>' for m in metrics)
        + (
            '<a href="#views">where the top heads look</a>'
            if (result.views or {}).get("examples")
            else ""
        )
        + "</nav>",
        "<h2>Headline findings</h2><ul>"
        + "".join(f"<li>{_e(s)}</li>" for s in headline(scores))
        + "</ul>",
    ]
    body += [_behaviour(result, m, figures, n_sequences) for m in metrics]
    labelled = scores[scores["label"] != ""]
    rows = []
    for metric in metrics:
        sub = labelled[labelled["metric"] == metric]
        if len(sub):
            names = ", ".join(sub["head_name"])
            rows.append(
                [
                    f"<td>{_e(sub['label'].iloc[0])}</td>",
                    f"<td>{_e(metric)}</td>",
                    f'<td class="num">{len(sub)}</td>',
                    f"<td>{_e(names)}</td>",
                ]
            )
    body.append(
        "<h2>Labelled heads</h2>"
        + (_table(["label", "metric", "heads", "names"], rows) if rows else "<p>none</p>")
    )
    if figures and any(getattr(describe(m), "label", "") for m in metrics):
        body.append(
            f'<h2>Labels against the threshold</h2><img alt="threshold sweep" '
            f'src="{figure_uri(threshold_sweep(scores, result.thresholds))}">'
        )
    body.append(_views(result))
    body.append(
        '<p class="muted">Other heads and texts: <code>headscope show MODEL --head L.H '
        "--html</code> (or <code>--layer L</code>) draws them with the model. Scores pool over "
        "every (sequence, qualifying query) pair; <code>chance</code> is a head that spreads "
        "attention evenly over the keys it can see; intervals are bootstrap percentile intervals "
        f"over sequences; a stability under {STABLE} means the label depends on which sequences "
        "were drawn. Token ids of every scored sequence are in the run's "
        "<code>tokens.jsonl</code>."
        + ("" if figures else " This page was built without figures.")
        + "</p>"
    )
    return page(title, body)


def summary_html(result: ScanResult) -> str:
    """The short form for a notebook: the model, and per behaviour chance, labelled heads and the
    top three heads (with intervals when the scan has them)."""
    scores = result.scores
    md = result.metadata
    rows = []
    for metric in scores["metric"].unique():
        sub = scores[scores["metric"] == metric]
        tops = []
        for r in top_heads(scores, metric, 3).itertuples():
            lo = getattr(r, "ci_low", float("nan"))
            tops.append(
                f"{r.head_name} {fmt(r.score)}"
                + (f" [{fmt(lo)}, {fmt(r.ci_high)}]" if lo == lo else "")
            )
        rows.append(
            [
                f"<td>{_e(metric)}</td>",
                f'<td class="num">{_e(chance_text(sub["chance"]))}</td>',
                f'<td class="num">{int((sub["label"] != "").sum())}</td>',
                f"<td>{_e(', '.join(tops) or 'NaN')}</td>",
            ]
        )
    n = sum(len(p) for p in result.probes if p.name != NULL_PROBE)
    controls = sum(len(p) for p in result.probes if p.name == NULL_PROBE)
    head = (
        f"<b>{_e(result.model_name)}</b>: {_e(md.get('n_layers', '?'))} layers x "
        f"{_e(md.get('n_heads', '?'))} heads, {n} sequences"
        + (f" (+ {controls} positional-null controls)" if controls else "")
        + f", engine {_e(md.get('engine', '?'))}"
    )
    return f"<div>{head}{_table(['metric', 'chance', 'labelled', 'top heads'], rows)}</div>"
