"""The circuit diagram (figure and SVG) and the agreement panels, on synthetic circuit tables whose
qualifying edges are counted by hand (tests/report/circuit_tables.py)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgb
from matplotlib.patches import FancyArrowPatch, Rectangle

from headscope.files import png_is_ours
from headscope.report.circuit_figures import (
    MAX_WIDTH,
    NEGATIVE,
    PALE,
    POSITIVE,
    agreement_figure,
    circuit_diagram,
    circuit_edges,
    diagram_svg,
    group_members,
    save_circuit_figures,
)
from tests.report import circuit_tables as T

SVG = "{http://www.w3.org/2000/svg}"
CLASSED = {"L3H0", "L3H1", "L2H0", "L2H2", "L1H1", "L0H2"}


def _target(receiver: str) -> str:
    return receiver.split(".")[0]


EXPECTED = {(s, _target(r)) for s, r, *_ in T.EDGES}


@pytest.fixture(scope="module")
def tables():
    return T.classes_table(), T.path_table()


def _arrows(fig) -> list[FancyArrowPatch]:
    return [p for p in fig.axes[0].patches if (p.get_gid() or "").startswith("edge:")]


def _svg_groups(svg: str, kind: str) -> dict[str, ET.Element]:
    """The page's diagram: each ``<g>`` matplotlib wrote for an artist with gid ``kind:...``."""
    root = ET.fromstring(svg)
    return {g.get("id"): g for g in root.iter(f"{SVG}g") if (g.get("id") or "").startswith(kind)}


def _tip(g: ET.Element) -> str:
    return g.find(f"{SVG}title").text


def test_the_hand_counted_edges(tables):
    classes, path = tables
    assert len(T.EDGES) == 7  # counted by hand in circuit_tables.ROWS
    edges = circuit_edges(classes, path)
    assert len(edges) == 7
    assert set(zip(edges["source"], edges["target"], strict=True)) == EXPECTED
    assert (edges["estimator"] == "exact").all() and (edges["direction"] == "noising").all()
    assert list(edges["effect"].abs()) == sorted(edges["effect"].abs(), reverse=True)


@pytest.mark.parametrize(
    "threshold, n",
    [(0.05, 7), (0.1, 3), (0.5, 1), (0.0, 9), (1.0, 0)],  # 0.0: + 0.049 and -0.02; NaN never
)
def test_threshold_in_figure_and_svg(tables, threshold, n):
    classes, path = tables
    fig = circuit_diagram(classes, path, T.N_LAYERS, threshold)
    assert len(_arrows(fig)) == n
    svg = diagram_svg(classes, path, T.N_LAYERS, threshold)  # the same figure, as the page's SVG
    assert svg.count('<g id="edge:') == n
    kept = circuit_edges(classes, path, threshold)
    assert (kept["effect"].abs() >= threshold).all()


def test_figure_arrows_are_the_edges_coloured_by_sign(tables):
    classes, path = tables
    fig = circuit_diagram(classes, path, T.N_LAYERS, model="tiny-gpt2")
    arrows = _arrows(fig)
    assert {a.get_gid() for a in arrows} == {f"edge:{s}->{t}" for s, t in EXPECTED}
    effect = {(s, _target(r)): e for s, r, _, e, _ in T.EDGES}
    for a in arrows:
        s, t = a.get_gid().removeprefix("edge:").split("->")
        want = POSITIVE if effect[s, t] > 0 else NEGATIVE
        assert np.allclose(a.get_edgecolor()[:3], to_rgb(want))
        # width proportional to |effect|: the largest (0.62) is MAX_WIDTH
        assert a.get_linewidth() == pytest.approx(MAX_WIDTH * abs(effect[s, t]) / 0.62)
    negative = [a for a in arrows if np.allclose(a.get_edgecolor()[:3], to_rgb(NEGATIVE))]
    assert len(negative) == 2  # L3H1 -> logits (-0.21), L2H0 -> L3H1 (-0.06)
    # the receiver's input as the line style: q, k, v and the logits all differ
    styles = {}
    for a in arrows:
        s, t = a.get_gid().removeprefix("edge:").split("->")
        kind = next(k for s2, r, k, *_ in T.EDGES if (s2, _target(r)) == (s, t))
        styles.setdefault(kind, set()).add(str(a.get_linestyle()))
    assert all(len(v) == 1 for v in styles.values()) and len(set().union(*styles.values())) == len(
        styles
    )


