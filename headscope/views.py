"""One head's attention pattern on one text (or every head of a layer): extract it, draw it, write it
as an offline HTML page.

    >>> model = headscope.load_model("smollm2-135m")                   # doctest: +SKIP
    >>> hp = head_pattern(model, "The river bank flooded", 3, 2)       # doctest: +SKIP
    >>> hp.pattern.shape                                               # doctest: +SKIP
    (6, 6)
    >>> pattern_figure(hp).savefig("smollm2-135m-L3H2.png")            # doctest: +SKIP

The pattern is post-softmax, rows = queries, columns = keys, over ``model.wrap(model.encode(text))``
(BOS + tokens for decoders, [CLS] + tokens + [SEP] for encoders), one sequence, no padding.

The HTML view is one self-contained file: data, CSS and a few lines of hand-written JS are inlined,
so it opens offline (no CDN, no network). Hovering a cell shows the query token, key token and weight.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from headscope.errors import HeadscopeError, setting
from headscope.outputs import (
    HTML_GENERATOR,
    VIRIDIS_JS,
    check_replaceable,
    save_figure,
    write_atomic,
)
from headscope.result import display_token, head_name, model_slug  # noqa: F401 - display_token re-exported

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
DEFAULT_TEXT = "The river bank flooded after the storm, and the path was closed."


@dataclass(frozen=True)
class HeadPattern:
    """One head's pattern on one sequence, with what is needed to label it."""

    model: str  # the model name as typed
    layer: int
    head: int
    text: str
    token_ids: list[int]
    tokens: list[str]  # display strings (see :func:`display_token`)
    pattern: np.ndarray  # [query, key], float32, post-softmax
    causal: bool

    @property
    def head_name(self) -> str:
        return head_name(self.layer, self.head)


# ------------------------------------------------------------------------------ names


def default_out_path(model_name: str, layer: int, head: int) -> Path:
    """``./{model-slug}-L{layer}H{head}.png``."""
    return Path(f"{model_slug(model_name)}-L{layer}H{head}.png")


_HEAD_RE = re.compile(r"^\s*(?:L\s*)?(\d+)\s*(?:\.|H)\s*(\d+)\s*$", re.IGNORECASE)


def parse_head(spec: str, n_layers: int | None = None, n_heads: int | None = None) -> tuple[int, int]:
    """``"3.2"`` (or ``"L3H2"``) -> ``(3, 2)``, 0-based; checked against the model's shape when given.

    Without ``n_layers``/``n_heads`` only the form is checked (the CLI does that before it spends
    seconds loading the model, then checks the range).

    >>> parse_head("3.2", 30, 9), parse_head("L3H2")
    ((3, 2), (3, 2))
    >>> parse_head("3-2", 30, 9)
    Traceback (most recent call last):
    ...
    headscope.errors.HeadscopeError: Head '3-2' is not LAYER.HEAD; write it like 3.2 (layers 0..29, heads 0..8).
    """
    sized = n_layers is not None and n_heads is not None
    valid = f"layers 0..{n_layers - 1}, heads 0..{n_heads - 1}" if sized else "0-based layer, then head"
    m = _HEAD_RE.match(spec)
    if m is None:
        nums = [int(x) for x in re.findall(r"\d+", spec)]
        if len(nums) != 2:
            nums = [0, 0]
        if sized:
            nums = [min(nums[0], n_layers - 1), min(nums[1], n_heads - 1)]
        raise HeadscopeError(f"Head '{spec}' is not LAYER.HEAD; write it like {nums[0]}.{nums[1]} ({valid}).")
    layer, head = int(m.group(1)), int(m.group(2))
    if sized and (layer >= n_layers or head >= n_heads):
        nearest = f"{min(layer, n_layers - 1)}.{min(head, n_heads - 1)}"
        raise HeadscopeError(f"Head '{spec}' is out of range: the model has {valid}; nearest valid: {nearest}.")
    return layer, head


# ------------------------------------------------------------------------------ extraction


def head_pattern(model, text: str, layer: int, head: int) -> HeadPattern:
    """Run ``model`` once on ``text`` and keep head ``(layer, head)``'s ``[query, key]`` pattern."""
    if not (0 <= layer < model.n_layers and 0 <= head < model.n_heads):
        parse_head(f"{layer}.{head}", model.n_layers, model.n_heads)  # raises with the valid range
    return _patterns(model, text, layer, [head])[0]


def layer_patterns(model, text: str, layer: int) -> list[HeadPattern]:
    """Every head of ``layer`` on ``text``, from one forward (head 0 first)."""
    check_layer(layer, model.n_layers)
    return _patterns(model, text, layer, list(range(model.n_heads)))


