"""``report.html`` of a circuit run (``headscope circuit``): one self-contained page (styles inline,
the diagram as inline SVG, figures as ``data:`` PNGs, no script, nothing fetched), drawn from the
run directory's files alone, never the model, like :mod:`headscope.report.patch_page`.

Top to bottom: the model, the task and its pairs, the baseline and the settings (``metadata.json``);
the circuit diagram (:func:`headscope.report.circuit_figures.diagram_svg`: hover an edge for its
effect and interval, a node for its class, rule and evidence); the head classes with every classed
head's evidence and the rule it passed (``classes.csv``); the agreement of composition and path
patching per receiver (``agreement.csv``, with the per-receiver panels: ``agreement.png`` when the
run saved it, else drawn from the tables); the strongest path effects (``path.csv``, exact, the
attribution estimate beside); the composition pairs with the largest z (``composition.csv``); how to
read it all. A table the run lacks is said to be missing, not invented.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pandas as pd

from headscope.catalog import CIRCUIT_CLASSES as CLASSES
from headscope.catalog import CLASS_EVIDENCE as EVIDENCE
from headscope.catalog import interval_columns as interval_of
from headscope.files import write_atomic
from headscope.report.circuit_figures import (
    LOGITS,
    agreement_figure,
    classed,
    diagram_svg,
    path_nodes,
)
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

REPORT = "report.html"
TABLES = ("path.csv", "composition.csv", "agreement.csv", "classes.csv")
TOP_K = 15  # rows of the path-effect and composition tables
THRESHOLD = 0.05  # the diagram's edge threshold when metadata.json does not name one
#: The rule of each class, as the page explains it (the rule each head passed is in its row).
CLASS_WHAT = {
    "name_mover": "copies the indirect object's name to the logits (large positive direct "
    "effect, END attends to IO, positive copying)",
    "negative_name_mover": "writes against the indirect object's name (large negative direct "
    "effect, END attends to IO)",
    "s_inhibition": "steers the name movers' queries (path effect through their q)",
    "induction": "attends to the token after an earlier copy of the current one, feeding "
    "S-inhibition (path effect through its v)",
    "duplicate_token": "attends to an earlier copy of the current token, feeding S-inhibition",
    "previous_token": "attends to the previous token, feeding the induction heads' keys",
}
_EXTRA_STYLE = """
.hs-diagram { overflow-x: auto; border: 1px solid #eee; padding: 0.4em; }
.hs-diagram path.edge:hover { stroke-opacity: 1; } .hs-diagram circle.node:hover { stroke-width: 2; }
"""  # noqa: E501 (a template: its lines are the page's)


def read_circuit(run_dir: str | Path) -> dict:
    """The files the page is drawn from: ``metadata`` (a dict) and ``path``, ``composition``,
    ``agreement``, ``classes`` (DataFrames, None where the run has no such file). Class and rule
    are read as text (an empty cell: no class)."""
    run_dir = Path(run_dir)
    meta_file = run_dir / "metadata.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{run_dir} has no metadata.json: not a circuit run directory.")
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    out: dict = {"metadata": meta}
    for name in TABLES:
        file = run_dir / name
        text = {"class": str, "rule": str} if name == "classes.csv" else {}
        out[name.removesuffix(".csv")] = (
            pd.read_csv(file, dtype=text, keep_default_na=True) if file.is_file() else None
        )
    if out["classes"] is not None:
        out["classes"][["class", "rule"]] = out["classes"][["class", "rule"]].fillna("")
    return out


def _settings(meta: dict) -> list[tuple[str, str]]:
    pairs = [
        ("model", meta.get("model", "?")),
        ("shape", f"{meta.get('n_layers', '?')} layers x {meta.get('n_heads', '?')} heads"),
        ("task", f"{meta.get('task', '?')}, {meta.get('n_pairs', '?')} pairs"),
        ("baseline", _readable(meta.get("baseline") or {})),
    ]
    pairs += source_pairs(meta.get("source") or {})
    return pairs + recorded(meta, ("settings", "seed", "device", "dtype", "files"))


def _missing(name: str) -> str:
    return f'<p class="muted">This run has no <code>{_e(name)}</code>.</p>'


def _classes(classes: pd.DataFrame) -> str:
    nodes = classed(classes)
    if nodes.empty:
        return "<p>No head passed a class rule.</p>"
    bounds = {b for c in EVIDENCE for b in interval_of(c)}
    evidence = [c for c in EVIDENCE if c in nodes and c not in bounds]
    extra = [
        c
        for c in nodes.columns
        if c not in (*EVIDENCE, "head_name", "layer", "head", "class", "rule", "_rank")
        and pd.api.types.is_numeric_dtype(nodes[c])
    ]
    header = ["head", "class"]
    with_ci = {c for c in evidence if interval_of(c)[0] in nodes}  # older runs: direct only
    for c in evidence + extra:
        header += [c, "interval"] if c in with_ci else [c]
    header.append("rule passed")
    rows = []
    for r in nodes.to_dict("records"):
        cells = [f"<td>{_e(r['head_name'])}</td>", f"<td>{_e(r['class'])}</td>"]
        for c in evidence + extra:
            cells.append(_num(r[c]))
            if c in with_ci:
                low, high = interval_of(c)
                cells.append(_ci(r.get(low), r.get(high)))
        cells.append(f"<td><code>{_e(r['rule'])}</code></td>")
        rows.append(cells)
    counts = nodes["class"].value_counts()
    what = "".join(
        f"<li><b>{_e(c)}</b> ({int(counts[c])}): {_e(CLASS_WHAT.get(c, 'a class of this run'))}"
        "</li>"
        for c in dict.fromkeys(nodes["class"])
    )
    n_none = len(classes) - len(nodes)
    return (
        f"<ul>{what}</ul>"
        + _table(header, rows)
        + f'<p class="muted">{n_none} other heads passed no rule (NaN: not measured for that '
        "head); every head's evidence is in <code>classes.csv</code>.</p>"
    )


def _agreement(got: dict, figures: bool, pngs: dict[str, str]) -> str:
    agreement, composition, path = got["agreement"], got["composition"], got["path"]
    if agreement is None:
        return _missing("agreement.csv")
    rows = [
        [
            f"<td>{_e(r.receiver)}</td>",
            f"<td>{_e(r.kind)}</td>",
            f'<td class="num">{int(r.n_senders)}</td>',
            _num(r.spearman, 2),
            _ci(r.spearman_ci_low, r.spearman_ci_high, 2),
            f'<td class="num">{int(r.top_k)}</td>',
            _num(r.overlap, 0),
            _num(r.overlap_chance, 2),
            _num(r.p_overlap, 3),
        ]
        for r in agreement.itertuples()
    ]
    parts = [
        '<p class="muted">For each receiver, its senders ranked by composition z (the weights) '
        "and by exact path patching (the task): the Spearman rank correlation with its bootstrap "
        "interval, and how many of the top k senders the two rankings share against the number "
        "two random rankings share by chance (p: the chance of at least that overlap).</p>",
        _table(
            [
                "receiver",
                "kind",
                "senders",
                "Spearman rho",
                "interval",
                "top k",
                "overlap",
                "chance",
                "p",
            ],
            rows,
        ),
    ]
    for name, uri in pngs.items():
        if name.startswith("agreement"):
            parts.append(f'<img alt="{_e(name)}" src="{uri}">')
    heads = [r for r in dict.fromkeys(agreement["receiver"].astype(str)) if r != LOGITS]
    drawn = any(n.startswith("agreement") for n in pngs)
    if figures and not drawn and heads and composition is not None and path is not None:
        fig = agreement_figure(
            composition, path, agreement, heads, model=got["metadata"].get("model", "")
        )
        parts.append(f'<img alt="composition against path patching" src="{figure_uri(fig)}">')
    return "".join(parts)


def _paths(path: pd.DataFrame) -> str:
    exact = path[path["estimator"] == "exact"]
    top = exact.reindex(exact["effect"].abs().sort_values(ascending=False).index).head(TOP_K)
    attr = path[path["estimator"] == "attribution"]
    estimate = {
        (s, r, d): e
        for s, r, d, e in zip(
            attr["sender"], attr["receiver"], attr["direction"], attr["effect"], strict=True
        )
    }
    header = ["sender", "receiver", "input", "direction", "effect", "interval"]
    header += ["metric change", "interval", "attribution estimate", "MLPs frozen", "pairs"]
    rows = []
    for r in top.itertuples():
        est = estimate.get((r.sender, r.receiver, r.direction))
        rows.append(
            [
                f"<td>{_e(r.sender)}</td>",
                f"<td>{_e(r.receiver)}</td>",
                f"<td>{_e(r.receiver_kind)}</td>",
                f"<td>{_e(r.direction)}</td>",
                _num(r.effect),
                _ci(r.ci_low, r.ci_high),
                _num(r.delta),
                _ci(r.delta_ci_low, r.delta_ci_high),
                _num(est) if est is not None else '<td class="num muted">not run</td>',
                f"<td>{_e(r.freeze_mlps)}</td>",
                f'<td class="num">{int(r.n_pairs)}</td>',
            ]
        )
    note = (
        f'<p class="muted">The {len(top)} exact rows with the largest |effect| of {len(exact)} '
        f"(every row, and {len(path) - len(exact)} attribution estimates, in "
        "<code>path.csv</code>).</p>"
    )
    return note + _table(header, rows)


def _composition(composition: pd.DataFrame) -> str:
    top = composition.sort_values("z", ascending=False).head(TOP_K)
    rows = [
        [
            f"<td>{_e(r.sender)}</td>",
            f"<td>{_e(r.receiver)}</td>",
            f"<td>{_e(r.kind)}</td>",
            _num(r.score, 4),
            _num(r.null_mean, 4),
            _num(r.null_sd, 4),
            _num(r.z, 2),
            _num(r.percentile, 3),
            f'<td class="num">{int(r.n_null)}</td>',
        ]
        for r in top.itertuples()
    ]
    n_beyond = int((composition["z"] > 2).sum())
    return (
        f'<p class="muted">The {len(top)} sender-receiver pairs with the largest z of '
        f"{len(composition)} ({n_beyond} beyond z = 2). The score is the Frobenius norm of the "
        "composed matrix over the product of the norms (Elhage et al. 2021); the null replaces "
        "the sender's W_OV by random matrices of the same shape and norm (n null draws); z = "
        "(score - null mean) / null sd, percentile = share of null draws below the score.</p>"
        + _table(
            ["sender", "receiver", "kind", "score", "null mean", "null sd", "z", "percentile", "n"],
            rows,
        )
    )


def _pngs(run_dir: Path) -> dict[str, str]:
    """The run's saved PNGs as ``data:`` URIs, by file name."""
    return {
        p.name: "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode("ascii")
        for p in sorted(run_dir.glob("*.png"))
    }


def circuit_page_html(got: dict, figures: bool = True, pngs: dict[str, str] | None = None) -> str:
    """The whole page of a circuit run from :func:`read_circuit`'s dict (see the module
    docstring); ``pngs``: saved figures by file name (``agreement*.png`` shown in the agreement
    section); ``figures=False``: no PNG drawn (the SVG diagram stays: it is text)."""
    meta = got["metadata"]
    pngs = pngs or {}
    model, task = meta.get("model", "?"), meta.get("task", "?")
    title = f"headscope circuit: {model} on {task}"
    threshold = float((meta.get("settings") or {}).get("edge_threshold", THRESHOLD))
    path, classes = got["path"], got["classes"]
    sections = [
        ("diagram", "Circuit diagram"),
        ("classes", "Head classes"),
        ("agreement", "Composition against path patching"),
        ("paths", "Strongest path effects"),
        ("composition", "Strongest composition"),
    ]
    body = [
        f"<h1>{_e(title)}</h1>",
        _kv(_settings(meta)),
        "<nav>" + "".join(f'<a href="#{k}">{_e(v.lower())}</a>' for k, v in sections) + "</nav>",
        f'<h2 id="diagram">{sections[0][1]}</h2>',
    ]
    nodes = classes
    if path is not None and classes is None:  # named receivers: no classes, the paths still draw
        nodes = path_nodes(path, threshold)
    if path is None or nodes is None:
        body.append(_missing("path.csv" if path is None else "classes.csv"))
    elif nodes.empty:
        body.append(
            f"<p>No exact path effect reaches |effect| &gt;= {_e(f'{threshold:g}')} and this run "
            "has no <code>classes.csv</code>: no circuit to draw.</p>"
        )
    else:
        n_layers = int(meta.get("n_layers") or int(nodes["layer"].max()) + 1)
        who = (
            "the heads that passed a class rule"
            if classes is not None
            else f"every head at either end of an exact path effect of at least {threshold:g} "
            "(this run wrote no classes.csv, so no head has a class)"
        )
        body.append(
            f'<p class="muted">Nodes: {_e(who)} (x = layer). Edges: exact '
            f"path-patching effects with |effect| &gt;= {_e(f'{threshold:g}')} between two of "
            "them, into a group of heads (a dashed box: one path into all of them at once) or "
            "into the logits, width proportional to |effect|, pale where the effect's interval "
            "includes 0. Hover an edge for its effect and interval, a node for its class, rule "
            "and evidence.</p>"
        )
        svg = diagram_svg(nodes, path, n_layers, threshold, model=model, task=task)
        body.append(f'<div class="hs-diagram">{svg}</div>')
    body.append(f'<h2 id="classes">{sections[1][1]}</h2>')
    body.append(_missing("classes.csv") if classes is None else _classes(classes))
    body.append(f'<h2 id="agreement">{sections[2][1]}</h2>')
    body.append(_agreement(got, figures, pngs))
    body.append(f'<h2 id="paths">{sections[3][1]}</h2>')
    body.append(_missing("path.csv") if path is None else _paths(path))
    body.append(f'<h2 id="composition">{sections[4][1]}</h2>')
    comp = got["composition"]
    body.append(_missing("composition.csv") if comp is None else _composition(comp))
    body.append(
        '<p class="muted">Path patching (Wang et al. 2022): the sender\'s output from the other '
        "run reaches only the receiver (the logits, or one head's q, k or v input at one "
        "position), every other head frozen at its clean output; the effect is the share of the "
        "clean-corrupt gap (noising: destroyed, denoising: restored), a ratio of means over "
        "pairs with bootstrap percentile intervals over pairs. <i>attribution</i> rows are "
        "first-order estimates, never measurements; the diagram and the tables above draw only "
        "<i>exact</i> rows. Class order of the diagram: "
        + _e(", ".join(CLASSES))
        + "."
        + ("" if figures else " This page was built without figures.")
        + "</p>"
    )
    return page(title, body, _EXTRA_STYLE)


def write_circuit_page(
    run_dir: str | Path, figures: bool = True, out: str | Path | None = None
) -> Path:
    """Write the page of the circuit run in ``run_dir`` (to ``out``, default
    ``RUN_DIR/report.html``) from its files alone, atomically; return its path."""
    run_dir = Path(run_dir)
    got = read_circuit(run_dir)
    text = circuit_page_html(got, figures=figures, pngs=_pngs(run_dir) if figures else {})
    target = Path(out) if out is not None else run_dir / REPORT
    return write_atomic(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))
