"""``headscope show``: one head's attention pattern on one text (or every head of a layer): run the
model once, keep the pattern, and write its figure (:mod:`headscope.report.figures`) and page
(:mod:`headscope.report.pattern_page`).

    >>> model = headscope.load_model("smollm2-135m")                   # doctest: +SKIP
    >>> hp = head_pattern(model, "The river bank flooded", 3, 2)       # doctest: +SKIP
    >>> hp.pattern.shape                                               # doctest: +SKIP
    (6, 6)
    >>> pattern_figure(hp).savefig("smollm2-135m-L3H2.png")            # doctest: +SKIP

The pattern is post-softmax, rows = queries, columns = keys, over ``model.wrap(model.encode(text))``
(BOS + tokens for decoders, [CLS] + tokens + [SEP] for encoders), one sequence, no padding.

"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from headscope.errors import HeadscopeError, setting
from headscope.files import check_replaceable, figure_files, save_figure, write_atomic
from headscope.files import figure_formats as figure_formats_of
from headscope.models.sources import model_shape
from headscope.result import HeadPattern, display_token, model_slug

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
DEFAULT_TEXT = "The river bank flooded after the storm, and the path was closed."


# ------------------------------------------------------------------------------ names


def default_out_path(model_name: str, layer: int, head: int) -> Path:
    """``./{model-slug}-L{layer}H{head}.png``."""
    return Path(f"{model_slug(model_name)}-L{layer}H{head}.png")


_HEAD_RE = re.compile(r"^\s*(?:L\s*)?(\d+)\s*(?:\.|H)\s*(\d+)\s*$", re.IGNORECASE)


def parse_head(
    spec: str, n_layers: int | None = None, n_heads: int | None = None
) -> tuple[int, int]:
    """``"3.2"`` (or ``"L3H2"``) -> ``(3, 2)``, 0-based; checked against the model's shape when
    given.

    Without ``n_layers``/``n_heads`` only the form is checked (the CLI does that before it spends
    seconds loading the model, then checks the range).

    >>> parse_head("3.2", 30, 9), parse_head("L3H2")
    ((3, 2), (3, 2))
    >>> parse_head("3-2", 30, 9)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    headscope.errors.HeadscopeError: Head '3-2' is not LAYER.HEAD; write it like 3.2 (layers 0..29,
    heads 0..8).
    """
    sized = n_layers is not None and n_heads is not None
    valid = (
        f"layers 0..{n_layers - 1}, heads 0..{n_heads - 1}" if sized else "0-based layer, then head"
    )
    m = _HEAD_RE.match(spec)
    if m is None:
        nums = [int(x) for x in re.findall(r"\d+", spec)]
        if len(nums) != 2:
            nums = [0, 0]
        if sized:
            nums = [min(nums[0], n_layers - 1), min(nums[1], n_heads - 1)]
        raise HeadscopeError(
            f"Head '{spec}' is not LAYER.HEAD; write it like {nums[0]}.{nums[1]} ({valid})."
        )
    layer, head = int(m.group(1)), int(m.group(2))
    if sized and (layer >= n_layers or head >= n_heads):
        nearest = f"{min(layer, n_layers - 1)}.{min(head, n_heads - 1)}"
        raise HeadscopeError(
            f"Head '{spec}' is out of range: the model has {valid}; nearest valid: {nearest}."
        )
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
        raise HeadscopeError(
            "The text has no tokens; give a non-empty --text, e.g. 'The river bank flooded'."
        )
    ids = model.wrap(body)
    if len(ids) > model.n_ctx:
        raise HeadscopeError(
            f"The text is {len(ids)} tokens with special tokens, longer than the model's context "
            f"({model.n_ctx}); shorten it to at most {model.n_ctx - (len(ids) - len(body))} tokens."
        )
    tokens = torch.tensor([ids], dtype=torch.long)  # [1, pos]
    mask = torch.ones_like(tokens, dtype=torch.bool)  # [1, pos]
    kept: dict = {}  # "p": numpy [head, query, key]

    def on_pattern(_layer: int, pattern) -> None:  # pattern: [batch=1, head, query, key]
        kept["p"] = pattern[0, heads].float().cpu().numpy().copy()  # [head, query, key]

    model.run_patterns(tokens, mask, on_pattern, layers=[layer])
    labels = [display_token(s) for s in model.str_tokens(ids)]
    return [
        HeadPattern(
            model=model.name,
            layer=layer,
            head=h,
            text=text,
            token_ids=list(ids),
            tokens=labels,
            pattern=kept["p"][i],
            causal=model.causal,
        )
        for i, h in enumerate(heads)
    ]


def check_layer(layer: int, n_layers: int) -> int:
    """A 0-based layer index, or one line naming the valid range and the nearest layer."""
    if not 0 <= layer < n_layers:
        nearest = min(max(layer, 0), n_layers - 1)
        raise HeadscopeError(
            f"Layer {layer} is out of range: the model has layers 0..{n_layers - 1}; "
            f"nearest valid: {nearest}."
        )
    return layer


def write_views(
    hp: HeadPattern | list[HeadPattern],
    out: str | Path,
    html_view: bool = False,
    dpi: int = 130,
    figure_formats: Sequence[str] | None = None,
) -> list[Path]:
    """Write the figure to ``out`` (.png, .svg or .pdf; with ``figure_formats``, ``out``'s name in
    each of them) and, with ``html_view``, ``out`` as .html.
    ``hp``: one head, or every head of a layer (:func:`layer_patterns`).

    An existing file is replaced only if headscope wrote it (:mod:`headscope.files`)."""
    from headscope.report.figures import (  # matplotlib: only when drawing
        layer_figure,
        pattern_figure,
    )
    from headscope.report.pattern_page import layer_html, pattern_html

    out = check_figure_path(out, figure_formats)
    page = out.with_suffix(".html")
    figures = figure_files(out, figure_formats)
    check_replaceable(figures + ([page] if html_view else []))
    one = isinstance(hp, HeadPattern)
    save_figure(pattern_figure(hp) if one else layer_figure(hp), out, dpi, figure_formats)
    paths = list(figures)
    if html_view:
        text = pattern_html(hp) if one else layer_html(hp)
        paths.append(write_atomic(page, lambda tmp: tmp.write_text(text, encoding="utf-8")))
    return paths


def show_head(
    model,
    head: str,
    text: str = DEFAULT_TEXT,
    out: str | Path | None = None,
    html_view: bool = False,
    device: str = "auto",
    dtype: str | None = None,
    progress=None,
    figure_formats: Sequence[str] | None = None,
) -> list[Path]:
    """``headscope show``: draw head ``head`` (``"L.H"``) of ``model`` on ``text``; return the paths
    written.

    Every mistake that needs no model (the head's form, ``out``'s suffix, an empty text, a file in
    the way, default path included) is refused before the model loads; the head's range is
    checked once it has.
    """
    layer, h = parse_head(head)
    name = model if isinstance(model, str) else getattr(model, "name", "model")
    shape = model_shape(model) if isinstance(model, str) else None
    if shape is not None:  # the range too, from the config on disk: before seconds of loading
        layer, h = parse_head(head, *shape)
    default = _in_format(default_out_path(name, layer, h), figure_formats)
    target = check_figure_path(out if out is not None else default, figure_formats)
    _check_text_and_page(text, target, html_view)
    from headscope.models.loading import (
        load_model,  # torch and transformers: only once every check passed
    )

    m = load_model(model, device=device, dtype=dtype, progress=progress)
    layer, h = parse_head(head, m.n_layers, m.n_heads)
    return write_views(
        head_pattern(m, text, layer, h), target, html_view=html_view, figure_formats=figure_formats
    )


def show_layer(model, layer: int, text: str = DEFAULT_TEXT, out=None, **options) -> list[Path]:
    """``headscope show --layer L``: every head of layer ``layer`` in one figure (and one page with
    ``html_view``); return the paths written. ``options``: :func:`show_head`'s (``html_view``,
    ``device``, ``dtype``, ``progress``, ``figure_formats``). Checks that need no model come
    first."""
    html_view, figure_formats = options.get("html_view", False), options.get("figure_formats")
    if layer < 0:
        raise HeadscopeError(f"Layer {layer} is negative; layers are 0-based, e.g. --layer 0.")
    name = model if isinstance(model, str) else getattr(model, "name", "model")
    shape = model_shape(model) if isinstance(model, str) else None
    if shape is not None:  # checked from the config on disk, before seconds of loading
        check_layer(layer, shape[0])
    default = _in_format(Path(f"{model_slug(name)}-L{layer}.png"), figure_formats)
    target = check_figure_path(out if out is not None else default, figure_formats)
    _check_text_and_page(text, target, html_view)
    from headscope.models.loading import load_model

    placed = {k: options[k] for k in ("device", "dtype", "progress") if k in options}
    m = load_model(model, **placed)
    patterns = layer_patterns(m, text, check_layer(layer, m.n_layers))
    return write_views(patterns, target, html_view=html_view, figure_formats=figure_formats)


def _check_text_and_page(text: str, target: Path, html_view: bool) -> None:
    """A text to draw on, and (with ``html_view``) room for the page beside the figure."""
    if html_view:
        check_replaceable([target.with_suffix(".html")])
    if not text.strip():
        raise HeadscopeError(
            f"{setting('text')} is empty; give a sentence, e.g. 'The river bank flooded'."
        )


def _in_format(path: Path, figure_formats: Sequence[str] | None) -> Path:
    """A default figure path in the first of ``figure_formats`` (png without them)."""
    return path.with_suffix("." + figure_formats_of(figure_formats)[0]) if figure_formats else path


def check_figure_path(out: str | Path, figure_formats: Sequence[str] | None = None) -> Path:
    """Refuse an output path that is a directory, has a suffix we cannot write, names a format
    that ``figure_formats`` (when given) leaves out, or is a file headscope did not write."""
    out = Path(out)
    if out.suffix.lower() not in FIGURE_SUFFIXES:
        raise HeadscopeError(
            f"{setting('out')} '{out}' must end in {', '.join(FIGURE_SUFFIXES)}; "
            f"e.g. {out.with_suffix('.png')}."
        )
    if out.is_dir():
        raise HeadscopeError(
            f"{setting('out')} '{out}' is a directory; give a file name such as {out / 'head.png'}."
        )
    if figure_formats:
        formats = figure_formats_of(figure_formats)
        if out.suffix.lower().lstrip(".") not in formats:
            kind = out.suffix.lstrip(".").lower()
            nearest = out.with_suffix("." + formats[0])
            raise HeadscopeError(
                f"{setting('out')} '{out}' is a {kind} file but --figure-format is "
                f"{','.join(formats)}; give --out {nearest} or add {kind} to --figure-format."
            )
    check_replaceable(figure_files(out, figure_formats or None))
    return out