def _patterns(model, text: str, layer: int, heads: list[int]) -> list[HeadPattern]:
    import torch

    body = model.encode(text)
    if not body:
        raise HeadscopeError("The text has no tokens; give a non-empty --text, e.g. 'The river bank flooded'.")
    ids = model.wrap(body)
    if len(ids) > model.n_ctx:
        raise HeadscopeError(f"The text is {len(ids)} tokens with special tokens, longer than the model's "
                             f"context ({model.n_ctx}); shorten it to at most {model.n_ctx - (len(ids) - len(body))} tokens.")
    tokens = torch.tensor([ids], dtype=torch.long)  # [1, pos]
    mask = torch.ones_like(tokens, dtype=torch.bool)  # [1, pos]
    kept: dict[str, np.ndarray] = {}

    def on_pattern(_layer: int, pattern) -> None:  # pattern: [batch=1, head, query, key]
        kept["p"] = pattern[0, heads].float().cpu().numpy().copy()  # [head, query, key]

    model.run_patterns(tokens, mask, on_pattern, layers=[layer])
    labels = [display_token(s) for s in model.str_tokens(ids)]
    return [HeadPattern(model=model.name, layer=layer, head=h, text=text, token_ids=list(ids), tokens=labels,
                        pattern=kept["p"][i], causal=model.causal) for i, h in enumerate(heads)]


def check_layer(layer: int, n_layers: int) -> int:
    """A 0-based layer index, or one line naming the valid range and the nearest layer."""
    if not 0 <= layer < n_layers:
        nearest = min(max(layer, 0), n_layers - 1)
        raise HeadscopeError(f"Layer {layer} is out of range: the model has layers 0..{n_layers - 1}; "
                             f"nearest valid: {nearest}.")
    return layer


# ------------------------------------------------------------------------------ figure


