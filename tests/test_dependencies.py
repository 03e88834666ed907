"""The dependencies that decide results are pinned to what was tested, and the pins agree.

* pyproject.toml gives each of them a range with an upper bound; transformers' range holds the
  version the support table was made with, and the installed transformers lies inside it;
* scripts/constraints.txt (what ./scripts/bootstrap.sh, and so CI, installs) pins each inside its
  range, transformers at the table's version;
* ``headscope models --support``'s version line says which version made the table, and one line
  more when another is installed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from headscope.engines import support

REPO = Path(__file__).resolve().parents[1]
DECIDING = ("torch", "transformers", "transformer-lens", "gguf", "safetensors", "pandas", "numpy")


def _pyproject_requirements() -> dict[str, SpecifierSet]:
    """The ``dependencies = [...]`` of pyproject.toml, read as text (no tomllib on Python 3.10)."""
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    reqs = [Requirement(s) for s in re.findall(r'^\s*"([^"]+)"', block, re.M)]
    return {r.name.lower(): r.specifier for r in reqs}


def _constraints() -> dict[str, str]:
    lines = (REPO / "scripts" / "constraints.txt").read_text().splitlines()
    pins = [ln.split("==") for ln in lines if ln.strip() and not ln.startswith("#")]
    return {name.strip().lower(): v.strip() for name, v in pins}


def test_every_deciding_dependency_has_an_upper_bound():
    reqs = _pyproject_requirements()
    for name in DECIDING:
        assert any(s.operator in ("<", "<=", "==", "~=") for s in reqs[name]), (
            f"pyproject.toml: {name} {reqs[name]} has no upper bound"
        )


def test_installed_transformers_and_the_tables_version_are_inside_the_pinned_range():
    pinned = _pyproject_requirements()["transformers"]
    made = support.support_meta()["transformers"]
    installed = support.installed_version("transformers")
    assert Version(made) in pinned, (
        f"support.json was made with transformers {made}, outside pyproject's {pinned}: "
        "python -m scripts.conformance --write"
    )
    assert Version(installed) in pinned, (
        f"transformers {installed} is installed, outside pyproject's {pinned}: "
        "./scripts/bootstrap.sh installs the pinned one"
    )
    # the installed package's metadata says the same as pyproject.toml (an editable install that
    # predates a pin change would not)
    assert SpecifierSet(support.pinned_range("transformers")) == pinned


def test_constraints_pin_each_inside_its_range_and_transformers_at_the_tables_version():
    reqs, pins = _pyproject_requirements(), _constraints()
    assert {"transformers", "tokenizers", "transformer-lens", "spacy"} <= set(pins)
    for name, v in pins.items():
        if name in reqs:
            assert Version(v) in reqs[name], f"constraints.txt {name}=={v} outside {reqs[name]}"
    assert pins["transformers"] == support.support_meta()["transformers"]
    # spaCy: the range the pinned parser asks for (the syntax extra and the parser's own check)
    from headscope.probes.parser import SPACY_BELOW, SPACY_MIN

    assert Version(SPACY_MIN) <= Version(pins["spacy"]) < Version(SPACY_BELOW)


def test_version_note_says_so_in_one_line_when_the_installed_version_differs():
    meta = {"transformers": "5.25.0"}
    assert support.version_note(meta, installed="5.25.0") is None
    note = support.version_note(meta, installed="5.26.1")
    assert "\n" not in note and "5.26.1" in note and "5.25.0" in note
    assert "python -m scripts.conformance" in note


@pytest.mark.parametrize("installed", [None, "9.9.9"])
def test_models_support_names_the_tables_version(monkeypatch, installed):
    from click.testing import CliRunner

    from headscope.cli.main import main

    made = support.support_meta()["transformers"]
    if installed:
        monkeypatch.setattr(support, "installed_version", lambda package="transformers": installed)
    res = CliRunner().invoke(main, ["models", "--support"])
    assert res.exit_code == 0, res.output
    assert f"with transformers {made}" in res.output
    drift = [ln for ln in res.output.splitlines() if "is installed, but this table" in ln]
    assert len(drift) == (1 if installed else 0), res.output


def test_support_changes_sorts_improvements_from_regressions():
    ok, no = {"status": "exact", "detail": ""}, {"status": "refused", "detail": "why"}
    bad = {"status": "wrong", "detail": "sink differs by 0.1"}
    old = {"A": {"engines": {"fused": no, "hooks": ok}}, "B": {"engines": {"fused": ok}}}
    new = {"A": {"engines": {"fused": ok, "hooks": no}}, "C": {"engines": {"fused": bad}}}
    ch = support.support_changes(old, new)
    assert ch["improved"] == ["A / fused: refused -> exact"]
    assert ch["regressed"] == ["A / hooks: exact -> refused (why)"]
    assert sorted(ch["families"]) == ["B: no longer in the conformance run",
                                      "C: new in the conformance run"]  # fmt: skip
    # a wrong score is a regression even where the old table had none for the family
    new["B"] = {"engines": {"fused": bad}}
    regressed = support.support_changes(old, new)["regressed"]
    assert regressed[-1].startswith("B / fused: exact -> wrong")
    reworded = support.support_changes(
        {"A": {"engines": {"fused": no}}},
        {"A": {"engines": {"fused": {"status": "refused", "detail": "other"}}}},
    )
    assert reworded["reworded"] and not reworded["regressed"] and not reworded["improved"]


# ------------------------------------------------------------------------------ the two scripts


def test_conformance_script_reports_changes_against_the_shipped_table(tmp_path, capsys):
    import json

    from scripts import conformance

    out = tmp_path / "found.json"
    assert conformance.main(["--family", "Llama", "--family", "Falcon", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"shipped table was made with {support.support_meta()['transformers']}" in printed
    assert "changes against the shipped table: 0 improved, 0 regressed" in printed
    found = json.loads(out.read_text())
    assert set(found["table"]) == {"Falcon", "Llama"}
    assert found["changes"] == {"improved": [], "regressed": [], "reworded": [], "families": []}
    # --write needs every family: a partial run never replaces the table
    before = support.SUPPORT_JSON.read_text()
    assert conformance.main(["--family", "Llama", "--write"]) == 2
    assert support.SUPPORT_JSON.read_text() == before


def test_adopt_runs_the_conformance_script_under_the_release_without_touching_the_venv(
    tmp_path, monkeypatch
):
    import subprocess

    from scripts import adopt_transformers

    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path))
    calls = []

    def fake_run(cmd, **kw):
        calls.append((cmd, kw))
        if "--target" in cmd:  # the install: what pip would leave there
            target = Path(cmd[cmd.index("--target") + 1])
            (target / "transformers").mkdir(parents=True)
            (target / "transformers" / "__init__.py").write_text("")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(adopt_transformers.subprocess, "run", fake_run)
    assert adopt_transformers.main(["9.1.0", "--write"]) == 0
    (install, _), (conf, kw) = calls
    target = tmp_path / "transformers" / "9.1.0"
    assert install[-1] == "transformers==9.1.0" and str(target) in install
    assert conf[-2:] == ["scripts.conformance", "--write"]
    # the release comes first on the path
    assert kw["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(target)
    # a second run reuses the installed release
    calls.clear()
    assert adopt_transformers.main(["9.1.0"]) == 0
    assert len(calls) == 1 and "--target" not in calls[0][0]
