"""The page of a discovery run (``report.html``), from its files alone: what was run, the baseline,
the faithfulness curve with CPR and CMD against random circuits, the chosen circuit, the top edges
by each score beside their exact effect, how the scores agree, the top nodes, whole queries and
keys by attribution and AtP* beside their exact effect."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from headscope.report.html import (
    _ci,
    _e,
    _kv,
    _num,
    _table,
    figure_uri,
    page,
    recorded,
    source_pairs,
)

TOP = 20

READ = {
    "noising": "a score is the change in the metric when the edge's writer comes from the corrupt "
    "prompt in the clean run (exact), or its first-order estimate (EAP, EAP-IG)",
    "denoising": "a score is the change in the metric when the edge's writer comes from the clean "
    "prompt in the corrupt run (exact), or its first-order estimate (EAP, EAP-IG)",
}


def _settings(meta: dict) -> list[tuple[str, str]]:
    st = meta.get("settings", {})
    pairs = [
        ("model", str(meta.get("model", "?"))),
        ("task", f"{meta.get('task', '?')} ({meta.get('n_pairs', '?')} pairs)"),
        ("metric", str(meta.get("metric", "?"))),
        (
            "graph",
            f"{meta.get('n_edges', '?')} edges (positions pooled; keys and values per KV head)",
        ),
        ("direction", str(st.get("direction", "?"))),
        ("circuits run with", f"every edge outside them from: {st.get('ablation', '?')}"),
    ]
    pairs += source_pairs(meta.get("source", {}) or {})
    return pairs + recorded(meta, ("device", "dtype", "seed", "bootstrap"))


def _edges(edges: pd.DataFrame, by: str) -> str:
    cols = [c for c in ("eap", "eap_ig", "exact") if c in edges.columns]
    top = edges.reindex(edges[by].abs().sort_values(ascending=False).index).head(TOP)
    header = ["edge"]
    for c in cols:
        header += [c.replace("_", "-"), "95% CI"]
    rows = []
    for _, r in top.iterrows():
        cells = [f"<td>{_e(r['edge'])}</td>"]
        for c in cols:
            cells += [_num(r[c]), _ci(r[f"{c}_low"], r[f"{c}_high"])]
        rows.append(cells)
    return _table(header, rows)


def _agreement(agree: pd.DataFrame | None) -> str:
    if agree is None or not len(agree):
        return '<p class="muted">No edge was patched exactly.</p>'
    extra = "n_disagree" in agree.columns
    rows = []
    for _, r in agree.iterrows():
        cells = [
            f"<td>{_e(r['a'])} vs {_e(r['b'])}</td>",
            _num(r["n"], 0),
            _num(r["rho"]),
            _ci(r["rho_low"], r["rho_high"]),
            f"<td>{int(r['overlap'])} of {int(r['k'])}</td>",
            _num(r["overlap_chance"], 2),
        ]
        if extra:
            ok = r["n_disagree"] == r["n_disagree"]
            cells += [
                _num(r["n_disagree"], 0) if ok else "<td></td>",
                _num(r["saturated_disagree"], 2) if ok else "<td></td>",
                _num(r["saturated_agree"], 2) if ok else "<td></td>",
            ]
        rows.append(cells)
    header = ["scores", "edges", "Spearman rho", "95% CI", "top-k overlap", "chance"]
    if extra:
        header += ["off by > 50%", "saturated: of those", "saturated: of the rest"]
    return _table(header, rows)


def discover_page_html(run_dir: Path, figures: bool = True) -> str:
    from headscope.report.discover_figures import circuit_figure, curve_figure

    run_dir = Path(run_dir)
    meta = json.loads((run_dir / "metadata.json").read_text())
    edges = pd.read_csv(run_dir / "edges.csv")
    curve = pd.read_csv(run_dir / "curve.csv")
    circuit = json.loads((run_dir / "circuit.json").read_text())
    baseline = pd.read_csv(run_dir / "baseline.csv")
    agree_path = run_dir / "agreement.csv"
    agree = pd.read_csv(agree_path) if agree_path.is_file() else None
    nodes = pd.read_csv(run_dir / "nodes.csv")
    title = f"headscope discover: {meta.get('model', '?')} on {meta.get('task', '?')}"
    by = str(meta.get("ranked_by", "eap")).replace("-", "_")
    direction = meta.get("settings", {}).get("direction", "noising")
    body = [f"<h1>{_e(title)}</h1>", _kv(_settings(meta)), "<h2>Baseline</h2>"]
    body.append(
        _table(
            ["prompt", "mean", "95% CI", "share correct"],
            [
                [
                    f"<td>{_e(r['prompt'])}</td>",
                    _num(r["mean"]),
                    _ci(r["ci_low"], r["ci_high"]),
                    _num(r["share_correct"], 2),
                ]
                for _, r in baseline.iterrows()
            ],
        )  # fmt: skip
    )
    cpr, cmd = meta.get("cpr") or [float("nan")] * 3, meta.get("cmd") or [float("nan")] * 3
    rc, rm = meta.get("random_cpr") or [], meta.get("random_cmd") or []
    body.append("<h2>Faithfulness</h2>")
    body.append(
        '<p class="muted">f(C) = (m(C) - m(empty)) / (m(full) - m(empty)), the metric averaged '
        "over pairs; the circuits are the top edges by |"
        + _e(by.replace("_", "-"))
        + "| at each size. CPR: the area under f over the share of edges kept; CMD: the area "
        "between f and 1 (both trapezoids from the empty circuit). Random orders of the edges, "
        "each a curve of nested circuits like the ranking's, are what the ranking must beat.</p>"
    )
    held = meta.get("curve_on") == "held-out pairs"
    body.append(
        f"<p>Measured on {meta.get('curve_pairs', meta.get('n_pairs', '?'))} "
        + ("held-out pairs, none of those that ranked the edges (held_out.jsonl).</p>" if held
           else "pairs, the same that ranked the edges: an in-sample curve (--held-out N measures"
           " it on other pairs).</p>")
    )  # fmt: skip
    rows = [
        ["<td>CPR</td>", _num(cpr[0]), _ci(cpr[1], cpr[2]),
         _num(sum(rc) / len(rc) if rc else None), _num(meta.get("cpr_rank_p"))],
        ["<td>CMD</td>", _num(cmd[0]), _ci(cmd[1], cmd[2]),
         _num(sum(rm) / len(rm) if rm else None), _num(meta.get("cmd_rank_p"))],
    ]  # fmt: skip
    body.append(
        _table(
            ["area", "ranking", "95% CI", f"random orders' mean ({len(rc)})", "p (as good)"], rows
        )
    )
    if figures:
        body.append(f'<img alt="faithfulness curve" src="{figure_uri(curve_figure(curve, meta))}">')
    body.append("<h2>The circuit</h2>")
    body.append(
        f"<p>{circuit['n_edges']} of {circuit['of_edges']} edges (the top "
        f"{100 * circuit['share']:.3g}% by |{_e(circuit['ranked_by'])}|): f = "
        f"{circuit['faithfulness']:.3f}. Its edges are in circuit.json.</p>"
    )
    if figures:
        body.append(f'<img alt="circuit" src="{figure_uri(circuit_figure(circuit, meta))}">')
    body.append(f'<h2>Top edges</h2><p class="muted">{_e(READ.get(direction, ""))}.</p>')
    body.append(_edges(edges, by))
    if edges["exact"].notna().any():
        body.append("<h3>By exact effect</h3>")
        body.append(_edges(edges[edges["exact"].notna()], "exact"))
    body.append("<h2>Do the scores agree?</h2>")
    body.append(
        '<p class="muted">Over the edges patched exactly (the top ones by each score). An '
        "estimate is off when it misses the exact effect by more than half of it; a head at an "
        "edge's end saturates when more than half its queries put over 0.9 of their attention on "
        "one key (where a first-order estimate through the softmax can fail).</p>"
    )
    body.append(_agreement(agree))
    body.append("<h2>Top nodes</h2>")
    body.append("<p class=\"muted\">A writer's node score is the sum of its edges' scores.</p>")
    top = nodes.reindex(nodes[by].abs().sort_values(ascending=False).index).head(TOP)
    extra = [c for c in ("induction", "previous_token", "duplicate_token", "copying") if c in top]
    body.append(
        _table(
            ["node", by.replace("_", "-"), "95% CI", *extra],
            [
                [f"<td>{_e(r['node'])}</td>", _num(r[by]), _ci(r[f"{by}_low"], r[f"{by}_high"])]
                + [_num(r[c]) for c in extra]
                for _, r in top.iterrows()
            ],
        )
    )
    at_path = run_dir / "edges_at.csv"
    if at_path.is_file():
        at = pd.read_csv(at_path)
        body.append("<h2>Edges at named positions</h2>")
        body.append(
            '<p class="muted">A reader at the position reading its writer\'s output there; '
            "the top 10 per position by the ranking score were patched exactly.</p>"
        )
        for pos, rows in at.groupby("position", sort=False):
            body.append(f"<h3>{_e(str(pos))}</h3>")
            body.append(_edges(rows, by))
    readers_path = run_dir / "readers.csv"
    if readers_path.is_file():
        body += _readers(pd.read_csv(readers_path))
    return page(title, body)


def _readers(readers: pd.DataFrame) -> list[str]:
    qk = readers[readers["kind"].isin(["q", "k"])]
    if not len(qk) or qk["atp_qk"].isna().all():
        return []
    top = qk.reindex(qk["atp_qk"].abs().sort_values(ascending=False).index).head(TOP)
    cols = ["atp", "atp_qk", "exact"]
    rows = [
        [f"<td>{_e(r['reader'])}</td>", _num(r.get("saturation"), 2)]
        + [x for c in cols for x in (_num(r[c]), _ci(r[f"{c}_low"], r[f"{c}_high"]))]
        for _, r in top.iterrows()
    ]
    header = ["reader", "saturation"]
    header += [x for c in ("attribution", "AtP* (QK fix)", "exact") for x in (c, "95% CI")]
    return [
        "<h2>Whole queries and keys</h2>",
        "<p class=\"muted\">Each head's whole query (a KV head's whole key) patched from the "
        "other prompt, that is every edge into the reader cut: attribution's first-order "
        "estimate, AtP*'s (Kramár et al. 2024: the layer's softmax recomputed exactly, the rest "
        "first order), and the exact effect for the top ones by AtP*. Saturation: the share of "
        "the head's queries with over 0.9 of their attention on one key.</p>",
        _table(header, rows),
    ]