def pattern_figure(hp: HeadPattern) -> Figure:
    """Query rows x key columns, colour 0-1, tokens on both axes, model and head in the title."""
    n = len(hp.tokens)
    side = float(np.clip(0.28 * n + 2.5, 4.0, 24.0))
    fig = Figure(figsize=(side + 1.2, side), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(hp.pattern, cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    step = max(1, int(np.ceil(n / 150)))  # keep labels legible on long texts
    ticks = list(range(0, n, step))
    size = 9 if n <= 30 else 7 if n <= 60 else 5
    ax.set_xticks(ticks, [hp.tokens[i] for i in ticks], rotation=90, fontsize=size)
    ax.set_yticks(ticks, [hp.tokens[i] for i in ticks], fontsize=size)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if n <= 16:  # write the weights on a small grid
        for (q, k), v in np.ndenumerate(hp.pattern):
            if v >= 0.05:
                ax.text(k, q, f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if v > 0.6 else "white")
    kind = "causal" if hp.causal else "bidirectional"
    ax.set_title(f"{hp.model}: {hp.head_name} attention ({kind}, {n} tokens)", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8, label="attention weight")
    return fig


def layer_figure(hps: list[HeadPattern]) -> Figure:
    """Every head of one layer side by side (query rows x key columns, colour 0-1, one shared scale)."""
    n_heads, n = len(hps), len(hps[0].tokens)
    cols = int(np.ceil(np.sqrt(n_heads)))
    rows = int(np.ceil(n_heads / cols))
    fig = Figure(figsize=(2.6 * cols + 1.2, 2.6 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    im = None
    for ax, hp in zip(axes.flat, hps, strict=False):
        im = ax.imshow(hp.pattern, cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(hp.head_name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in list(axes.flat)[n_heads:]:
        ax.set_axis_off()
    kind = "causal" if hps[0].causal else "bidirectional"
    fig.suptitle(f"{hps[0].model}: layer {hps[0].layer}, every head ({kind}, {n} tokens; rows: queries, "
                 "columns: keys)", fontsize=10)
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight")
    return fig


# ------------------------------------------------------------------------------ html

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
"""


_HTML = _HTML.replace("__COLOUR__", VIRIDIS_JS)  # the shared colour scale, once


def pattern_html(hp: HeadPattern) -> str:
    """A self-contained HTML page: hover a cell for query token, key token and weight."""
    title = f"{hp.model}: {hp.head_name} attention"
    data = {"model": hp.model, "layer": hp.layer, "head": hp.head, "tokens": hp.tokens,
            "token_ids": hp.token_ids, "pattern": np.round(hp.pattern.astype(float), 6).tolist()}
    # "<" escaped so no token can close the <script> element early.
    blob = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
    return _fill(title, hp.text, blob)


def layer_html(hps: list[HeadPattern]) -> str:
    """Every head of one layer in one self-contained page: hover (or click) a head's name to show
    its pattern, hover a cell for query token, key token and weight."""
    first = hps[0]
    title = f"{first.model}: layer {first.layer}, every head"
    data = {"model": first.model, "layer": first.layer, "heads": [hp.head_name for hp in hps],
            "tokens": first.tokens, "token_ids": first.token_ids,
            "patterns": [np.round(hp.pattern.astype(float), 6).tolist() for hp in hps]}
    blob = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
    return _fill(title, first.text, blob)


def _fill(title: str, text: str, blob: str) -> str:
    """The page with its placeholders filled in one pass (a text holding a placeholder stays text)."""
    values = {"__GENERATOR__": HTML_GENERATOR, "__TITLE__": html.escape(title), "__TEXT__": html.escape(text),
              "__DATA__": blob}
    return re.sub("__(?:GENERATOR|TITLE|TEXT|DATA)__", lambda m: values[m.group()], _HTML)


def write_views(hp: HeadPattern | list[HeadPattern], out: str | Path, html_view: bool = False,
                dpi: int = 130) -> list[Path]:
    """Write the figure to ``out`` (.png, .svg or .pdf) and, with ``html_view``, ``out`` as .html.
    ``hp``: one head, or every head of a layer (:func:`layer_patterns`).

    An existing file is replaced only if headscope wrote it (:mod:`headscope.outputs`)."""
    out = check_figure_path(out)
    page = out.with_suffix(".html")
    check_replaceable([out] + ([page] if html_view else []))
    one = isinstance(hp, HeadPattern)
    paths = [save_figure(pattern_figure(hp) if one else layer_figure(hp), out, dpi)]
    if html_view:
        text = pattern_html(hp) if one else layer_html(hp)
        paths.append(write_atomic(page, lambda tmp: tmp.write_text(text, encoding="utf-8")))
    return paths


def show_head(model, head: str, text: str = DEFAULT_TEXT, out: str | Path | None = None, html_view: bool = False,
              device: str = "auto", dtype: str | None = None, progress=None) -> list[Path]:
    """``headscope show``: draw head ``head`` (``"L.H"``) of ``model`` on ``text``; return the paths written.

    Every mistake that needs no model (the head's form, ``out``'s suffix, an empty text, a file in
    the way, default path included) is refused before the model loads; the head's range is
    checked once it has.
    """
    from headscope.loading import load_model

    layer, h = parse_head(head)
    name = model if isinstance(model, str) else getattr(model, "name", "model")
    target = check_figure_path(out if out is not None else default_out_path(name, layer, h))
    if html_view:
        check_replaceable([target.with_suffix(".html")])
    if not text.strip():
        raise HeadscopeError(f"{setting('text')} is empty; give a sentence, e.g. 'The river bank flooded'.")
    m = load_model(model, device=device, dtype=dtype, progress=progress)
    layer, h = parse_head(head, m.n_layers, m.n_heads)
    return write_views(head_pattern(m, text, layer, h), target, html_view=html_view)


def show_layer(model, layer: int, text: str = DEFAULT_TEXT, out: str | Path | None = None,
               html_view: bool = False, device: str = "auto", dtype: str | None = None, progress=None) -> list[Path]:
    """``headscope show --layer L``: every head of layer ``layer`` in one figure (and one page with
    ``html_view``); return the paths written. Checks that need no model come first."""
    from headscope.loading import load_model

    if layer < 0:
        raise HeadscopeError(f"Layer {layer} is negative; layers are 0-based, e.g. --layer 0.")
    name = model if isinstance(model, str) else getattr(model, "name", "model")
    target = check_figure_path(out if out is not None else Path(f"{model_slug(name)}-L{layer}.png"))
    if html_view:
        check_replaceable([target.with_suffix(".html")])
    if not text.strip():
        raise HeadscopeError(f"{setting('text')} is empty; give a sentence, e.g. 'The river bank flooded'.")
    m = load_model(model, device=device, dtype=dtype, progress=progress)
    return write_views(layer_patterns(m, text, check_layer(layer, m.n_layers)), target, html_view=html_view)


def check_figure_path(out: str | Path) -> Path:
    """Refuse an output path that is a directory, has a suffix we cannot write, or is a file
    headscope did not write."""
    out = Path(out)
    if out.suffix.lower() not in FIGURE_SUFFIXES:
        raise HeadscopeError(f"{setting('out')} '{out}' must end in {', '.join(FIGURE_SUFFIXES)}; "
                             f"e.g. {out.with_suffix('.png')}.")
    if out.is_dir():
        raise HeadscopeError(f"{setting('out')} '{out}' is a directory; give a file name such as {out / 'head.png'}.")
    check_replaceable([out])
    return out