def test_figure_nodes_only_classed_heads_and_legend(tables):
    classes, path = tables
    fig = circuit_diagram(classes, path, T.N_LAYERS, model="tiny-gpt2")
    ax = fig.axes[0]
    nodes = {c.get_gid().removeprefix("node:") for c in ax.collections if c.get_gid()}
    assert nodes == CLASSED  # L0H0 (empty class), L0H1 (NaN class) and the rest: no node
    labels = {t.get_text() for t in ax.texts}
    assert CLASSED | {"logits"} <= labels and not {"L0H0", "L0H1", "L2H1"} & labels
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    for name in ("name mover", "negative name mover", "s inhibition", "induction"):
        assert name in legend
    assert any("effect > 0" in t for t in legend) and any("effect < 0" in t for t in legend)
    for kind in ("q: into the query", "k: into the key", "v: into the value"):
        assert kind in legend
    assert "duplicate token" not in legend  # no head of that class here
    title = ax.get_title()
    assert "tiny-gpt2" in title and "ioi" in title and "0.05" in title and "n = 16" in title
    assert ax.get_xlabel() and ax.get_ylabel()


def test_the_pages_svg_is_the_figure_with_tooltips(tables):
    """One renderer: the page's SVG is matplotlib's own SVG of circuit_diagram, each edge and node
    the group of its artist (by gid), with a tooltip; nothing scripted or fetched."""
    classes, path = tables
    svg = diagram_svg(classes, path, T.N_LAYERS, model="tiny-gpt2")
    assert svg.startswith("<svg") and "<script" not in svg
    assert "<image" not in svg and 'href="http' not in svg  # nothing fetched
    edges = _svg_groups(svg, "edge:")
    assert set(edges) == {f"edge:{s}->{t}" for s, t in EXPECTED}
    for s_, r, _kind, effect, _ in T.EDGES:
        lo, hi = effect - 0.03, effect + 0.04
        tip = _tip(edges[f"edge:{s_}->{_target(r)}"])
        assert f"effect {effect:.3f} [{lo:.3f}, {hi:.3f}]" in tip and r in tip
    nodes = _svg_groups(svg, "node:")
    assert set(nodes) == {f"node:{h}" for h in CLASSED}
    nm = _tip(nodes["node:L3H0"])
    assert "name_mover" in nm and "rule: direct_effect >= 0.1" in nm and "copying = 0.800" in nm
    assert "induction = " not in nm  # NaN evidence is left out
    for word in ("name mover", "previous token", "effect &gt; 0", "into the key"):
        assert word in svg  # the legend, as text


def test_svg_escapes_hostile_names(tables):
    classes, path = tables
    path = path.assign(task="<script>alert('x')</script> & co")
    classes = classes.copy()
    classes.loc[classes["head_name"] == "L3H0", "rule"] = 'a < b & "c"'
    svg = diagram_svg(classes, path, T.N_LAYERS, model="m<1>")
    ET.fromstring(svg)  # still XML
    assert "<script" not in svg and "&lt;script&gt;" in svg and "m&lt;1&gt;" in svg


def test_direction_choice(tables):
    classes, path = tables
    den = circuit_edges(classes, path, direction="denoising")
    assert len(den) == 4 and (den["effect"] == -0.8).all()
    fig = circuit_diagram(classes, path, T.N_LAYERS, direction="denoising")
    assert all(np.allclose(a.get_edgecolor()[:3], to_rgb(NEGATIVE)) for a in _arrows(fig))
    with pytest.raises(ValueError, match="no 'sideways' rows"):
        circuit_edges(classes, path, direction="sideways")


def test_no_classed_head_draws_only_the_logits(tables):
    classes, path = tables
    none = classes.assign(**{"class": ""})
    fig = circuit_diagram(none, path, T.N_LAYERS)
    assert _arrows(fig) == []
    svg = diagram_svg(none, path, T.N_LAYERS)
    assert _svg_groups(svg, "edge:") == {} and _svg_groups(svg, "node:") == {}


