"""One page per run: ``report.html``, a self-contained file a person opens from disk and shares.

Everything the page shows is inside it: styles inline, figures as ``data:`` PNGs, no script, no
link, no font or image fetched from anywhere, so it opens offline and looks the same everywhere. It
is drawn from the run's table and metadata alone (never the model), so ``headscope report RUN_DIR``
rebuilds the same page from a saved run.

What it holds, top to bottom: the model (source, sha256), the scan's settings and timings; the
headline findings; for every behaviour its definition, heatmap and top heads with chance, interval,
null, label stability and, when the run measured them, each head's causal effects; the labelled
heads; the threshold sweep; what could not be measured and why. :func:`summary_html` is the short
form a notebook shows for a scan result (``ScanResult._repr_html_``).

Interactive attention views need the model and are not part of the page: the page says so, and
``headscope show MODEL --head L.H --html`` draws one.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math

import pandas as pd
from matplotlib.figure import Figure

from headscope.catalog import describe, is_below
from headscope.outputs import HTML_GENERATOR, PNG_METADATA
from headscope.report import headline, top_heads
from headscope.result import ScanResult, fmt
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
"""


def figure_uri(fig: Figure, dpi: int = DPI) -> str:
    """A figure as a ``data:image/png;base64,...`` URI (tagged as headscope's, no timestamp)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata=PNG_METADATA)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _e(x) -> str:
    return html.escape(str(x))


def _num(x, digits: int = 3) -> str:
    return f'<td class="num">{_e(fmt(float(x), digits)) if x is not None else "NaN"}</td>'


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cells) + "</tr>" for cells in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _kv(pairs: list[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs)
    return f"<table><tbody>{rows}</tbody></table>"


def _settings(result: ScanResult) -> list[tuple[str, str]]:
    md = result.metadata
    src = md.get("source", {}) or {}
    pairs = [("model", md.get("model", result.model_name)),
             ("shape", f"{md.get('n_layers', '?')} layers x {md.get('n_heads', '?')} heads, "
                       + ("causal decoder" if md.get("causal", True) else "bidirectional encoder")),
             ("source", src.get("source", "?"))]
    pairs += [(label, src[key]) for key, label in (("repo_id", "original"), ("weights_sha256", "weights sha256"))
              if src.get(key)]
    for name, probe in (md.get("probes") or {}).items():
        pairs.append((f"probe {name}", json.dumps(probe, sort_keys=True, default=str)))
    for key in ("engine", "device", "dtype", "seed", "bootstrap", "effects", "versions", "timings"):
        if key in md:
            value = md[key]
            pairs.append((key, json.dumps(value, sort_keys=True, default=str) if isinstance(value, dict) else str(value)))
    return pairs


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
        cells = [f"<td>{_e(r.head_name)}</td>", _num(r.score), f'<td class="num">{_e(ci)}</td>', _num(r.chance),
                 _num(getattr(r, "null", float("nan"))),
                 f'<td class="num{" shaky" if shaky else ""}">{_e(fmt(stab, 2)) if stab == stab else ""}</td>',
                 f"<td>{_e(r.label)}</td>"]
        cells += [_num(by_head[e].get(r.head_name, float("nan"))) for e in effects]
        rows.append(cells)
    return rows


def _behaviour(result: ScanResult, metric: str, figures: bool, n_sequences: dict[str, int]) -> str:
    from headscope.plots import heatmap

    scores = result.scores
    sub = scores[scores["metric"] == metric]
    info = describe(metric)
    parts = [f'<h2 id="m-{_e(metric)}">{_e(metric)}</h2>']
    if info is not None:
        t = result.thresholds.get(metric, getattr(info, "threshold", math.inf))
        rule = f"; label '{info.label}' at {'<=' if is_below(metric) else '>='} {t:g}" if info.label else ""
        parts.append(f'<p class="muted">{_e(info.definition)} (probe: {_e(info.probe)}{_e(rule)})</p>')
    if sub["score"].isna().all():
        reason = getattr(info, "nan_reason", None) or "no qualifying queries"
        return "".join(parts) + f"<p>NaN for every head: {_e(reason)}.</p>"
    if figures:
        probe = str(sub["probe"].iloc[0])
        fig = heatmap(scores, metric, n_sequences=n_sequences.get(probe))
        parts.append(f'<img alt="{_e(metric)} heatmap" src="{figure_uri(fig)}">')
    effects = [] if metric in _effects_of(scores) else _effects_of(scores)
    header = ["head", "score", "interval", "chance", "null", "stability", "label"] + effects
    parts.append(_table(header, _top_rows(scores, metric, effects)))
    return "".join(parts)


def report_html(result: ScanResult, figures: bool = True) -> str:
    """The whole page of a run (see the module docstring). ``figures=False``: tables only."""
    from headscope.plots import threshold_sweep

    scores = result.scores
    metrics = list(scores["metric"].unique())
    n_sequences = {p.name: len(p) for p in result.probes} or {
        name: s.get("n_sequences") for name, s in (result.metadata.get("probes") or {}).items()}
    title = f"headscope scan: {result.model_name}"
    body = [f"<h1>{_e(title)}</h1>", _kv(_settings(result)),
            "<nav>" + "".join(f'<a href="#m-{_e(m)}">{_e(m)}</a>' for m in metrics) + "</nav>",
            "<h2>Headline findings</h2><ul>" + "".join(f"<li>{_e(s)}</li>" for s in headline(scores)) + "</ul>"]
    body += [_behaviour(result, m, figures, n_sequences) for m in metrics]
    labelled = scores[scores["label"] != ""]
    rows = []
    for metric in metrics:
        sub = labelled[labelled["metric"] == metric]
        if len(sub):
            names = ", ".join(sub["head_name"])
            rows.append([f"<td>{_e(sub['label'].iloc[0])}</td>", f"<td>{_e(metric)}</td>",
                         f'<td class="num">{len(sub)}</td>', f"<td>{_e(names)}</td>"])
    body.append("<h2>Labelled heads</h2>" + (_table(["label", "metric", "heads", "names"], rows) if rows else "<p>none</p>"))
    if figures and any(getattr(describe(m), "label", "") for m in metrics):
        body.append(f'<h2>Labels against the threshold</h2><img alt="threshold sweep" '
                    f'src="{figure_uri(threshold_sweep(scores, result.thresholds))}">')
    body.append('<p class="muted">Interactive attention views need the model and are not part of this page: '
                "<code>headscope show MODEL --head L.H --html</code> draws one. Scores pool over every (sequence, "
                "qualifying query) pair; <code>chance</code> is a head that spreads attention evenly over the keys "
                "it can see; intervals are bootstrap percentile intervals over sequences; a stability under "
                f"{STABLE} means the label depends on which sequences were drawn. Token ids of every scored sequence "
                "are in the run's <code>tokens.jsonl</code>." + ("" if figures else " This page was built without figures.")
                + "</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">" + HTML_GENERATOR
            + f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def summary_html(result: ScanResult) -> str:
    """The short form for a notebook: the model, and per behaviour chance, labelled heads and the top
    three heads (with intervals when the scan has them)."""
    scores = result.scores
    md = result.metadata
    rows = []
    for metric in scores["metric"].unique():
        sub = scores[scores["metric"] == metric]
        tops = []
        for r in top_heads(scores, metric, 3).itertuples():
            lo = getattr(r, "ci_low", float("nan"))
            tops.append(f"{r.head_name} {fmt(r.score)}" + (f" [{fmt(lo)}, {fmt(r.ci_high)}]" if lo == lo else ""))
        rows.append([f"<td>{_e(metric)}</td>", _num(sub["chance"].iloc[0]),
                     f'<td class="num">{int((sub["label"] != "").sum())}</td>', f"<td>{_e(', '.join(tops) or 'NaN')}</td>"])
    n = sum(len(p) for p in result.probes)
    head = (f"<b>{_e(result.model_name)}</b>: {_e(md.get('n_layers', '?'))} layers x {_e(md.get('n_heads', '?'))} "
            f"heads, {n} sequences, engine {_e(md.get('engine', '?'))}")
    return f"<div>{head}{_table(['metric', 'chance', 'labelled', 'top heads'], rows)}</div>"
