"""A census run on one page: ``report.html`` of ``headscope census``, self-contained like a scan's
(:mod:`headscope.report.html`: styles inline, figures as ``data:`` PNGs, nothing fetched), drawn
from the run directory's files alone, never the model.

Top to bottom: the model (source, sha256) and the parser; Clark et al.'s syntax table with the
SILVER note and the parser's published UAS/LAS beside it; the no-op test (weight, effect, the
mean ablation beside them); successor, copy-suppression and rare-word heads, each against its
chance and null; the settings, versions and timings. :func:`census_figures` draws the run's
heatmaps (labelled colour bars, :func:`headscope.report.figures.heatmap`) and the no-op scatter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from headscope.catalog import describe
from headscope.report.figures import effect_scatter, heatmap
from headscope.report.html import _e, figure_uri, page
from headscope.report.html import _table as table

#: The heatmaps a census page shows (when the run has their rows), in order.
HEATMAPS = (
    "syntax_all.d2h",
    "syntax_all.h2d",
    "noop_weight",
    "effect_noop_text_loss",
    "effect_noop_embedding",
    "effect_text_loss",
    "effect_embedding",
    "successor",
    "successor_embeddings",
    "copy_suppression",
    "copy_suppression_embeddings",
    "rare_word",
)
NOOP_EFFECTS = ("effect_noop_text_loss", "effect_noop_embedding")
TOP = 10

_SILVER = ".silver { background: #fff4d6; border: 1px solid #e0c060; padding: 0.5em 0.8em; }"


def read_census(run_dir: Path) -> dict:
    """The files a census page is drawn from: ``scores``, ``metadata``, ``syntax_table`` and
    ``noop_sequences`` (each None when the run has no such file)."""
    run_dir = Path(run_dir)
    na = {c: ["NaN", "nan", ""] for c in ("score", "chance", "null", "ci_low", "ci_high")}
    scores = pd.read_csv(
        run_dir / "scores.csv", keep_default_na=False, na_values=na, dtype={"label": str}
    )
    scores["label"] = scores["label"].fillna("")
    meta = json.loads((run_dir / "metadata.json").read_text())
    table = run_dir / "syntax_table.csv"
    sequences = run_dir / "noop_sequences.csv"
    return {
        "scores": scores,
        "metadata": meta,
        "syntax_table": pd.read_csv(table) if table.is_file() else None,
        "noop_sequences": pd.read_csv(sequences) if sequences.is_file() else None,
    }


def census_figures(scores: pd.DataFrame) -> list[tuple[str, Figure]]:
    """``(file stem, Figure)`` for every heatmap of :data:`HEATMAPS` the table has rows for, and
    the no-op scatter (each head's weight on the removed keys against the effect of removing it)."""
    have = set(scores["metric"])
    out = [(m, heatmap(scores, m)) for m in HEATMAPS if m in have]
    for effect in NOOP_EFFECTS:
        if effect in have and "noop_weight" in have:
            fig = effect_scatter(scores, "noop_weight", effect)
            fig.axes[0].set_title(
                f"{scores['model'].iloc[0]}: weight on the removed keys vs the effect of "
                "removing it",
                fontsize=10,
            )
            out.append(("noop_scatter", fig))
    return out


def _table(header: list[str], rows: list[list[str]]) -> str:
    return table(header, [[f"<td>{_e(c)}</td>" for c in r] for r in rows])


def _f(x, digits: int = 3) -> str:
    return "NaN" if x is None or x != x else f"{x:.{digits}f}"


def _ci(r) -> str:
    return f"{_f(r.score)} [{_f(r.ci_low)}, {_f(r.ci_high)}]"


def syntax_rows(table: pd.DataFrame, causal: bool) -> list[list[str]]:
    """Clark's table as page rows (encoders: best over both directions, his Table 1)."""
    sub = table if causal else table[table.direction == "either"]
    return [
        [
            r.relation,
            r.direction if causal else r.head_direction,
            str(r.count),
            r.best_head,
            f"{100 * r.accuracy:.1f} [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}]",
            f"{r.offset:+d}",
            f"{100 * r.baseline:.1f}",
            f"{100 * r.difference:+.1f} [{100 * r.difference_ci_low:+.1f}, "
            f"{100 * r.difference_ci_high:+.1f}]",
        ]
        for r in sub.itertuples()
    ]


def _top(scores: pd.DataFrame, metric: str, extra: str | None = None) -> str:
    sub = scores[scores.metric == metric].sort_values("score", ascending=False).head(TOP)
    if sub.empty or sub["score"].isna().all():
        info = describe(metric)
        reason = getattr(info, "nan_reason", "") or "no rows"
        return f"<p class='muted'>{_e(metric)}: not measured ({_e(reason)}).</p>"
    other = scores[scores.metric == extra].set_index("head_name")["score"] if extra else None
    header = ["head", f"{metric} [95% CI]", "chance", "null", "label"] + ([extra] if extra else [])
    rows = [
        [r.head_name, _ci(r), _f(r.chance, 4), _f(r.null), r.label]
        + ([_f(float(other.get(r.head_name, float("nan"))), 4)] if extra else [])
        for r in sub.itertuples()
    ]
    info = describe(metric)
    return f"<p>{_e(getattr(info, 'definition', ''))}</p>" + _table(header, rows)


def census_html(run_dir: Path, figures: bool = True) -> str:
    """The page of the census run in ``run_dir`` (see the module docstring)."""
    got = read_census(run_dir)
    scores, md, table = got["scores"], got["metadata"], got["syntax_table"]
    causal = bool(md.get("causal"))
    src = md.get("source", {}) or {}
    images = {}
    if figures:
        images = {name: figure_uri(fig) for name, fig in census_figures(scores)}

    def img(name: str) -> str:
        return f'<img alt="{_e(name)}" src="{images[name]}">' if name in images else ""

    parts = [
        f"<h1>Head census: {_e(md.get('model'))}</h1>",
        _table(
            ["model", "source", "weights sha256", "layers x heads"],
            [
                [
                    str(md.get("model")),
                    str(src.get("source", "")),
                    str(src.get("weights_sha256", "")),
                    f"{md.get('n_layers')} x {md.get('n_heads')}",
                ]
            ],
        ),
    ]
    if table is not None:
        p = md.get("parser", {})
        sent = md.get("sentences", {})
        parts += [
            "<h2>Syntax heads (Clark et al. 2019)</h2>",
            f"<p class='silver'><b>SILVER labels</b>: parses by {_e(p.get('name'))} "
            f"({_e(p.get('requirement'))}, sha256 {_e(p.get('wheel_sha256'))}, "
            f"{_e(p.get('licence'))}), not gold annotations. The parser's published attachment "
            f"scores: <b>UAS {_e(p.get('uas'))} / LAS {_e(p.get('las'))}</b> "
            f"({_e(p.get('trained_on'))}).</p>",
            f"<p>{_e(sent.get('kept'))} held-out sentences, {_e(sent.get('tokenize'))} "
            f"tokenization; left out: {_e(sent.get('left_out') or 'none')}"
            + (
                f"; {_e(sent['differ_from_natural'])} differ from the natural tokenization"
                if "differ_from_natural" in sent
                else ""
            )
            + "."
            + (
                " A decoder sees only earlier words: a pair counts only when its target is "
                "visible, for the "
                "head and for the offset baseline; each direction's count is the pairs it keeps."
                if causal
                else " Best head over both directions (dep->head, head->dep) against the best "
                "fixed offset."
            )
            + "</p>",
            _table(
                [
                    "relation",
                    "direction",
                    "count",
                    "best head",
                    "accuracy % [95% CI]",
                    "best offset",
                    "its accuracy %",
                    "difference [95% CI]",
                ],
                syntax_rows(table, causal),
            ),
            img("syntax_all.d2h"),
            img("syntax_all.h2d"),
        ]
    effect = next((m for m in NOOP_EFFECTS if m in set(scores.metric)), None)
    if effect is not None:
        ablate = next(
            (m for m in ("effect_text_loss", "effect_embedding") if m in set(scores.metric)), None
        )
        parts += [
            "<h2>The [SEP] / BOS no-op test</h2>",
            _top(scores, "noop_weight", effect),
            _top(scores, effect, ablate),
            img("noop_weight"),
            img(effect),
            img("noop_scatter"),
        ]
        if ablate:
            parts += [img(ablate)]
    for metric in (
        "successor",
        "successor_embeddings",
        "copy_suppression",
        "copy_suppression_embeddings",
        "rare_word",
    ):
        if metric in set(scores.metric):
            extra = (
                "effect_text_loss"
                if metric.startswith("copy") and "effect_text_loss" in set(scores.metric)
                else None
            )
            parts += [f"<h2>{_e(metric)}</h2>", _top(scores, metric, extra), img(metric)]
    settings = md.get("settings", {})
    parts += [
        "<h2>Settings, versions, timings</h2>",
        _table(["setting", "value"], [[k, str(v)] for k, v in settings.items()]),
        _table(
            ["package", "version"], [[k, str(v)] for k, v in (md.get("versions") or {}).items()]
        ),
        _table(["phase", "seconds"], [[k, str(v)] for k, v in (md.get("timings") or {}).items()]),
    ]
    return page(f"headscope census: {md.get('model')}", parts, _SILVER)