def test_agreement_panels(tables):
    _, path = tables
    comp, agree = T.composition_table(), T.agreement_table()
    fig = agreement_figure(comp, path, agree, ["L1H1.k@S2", "L3H0.q@END"], model="tiny-gpt2")
    axes = [a for a in fig.axes if a.get_visible()]
    assert len(axes) == 2
    ax = axes[0]
    assert "Spearman rho 0.50 [-0.50, 1.00]" in ax.get_title()
    assert "top-1 overlap 1 (chance 0.33" in ax.get_title()
    # the points: every exact noising sender into L1H1.k@S2 (L0H0, L0H1, L0H2), x = its k z
    line = ax.containers[0].lines[0]
    xs, ys = line.get_xdata(), line.get_ydata()
    got = dict(zip(np.round(ys, 6), xs, strict=True))
    assert got == {-0.3: -0.7, 0.2: 0.0, 0.05: 4.5}
    assert any(list(ln.get_xdata()) == [2.0, 2.0] for ln in ax.get_lines())
    (key,) = fig.legends  # one key below the panels
    keys = [t.get_text() for t in key.get_texts()]
    assert {"z = 2", "path effect = 0", "top 1 by composition z", "top 1 by |path effect|"} <= set(
        keys
    )
    # the top-k of each view ringed: by z L0H0 (4.5), by |path| L0H2 (-0.3)
    rings = [c for c in ax.collections if str(c.get_label()).startswith("top 1")]
    by_label = {str(c.get_label()): c.get_offsets().tolist() for c in rings}
    assert by_label["top 1 by composition z"] == [[4.5, 0.05]]
    assert by_label["top 1 by |path effect|"] == [[-0.7, -0.3]]
    # the strongest of each view named: the top by z (a weak path) as well as those by path
    names = {t.get_text() for t in ax.texts}
    assert {"L0H0", "L0H1", "L0H2"} <= names
    assert "composition z" in ax.get_xlabel() and "L1H1.k@S2" in ax.get_ylabel()
    with pytest.raises(ValueError, match="no exact rows into 'L9H9.q@END'"):
        agreement_figure(comp, path, agree, ["L9H9.q@END"])


def test_save_circuit_figures(tmp_path, tables):
    classes, path = tables
    names = save_circuit_figures(
        classes, path, T.composition_table(), T.agreement_table(), tmp_path, T.N_LAYERS
    )
    assert names == ["circuit.png", "agreement.png"]
    assert all(png_is_ours(tmp_path / n) for n in names)


def test_importing_the_circuit_report_loads_no_compute_module():
    code = (
        "import sys; import headscope.report.circuit_figures, headscope.report.circuit_page; "
        "print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    heavy = [
        m
        for m in loaded
        if m == "torch"
        or m.startswith(("torch.", "transformers"))
        or m.startswith(
            tuple(
                f"headscope.{p}"
                for p in ("engines", "effects", "models", "circuits", "scanner", "probes")
            )
        )
    ]
    assert heavy == []
    assert "headscope.report.circuit_page" in loaded


# --- the agreement panels' axes: padded so that nothing sits on the border ---------------------


def test_agreement_axes_hold_every_point_and_bar_clear_of_the_border(tables):
    """One sender's z is far larger than the rest (186.69, as Q-composition z reach in real runs):
    its point and its interval bar lie strictly inside the axes, a visible margin from the edge
    (the old limits ended 0.5 past it: 0.3% of the span, the point half-clipped)."""
    _, path = tables
    comp = T.composition_table()
    big = (comp["sender"] == "L0H2") & (comp["receiver"] == "L1H1") & (comp["kind"] == "k")
    comp.loc[big, "z"] = 186.69
    fig = agreement_figure(comp, path, T.agreement_table(), ["L1H1.k@S2"])
    ax = fig.axes[0]
    container = ax.containers[0]
    xs = container.lines[0].get_xdata()
    assert max(xs) == pytest.approx(186.69)
    ends = np.vstack([seg for bars in container.lines[2] for seg in bars.get_segments()])
    assert len(ends) == 2 * len(xs)  # a bar per point: its interval's two ends
    for lim, values in ((ax.get_xlim(), [*xs, *ends[:, 0]]), (ax.get_ylim(), ends[:, 1])):
        lo, hi = lim
        margin = 0.03 * (hi - lo)
        assert lo + margin < min(values) and max(values) < hi - margin, (lim, values)


