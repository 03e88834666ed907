"""report.html of a circuit run: drawn from the run directory's files alone, self-contained and
offline, every classed head with its evidence and rule, the diagram as inline SVG, text escaped."""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET

import pytest

from headscope.files import HTML_GENERATOR, is_ours
from headscope.report.circuit_figures import save_circuit_figures
from headscope.report.circuit_page import read_circuit, write_circuit_page
from tests.report import circuit_tables as T

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = "<script>alert('ioi')</script>"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = T.write_run(tmp_path_factory.mktemp("circuit"), task=HOSTILE)
    return d, write_circuit_page(d).read_text(encoding="utf-8")


def _section(page: str, anchor: str) -> str:
    start = page.index(f'id="{anchor}"')
    end = page.find("<h2", start)
    return page[start : end if end > 0 else len(page)]


def _rows(section: str) -> list[str]:
    body = section.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return re.findall(r"<tr>(.*?)</tr>", body)


def test_written_beside_the_tables_and_ours(run):
    d, page = run
    assert (d / "report.html").is_file() and is_ours(d / "report.html")
    assert page.startswith("<!DOCTYPE html>") and HTML_GENERATOR in page
    assert not list(d.glob(".report*"))  # no temporary left behind


def test_offline_and_escaped(run):
    _, page = run
    assert "<script" not in page  # the hostile task name is text, and the page has no script
    assert html_escaped(HOSTILE) in page
    for url in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert url.startswith(("data:image/png;base64,", "#", "url(#")), url
    namespaces = (
        'xmlns="http://www.w3.org/2000/svg"',
        'xmlns:xlink="http://www.w3.org/1999/xlink"',
    )
    assert "http" not in page.replace(namespaces[0], "").replace(namespaces[1], "")
    assert "<link" not in page and "@import" not in page


def html_escaped(text: str) -> str:
    import html

    return html.escape(text)


def test_header_has_model_task_pairs_and_baseline(run):
    _, page = run
    head = page.split("<nav>", 1)[0]
    assert "tiny-gpt2" in head and f"{html_escaped(HOSTILE)}, 16 pairs" in head
    assert "clean_logit_diff: 3.25" in head and "gap: 3.75" in head
    assert "edge_threshold: 0.05" in head


def test_the_svg_diagram_parses_and_has_the_edges(run):
    _, page = run
    svg = re.search(r"<svg .*?</svg>", page, re.S).group(0)
    ids = [g.get("id") or "" for g in ET.fromstring(svg).iter(f"{SVG}g")]
    assert len([i for i in ids if i.startswith("edge:")]) == len(T.EDGES)
    nodes = {i.removeprefix("node:") for i in ids if i.startswith("node:")}
    assert nodes == {"L3H0", "L3H1", "L2H0", "L2H2", "L1H1", "L0H2"}


def test_every_class_row_with_evidence_and_rule(run):
    _, page = run
    rows = _rows(_section(page, "classes"))
    classed = {(la, h): c for (la, h), (c, _) in T.CLASSES.items() if c}
    assert len(rows) == len(classed) == 6
    for (layer, head), cls in classed.items():
        row = next(r for r in rows if f"<td>L{layer}H{head}</td>" in r)
        assert f"<td>{cls}</td>" in row
        rule = html_escaped(T.CLASSES[layer, head][1])
        assert f"<code>{rule}</code>" in row
    nm = next(r for r in rows if "<td>L3H0</td>" in r)
    assert "0.600" in nm and "[0.500, 0.700]" in nm and "0.450" in nm and "0.800" in nm
    assert "[0.410, 0.490]" in nm  # END -> IO's interval beside it
    # a column without an interval (this table's path_to_* columns) gets no interval cell
    header = _section(page, "classes").split("<thead>", 1)[1].split("</thead>", 1)[0]
    assert header.count("interval") == 2
    assert "6 other heads passed no rule" in _section(page, "classes")


