"""The circuit diagram (figure and SVG) and the agreement panels, on synthetic circuit tables whose
qualifying edges are counted by hand (tests/report/circuit_tables.py)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.patches import FancyArrowPatch

from headscope.files import png_is_ours
from headscope.report.circuit_figures import (
    KIND_DASH,
    MAX_WIDTH,
    NEGATIVE,
    POSITIVE,
    agreement_figure,
    circuit_diagram,
    circuit_edges,
    save_circuit_figures,
    svg_diagram,
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


def _svg_edges(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return list(root.iter(f"{SVG}path"))


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
    svg = svg_diagram(classes, path, T.N_LAYERS, threshold)
    assert len(_svg_edges(svg)) == n
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


def test_svg_one_path_per_edge_with_tooltips(tables):
    classes, path = tables
    svg = svg_diagram(classes, path, T.N_LAYERS, model="tiny-gpt2")
    root = ET.fromstring(svg)
    assert "<script" not in svg and "http://" not in svg.replace("http://www.w3.org/2000/svg", "")
    edges = _svg_edges(svg)
    assert len(edges) == 7 and all("edge" in e.get("class") for e in edges)
    assert {(e.get("data-source"), e.get("data-target")) for e in edges} == EXPECTED
    by = {(e.get("data-source"), e.get("data-target")): e for e in edges}
    for s, r, kind, effect, _ in T.EDGES:
        e = by[s, _target(r)]
        assert e.get("stroke") == (POSITIVE if effect > 0 else NEGATIVE)
        assert float(e.get("stroke-width")) == pytest.approx(
            MAX_WIDTH * abs(effect) / 0.62, abs=0.01
        )
        assert (e.get("stroke-dasharray") or "") == KIND_DASH[kind]
        tip = e.find(f"{SVG}title").text
        lo, hi = effect - 0.03, effect + 0.04
        assert f"effect {effect:.3f} [{lo:.3f}, {hi:.3f}]" in tip and r in tip
    circles = [c for c in root.iter(f"{SVG}circle") if c.get("class") == "node"]
    assert {c.get("data-head") for c in circles} == CLASSED
    nm = next(c for c in circles if c.get("data-head") == "L3H0").find(f"{SVG}title").text
    assert "name_mover" in nm and "rule: direct_effect >= 0.1" in nm and "copying = 0.800" in nm
    assert "induction = " not in nm  # NaN evidence is left out
    legend = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "legend")
    texts = " ".join(t.text or "" for t in legend.iter(f"{SVG}text"))
    for word in ("name mover", "previous token", "effect > 0", "effect < 0", "into the key"):
        assert word in texts


def test_svg_escapes_hostile_names(tables):
    classes, path = tables
    path = path.assign(task="<script>alert('x')</script> & co")
    classes = classes.copy()
    classes.loc[classes["head_name"] == "L3H0", "rule"] = 'a < b & "c"'
    svg = svg_diagram(classes, path, T.N_LAYERS, model="m<1>")
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
    root = ET.fromstring(svg_diagram(none, path, T.N_LAYERS))
    assert list(root.iter(f"{SVG}path")) == []
    assert [c for c in root.iter(f"{SVG}circle") if c.get("class") == "node"] == []


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
    assert "z = 2" in [t.get_text() for t in ax.get_legend().get_texts()]
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