# --- a group receiver: a box around its heads, the edge into the box ----------------------------


@pytest.fixture(scope="module")
def grouped():
    """Two name movers (L3H0 and L3H2) and the path L2H0 -> both their queries at once, as
    ``headscope circuit`` writes it (receiver ``name_mover.q@END``, receiver_layer the lowest
    member's, receiver_head -1), beside the single-head rows."""
    classes = T.classes_table()
    classes.loc[classes["head_name"] == "L3H2", ["class", "rule"]] = ["name_mover", "r"]
    path = T.path_table()
    row = path[(path["sender"] == "L2H0") & (path["receiver"] == "L3H0.q@END")].iloc[[0]]
    group = row.assign(receiver="name_mover.q@END", receiver_head=-1, effect=0.3)
    group = group.assign(ci_low=0.2, ci_high=0.4)
    return classes, pd.concat([path, group], ignore_index=True)


def test_group_members_by_label_or_joined_names(grouped):
    classes, _ = grouped
    assert group_members("name_mover.q@END", 3, classes) == ["L3H0", "L3H2"]
    assert group_members("s_inhibition.v@S2", 2, classes) == ["L2H0", "L2H2"]
    assert group_members("s_inhibition.v@S2", 3, classes) is None  # no member from layer 3 up
    assert group_members("L3H2.q@END+L3H0.q@END", 3, classes) == ["L3H0", "L3H2"]
    assert group_members("L3H0.k@S1+1+L3H2.k@S1+1", 3, classes) == ["L3H0", "L3H2"]  # + in S1+1
    assert group_members("L3H0.q@END+L2H1.q@END", 2, classes) is None  # L2H1 has no class
    edges = circuit_edges(*grouped)
    g = edges[edges["target"] == "name_mover.q@END"]
    assert len(g) == 1 and g["source"].iloc[0] == "L2H0" and g["members"].iloc[0] == "L3H0 L3H2"
    # the 7 hand-counted edges, L2H0 -> L3H2 (0.40: its receiver now has a class) and the group's
    assert len(edges) == 9


def _node_xy(ax) -> dict[str, tuple[float, float]]:
    return {
        c.get_gid().removeprefix("node:"): tuple(c.get_offsets()[0])
        for c in ax.collections
        if (c.get_gid() or "").startswith("node:")
    }


def test_figure_group_edge_ends_on_a_box_around_both_heads(grouped):
    """Not an edge into one head (the old figure dropped the row, and a reader took the single
    row L2H0 -> L3H0 for it): one arrow into a dashed box holding both name movers, with the
    query's line style, and the legend saying what the box is."""
    classes, path = grouped
    fig = circuit_diagram(classes, path, T.N_LAYERS)
    ax = fig.axes[0]
    arrow = next(a for a in _arrows(fig) if a.get_gid() == "edge:L2H0->name_mover.q@END")
    box = next(p for p in ax.patches if p.get_gid() == "group:L3H0 L3H2")
    assert isinstance(box, Rectangle)
    x0, y0 = box.get_xy()
    x1, y1 = x0 + box.get_width(), y0 + box.get_height()
    nodes = _node_xy(ax)
    for head in ("L3H0", "L3H2"):  # the box holds both heads, and no other node
        x, y = nodes[head]
        assert x0 < x < x1 and y0 < y < y1
    inside = {n for n, (x, y) in nodes.items() if x0 < x < x1 and y0 < y < y1}
    assert inside == {"L3H0", "L3H2"}
    (sx, sy), (ex, ey) = arrow._posA_posB
    assert (sx, sy) == nodes["L2H0"]
    assert ex == pytest.approx(x0) and y0 < ey < y1  # on the box's side facing the sender
    assert all(np.hypot(ex - x, ey - y) > 0.3 for x, y in nodes.values())  # not into one head
    single = next(a for a in _arrows(fig) if a.get_gid() == "edge:L2H0->L3H0")
    assert str(arrow.get_linestyle()) == str(single.get_linestyle())  # both into a query
    legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "group receiver" in legend and "one path" in legend and "whole group" in legend
    assert "name_mover.q@END" in {t.get_text() for t in ax.texts}  # the box is labelled
    # without a group: no box, no such legend entry
    plain = circuit_diagram(T.classes_table(), T.path_table(), T.N_LAYERS).axes[0]
    assert not any((p.get_gid() or "").startswith("group:") for p in plain.patches)
    assert "group receiver" not in " ".join(t.get_text() for t in plain.get_legend().get_texts())