def test_agreement_path_and_composition_tables(run):
    _, page = run
    agree = _rows(_section(page, "agreement"))
    assert len(agree) == 2 and "L1H1.k@S2" in agree[0] and "[-0.50, 1.00]" in agree[0]
    assert "<img" in _section(page, "agreement")  # drawn from the tables (no agreement.png)
    paths = _rows(_section(page, "paths"))
    exact = [r for r in T.ROWS if r[3] == r[3]]
    assert len(paths) == min(15, len(exact) + 4)  # exact noising rows + 4 denoising rows
    assert "<td>L3H0</td><td>logits</td><td>logits</td><td>noising</td>" in page
    first_noising = next(r for r in paths if "noising</td>" in r and "denoising" not in r)
    assert "0.620" in first_noising and "0.900" in first_noising  # the attribution beside
    comp = _rows(_section(page, "composition"))
    assert len(comp) == 15
    assert comp[0].startswith("<td>L0H2</td><td>L1H1</td><td>k</td>") and "4.50" in comp[0]


def test_a_saved_agreement_png_is_embedded_not_redrawn(tmp_path):
    d = T.write_run(tmp_path / "run")
    save_circuit_figures(
        T.classes_table(),
        T.path_table(),
        T.composition_table(),
        T.agreement_table(),
        d,
        T.N_LAYERS,
    )
    page = write_circuit_page(d).read_text()
    saved = base64.b64encode((d / "agreement.png").read_bytes()).decode("ascii")
    section = _section(page, "agreement")
    assert saved in section and section.count("<img") == 1


def test_threshold_from_metadata_and_figures_off(tmp_path):
    d = T.write_run(tmp_path / "run")
    meta = json.loads((d / "metadata.json").read_text())
    meta["settings"]["edge_threshold"] = 0.1
    (d / "metadata.json").write_text(json.dumps(meta))
    page = write_circuit_page(d, figures=False, out=tmp_path / "page.html").read_text()
    svg = re.search(r"<svg .*?</svg>", page, re.S).group(0)
    ids = [g.get("id") or "" for g in ET.fromstring(svg).iter(f"{SVG}g")]
    assert len([i for i in ids if i.startswith("edge:")]) == 3  # 0.62, -0.21, 0.18
    assert "<img" not in page and "without figures" in page
    assert not (d / "report.html").exists()


def test_a_missing_table_is_said_not_invented(tmp_path):
    d = T.write_run(tmp_path / "run")
    (d / "composition.csv").unlink()
    (d / "agreement.csv").unlink()
    page = write_circuit_page(d).read_text()
    assert "This run has no <code>composition.csv</code>" in page
    assert "This run has no <code>agreement.csv</code>" in page
    assert read_circuit(d)["composition"] is None
    with pytest.raises(FileNotFoundError, match="no metadata.json"):
        read_circuit(tmp_path)


def test_without_classes_the_diagram_is_drawn_from_path_csv_alone(tmp_path):
    """Named receivers write no classes.csv: every head at an end of an exact edge above the
    threshold is a node, and every such edge is drawn (none is dropped for lack of a class)."""
    d = T.write_run(tmp_path / "run")
    (d / "classes.csv").unlink()
    page = write_circuit_page(d, figures=False, out=tmp_path / "page.html").read_text()
    diagram = _section(page, "diagram")
    assert "no classes.csv, so no head has a class" in diagram
    svg = re.search(r"<svg .*?</svg>", diagram, re.S).group(0)
    ids = [g.get("id") or "" for g in ET.fromstring(svg).iter(f"{SVG}g")]
    edges = [r for r in T.ROWS if r[3] == r[3] and abs(r[3]) >= 0.05]  # NaN and below left out
    assert len([i for i in ids if i.startswith("edge:")]) == len(edges) == 12
    want = {r[0] for r in edges} | {r[1].split(".")[0] for r in edges if r[1] != "logits"}
    assert {i.removeprefix("node:") for i in ids if i.startswith("node:")} == want
    assert "This run has no <code>classes.csv</code>" in _section(page, "classes")


def test_without_classes_or_an_edge_above_the_threshold_nothing_is_drawn(tmp_path):
    d = T.write_run(tmp_path / "run")
    (d / "classes.csv").unlink()
    meta = json.loads((d / "metadata.json").read_text())
    meta["settings"]["edge_threshold"] = 5.0
    (d / "metadata.json").write_text(json.dumps(meta))
    page = write_circuit_page(d, figures=False, out=tmp_path / "page.html").read_text()
    assert "no circuit to draw" in _section(page, "diagram") and "<svg" not in page
