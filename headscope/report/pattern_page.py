"""One head's (or one layer's) pattern on one text as a self-contained HTML page (``headscope show
--html``): data, CSS and a few lines of hand-written JS inlined, so it opens offline (no CDN, no
network). Hover a cell for the query token, key token and weight; with a layer, hover or click a
head's name to show its pattern."""

from __future__ import annotations

import html
import json
import re

import numpy as np

from headscope.files import HTML_GENERATOR, VIRIDIS_JS
from headscope.result import HeadPattern

_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
__GENERATOR__
<title>__TITLE__</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
#readout { font-family: monospace; min-height: 1.4em; padding: .3em 0; white-space: pre;
           position: sticky; top: 0; background: #fff; }
table { border-collapse: collapse; font-family: monospace; font-size: 11px; }
td.c { width: 14px; height: 14px; padding: 0; border: 1px solid #fff; }
th { font-weight: normal; padding: 0 3px; white-space: pre; }
th.k { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; vertical-align: bottom; }
th.q { text-align: right; }
th.on { background: #ffd54f; }
#heads button { font-family: monospace; margin: 0 4px 6px 0; padding: 2px 6px; border: 1px solid #999;
                background: #fff; cursor: pointer; }
#heads button.sel { background: #ffd54f; }
td.c:hover { outline: 2px solid #e53935; }
</style></head>
<body>
<h3>__TITLE__</h3>
<div>text: <code>__TEXT__</code></div>
<div>rows: queries, columns: keys; colour 0 (dark) to 1 (yellow). Hover a cell.</div>
<div id="heads"></div>
<div id="readout"></div>
<table id="grid"></table>
<noscript>This view needs JavaScript (inline, no network access).</noscript>
<script type="application/json" id="hs-data">__DATA__</script>
<script>
(function () {
  const D = JSON.parse(document.getElementById("hs-data").textContent);
  const T = D.tokens, n = T.length;
  const PS = D.patterns || [D.pattern], NAMES = D.heads || [""];
  let P = PS[0];
__COLOUR__
  const grid = document.getElementById("grid"), out = document.getElementById("readout");
  const head = grid.insertRow();
  head.appendChild(document.createElement("th"));
  const keyCells = [], queryCells = [];
  T.forEach(function (t) {
    const th = document.createElement("th"); th.className = "k"; th.textContent = t;
    head.appendChild(th); keyCells.push(th);
  });
  const cells = [];
  for (let q = 0; q < n; q++) {
    const row = grid.insertRow();
    const th = document.createElement("th"); th.className = "q"; th.textContent = T[q];
    row.appendChild(th); queryCells.push(th);
    for (let k = 0; k < n; k++) {
      const td = row.insertCell(); td.className = "c";
      td.dataset.q = q; td.dataset.k = k; cells.push(td);
    }
  }
  function paint() { cells.forEach(function (td) { td.style.background = colour(P[+td.dataset.q][+td.dataset.k]); }); }
  paint();
  if (PS.length > 1) {
    const bar = document.getElementById("heads"), buttons = [];
    const select = function (h) {
      P = PS[h]; paint(); out.textContent = NAMES[h];
      buttons.forEach(function (b, i) { b.classList.toggle("sel", i === h); });
    };
    NAMES.forEach(function (name, h) {
      const b = document.createElement("button"); b.textContent = name; buttons.push(b);
      b.addEventListener("mouseover", function () { select(h); });
      b.addEventListener("click", function () { select(h); });
      bar.appendChild(b);
    });
    select(0);
  }
  let last = null;
  grid.addEventListener("mouseover", function (e) {
    const td = e.target.closest("td.c"); if (!td) return;
    const q = +td.dataset.q, k = +td.dataset.k;
    if (last) { last.forEach(function (c) { c.classList.remove("on"); }); }
    last = [queryCells[q], keyCells[k]];
    last.forEach(function (c) { c.classList.add("on"); });
    out.textContent = (PS.length > 1 ? NAMES[PS.indexOf(P)] + "  " : "") + "query " + q + " " + JSON.stringify(T[q]) + "  ->  key " + k + " " +
      JSON.stringify(T[k]) + "  weight " + P[q][k].toFixed(4);
  });
})();
</script>
</body></html>
"""  # noqa: E501 (a template: its lines are the page's)


_HTML = _HTML.replace("__COLOUR__", VIRIDIS_JS)  # the shared colour scale, once


def pattern_html(hp: HeadPattern) -> str:
    """A self-contained HTML page: hover a cell for query token, key token and weight."""
    title = f"{hp.model}: {hp.head_name} attention"
    data = {
        "model": hp.model,
        "layer": hp.layer,
        "head": hp.head,
        "tokens": hp.tokens,
        "token_ids": hp.token_ids,
        "pattern": np.round(hp.pattern.astype(float), 6).tolist(),
    }
    # "<" escaped so no token can close the <script> element early.
    blob = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
    return _fill(title, hp.text, blob)


def layer_html(hps: list[HeadPattern]) -> str:
    """Every head of one layer in one self-contained page: hover (or click) a head's name to show
    its pattern, hover a cell for query token, key token and weight."""
    first = hps[0]
    title = f"{first.model}: layer {first.layer}, every head"
    data = {
        "model": first.model,
        "layer": first.layer,
        "heads": [hp.head_name for hp in hps],
        "tokens": first.tokens,
        "token_ids": first.token_ids,
        "patterns": [np.round(hp.pattern.astype(float), 6).tolist() for hp in hps],
    }
    blob = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
    return _fill(title, first.text, blob)


def _fill(title: str, text: str, blob: str) -> str:
    """The page with its placeholders filled in one pass (a text holding a placeholder stays
    text)."""
    values = {
        "__GENERATOR__": HTML_GENERATOR,
        "__TITLE__": html.escape(title),
        "__TEXT__": html.escape(text),
        "__DATA__": blob,
    }
    return re.sub("__(?:GENERATOR|TITLE|TEXT|DATA)__", lambda m: values[m.group()], _HTML)