def test_svg_group_edge_says_it_enters_the_whole_group(grouped):
    edges = _svg_groups(diagram_svg(*grouped, T.N_LAYERS), "edge:")
    assert "L3H0, L3H2 at once" in _tip(edges["edge:L2H0->name_mover.q@END"])


# --- the logits box: never on a head, whatever the last layer holds -----------------------------

#: Gemma 3 270M's IOI classes (notebook 09): 18 layers, the negative name mover L17H2 in the last
#: layer with a direct effect of -0.246, drawn on the old figure on top of the logits, in its row.
GEMMA = {
    (10, 3): ("s_inhibition", 0.004),
    (11, 2): ("name_mover", 0.177),
    (12, 1): ("name_mover", 0.293),
    (13, 3): ("negative_name_mover", -0.226),
    (17, 0): ("name_mover", 0.067),
    (17, 2): ("negative_name_mover", -0.246),
}
#: The last layer full: three heads of one class stacked in one column.
STACKED = {(1, 0): ("induction", 0.1), **{(3, h): ("name_mover", 0.2 + 0.1 * h) for h in range(3)}}


def _tables(heads: dict, n_layers: int, n_heads: int = 4):
    classes = pd.DataFrame(
        [
            {"head_name": f"L{la}H{h}", "layer": la, "head": h, "rule": ""}
            | {"class": heads.get((la, h), ("", 0))[0]}
            for la in range(n_layers)
            for h in range(n_heads)
        ]
    )
    rows = [
        {
            "task": "ioi",
            "direction": "noising",
            "sender": f"L{la}H{h}",
            "sender_layer": la,
            "sender_head": h,
            "receiver": "logits",
            "receiver_kind": "logits",
            "receiver_layer": n_layers,
            "receiver_head": -1,
            "receiver_position": "last",
            "effect": e,
            "ci_low": e - 0.04 * np.sign(e),
            "ci_high": e + 0.04 * np.sign(e),
            "delta": -2.0 * e,
            "delta_ci_low": -2.0 * e - 0.1,
            "delta_ci_high": -2.0 * e + 0.1,
            "estimator": "exact",
            "freeze_mlps": False,
            "n_pairs": 16,
        }
        for (la, h), (_, e) in heads.items()
    ]
    return classes, pd.DataFrame(rows)


def _px_boxes(fig):
    """Each marker's extent in pixels ``{name: (x0, y0, x1, y1)}`` (the logits' square under
    ``logits``), from its centre and its size (points squared) at the figure's dpi."""
    fig.draw_without_rendering()
    ax = fig.axes[0]
    out = {}
    for c in ax.collections:
        (x, y), size = ax.transData.transform(c.get_offsets()[0]), c.get_sizes()[0]
        half = np.sqrt(size) / 2 * fig.dpi / 72 + c.get_linewidths()[0] * fig.dpi / 72
        out[(c.get_gid() or "node:logits").removeprefix("node:")] = (
            x - half,
            y - half,
            x + half,
            y + half,
        )
    return out


@pytest.mark.parametrize("heads, n_layers", [(GEMMA, 18), (STACKED, 4)], ids=["gemma3", "stacked"])
def test_figure_logits_box_never_on_a_head(heads, n_layers):
    """No node's extent meets the logits box's, and no node sits in the logits' row (where the
    old figure put L17H2: its edge into the logits hidden behind the others)."""
    classes, path = _tables(heads, n_layers)
    fig = circuit_diagram(classes, path, n_layers, model="gemma3-270m")
    boxes = _px_boxes(fig)
    lx0, ly0, lx1, ly1 = boxes.pop("logits")
    assert len(boxes) == len(heads)
    for name, (x0, y0, x1, y1) in boxes.items():
        assert x1 < lx0 or x0 > lx1 or y1 < ly0 or y0 > ly1, name  # the extents do not meet
        assert y1 < ly0 or y0 > ly1, name  # and the node is not in the logits' row
    last = [n for n in boxes if n.startswith(f"L{n_layers - 1}H")]
    assert last and all(any(a.get_gid() == f"edge:{n}->logits" for a in _arrows(fig)) for n in last)


# --- an edge whose interval includes 0: pale, and said so in the legend -------------------------


@pytest.fixture(scope="module")
def unsure():
    """The hand-made tables with one edge's interval widened across 0: L2H2 -> L3H0.q (0.07,
    [-0.01, 0.11]); every other edge's interval excludes 0."""
    path = T.path_table()
    one = (path["sender"] == "L2H2") & (path["receiver"] == "L3H0.q@END")
    path.loc[one, "ci_low"] = -0.01
    return T.classes_table(), path


def test_figure_edge_whose_interval_includes_0_is_pale(tables, unsure):
    fig = circuit_diagram(*unsure, T.N_LAYERS)
    arrows = {a.get_gid(): a for a in _arrows(fig)}
    assert len(arrows) == 7  # still drawn: the threshold is on the point effect
    pale = arrows.pop("edge:L2H2->L3H0")
    assert np.allclose(pale.get_edgecolor()[:3], to_rgb(PALE[POSITIVE]))
    assert str(pale.get_linestyle()) == str(arrows["edge:L2H0->L3H0"].get_linestyle())  # still q
    effect = {f"edge:{s}->{_target(r)}": e for s, r, _, e, _ in T.EDGES}
    for gid, a in arrows.items():  # every interval excluding 0: the full colour of its sign
        assert np.allclose(a.get_edgecolor()[:3], to_rgb(POSITIVE if effect[gid] > 0 else NEGATIVE))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("interval includes 0" in t for t in legend)
    handle = next(
        h
        for h, t in zip(fig.axes[0].get_legend().legend_handles, legend, strict=True)
        if "interval includes 0" in t
    )
    assert np.allclose(to_rgb(handle.get_color()), to_rgb(PALE[POSITIVE]))
    # no such edge, no such entry
    plain = circuit_diagram(*tables, T.N_LAYERS).axes[0].get_legend().get_texts()
    assert not any("interval includes 0" in t.get_text() for t in plain)


def test_svg_edge_whose_interval_includes_0_says_so(tables, unsure):
    edges = _svg_groups(diagram_svg(*unsure, T.N_LAYERS), "edge:")
    assert "interval includes 0" in _tip(edges.pop("edge:L2H2->L3H0"))
    assert not any("interval includes 0" in _tip(g) for g in edges.values())


def test_agreement_labels_of_nearby_points_do_not_overlap(tables):
    """Two senders at the same z and nearly the same effect (as L0H2 and L9H4 into SmolLM2's
    L17H4): their names are printed beside their points without covering each other."""
    _, path = tables
    comp = T.composition_table()
    path = path.copy()
    into = (path["receiver"] == "L1H1.k@S2") & (path["direction"] == "noising")
    for sender, effect in (("L0H1", 0.2), ("L0H2", 0.2001)):
        at = into & (path["sender"] == sender)
        path.loc[at, ["effect", "ci_low", "ci_high"]] = [effect, effect - 0.05, effect + 0.05]
    pick = (
        (comp["receiver"] == "L1H1") & (comp["kind"] == "k") & comp["sender"].isin(["L0H1", "L0H2"])
    )
    comp.loc[pick, "z"] = 1.0
    fig = agreement_figure(comp, path, T.agreement_table(), ["L1H1.k@S2"])
    fig.canvas.draw()
    ax = fig.axes[0]
    texts = [t for t in ax.texts if t.get_text() in {"L0H0", "L0H1", "L0H2"}]
    assert sorted(t.get_text() for t in texts) == ["L0H0", "L0H1", "L0H2"]  # one label each
    boxes = [t.get_window_extent() for t in texts]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (texts[i].get_text(), texts[j].get_text())


def test_diagram_node_labels_sit_on_white_above_the_edges(tables):
    classes, path = tables
    fig = circuit_diagram(classes, path, n_layers=4)
    ax = fig.axes[0]
    names = [t for t in ax.texts if t.get_text() in CLASSED]
    assert {t.get_text() for t in names} == CLASSED
    edge_z = max(a.get_zorder() for a in _arrows(fig))
    for t in names:
        patch = t.get_bbox_patch()
        assert patch is not None and to_rgb(patch.get_facecolor()) == (1.0, 1.0, 1.0)
        assert t.get_zorder() > edge_z


def test_the_classes_and_their_evidence_are_one_table():
    """The class table lives in the catalog: what circuits.classes writes is what the figures and
    the page read (an earlier copy in the report had drifted: no copy_suppression)."""
    from headscope import catalog
    from headscope.circuits import classes
    from headscope.report import circuit_figures, circuit_page

    assert list(classes.EVIDENCE) == list(catalog.CLASS_EVIDENCE) == list(circuit_page.EVIDENCE)
    assert (
        circuit_figures.EVIDENCE is catalog.CLASS_EVIDENCE
        and "copy_suppression" in classes.EVIDENCE
    )
    assert classes.CLASSES == circuit_figures.CLASSES == catalog.CIRCUIT_CLASSES


def test_a_group_of_one_head_is_drawn_once():
    """A class with one head (SmolLM2's induction class, L17H4): the group receiver
    ``induction.k@S1+1`` is that head's own ``L17H4.k@S1+1``, so the same path came out as two
    parallel edges (notebook 09's review). One edge is drawn, into the head; a one-head group
    whose head has no single-head row of the same sender is still drawn (into its box)."""
    classes, path = T.classes_table(), T.path_table()
    row = path[(path["sender"] == "L0H2") & (path["receiver"] == "L1H1.k@S2")].iloc[[0]]
    twin = row.assign(receiver="induction.k@S2", receiver_head=-1)
    edges = circuit_edges(classes, pd.concat([path, twin], ignore_index=True))
    assert len(edges) == len(T.EDGES)  # the twin is gone
    assert "induction.k@S2" not in set(edges["target"])
    alone = row.assign(receiver="induction.v@S2", receiver_head=-1, receiver_kind="v")
    edges = circuit_edges(classes, pd.concat([path, alone], ignore_index=True))
    assert "induction.v@S2" in set(edges["target"])  # no single-head row of its own: kept


def test_the_title_names_what_the_diagram_leaves_out():
    classes, path = T.classes_table(), T.path_table()
    title = circuit_diagram(classes, path, T.N_LAYERS).axes[0].get_title()
    assert "among classed heads" in title
    assert (
        "not drawn: 1 head in no class with |direct effect| >= 0.05 (largest: L3H2 -0.20)" in title
    )
    small = classes.copy()
    small.loc[small["head_name"] == "L3H2", "direct_effect"] = 0.01
    title = circuit_diagram(small, path, T.N_LAYERS).axes[0].get_title()
    assert "none has |direct effect| >= the threshold" in title
    big = classes.copy()
    big.loc[big["head_name"] == "L3H2", "direct_effect"] = 0.9  # heads in no class
    big.loc[big["head_name"] == "L0H0", "direct_effect"] = -0.3
    title = circuit_diagram(big, path, T.N_LAYERS).axes[0].get_title()
    assert "not drawn: 2 heads in no class with |direct effect| >= 0.05" in title
    assert "(largest: L3H2 +0.90, L0H0 -0.30)" in title


def test_pale_edges_of_both_signs_each_have_a_key():
    classes, path = T.classes_table(), T.path_table()
    for sender, receiver in (("L2H2", "L3H0.q@END"), ("L2H0", "L3H1.q@END")):
        one = (path["sender"] == sender) & (path["receiver"] == receiver)
        path.loc[one, ["ci_low", "ci_high"]] = [-0.2, 0.2]
    legend = circuit_diagram(classes, path, T.N_LAYERS).axes[0].get_legend()
    pale = {
        t.get_text(): to_rgb(h.get_color())
        for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)
        if "interval includes 0" in t.get_text()
    }
    assert pale == {
        "pale: its interval includes 0 (effect > 0)": to_rgb(PALE[POSITIVE]),
        "pale: its interval includes 0 (effect < 0)": to_rgb(PALE[NEGATIVE]),
    }
