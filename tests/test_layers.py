"""The package's layers (headscope/__init__.py's docstring): each module imports only from layers
above it, counting imports inside functions, so no module imports one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

import headscope

ROOT = Path(headscope.__file__).parent
LAYERS = [  # top to bottom, as the package docstring draws them
    ["errors"],
    ["result", "outputs", "timing", "uncertainty"],
    ["sources", "attention", "metrics", "probes"],
    ["models", "kernels"],
    ["engines"],
    ["extract"],
    ["effects", "examples"],
    ["circuits"],
    ["catalog"],
    ["config"],
    ["report", "plots"],
    ["html_report"],
    ["rundir"],
    ["runner", "compare", "views", "scoring"],
    ["analysis"],
    ["cli_views"],
    ["cli"],
    ["__main__"],
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}


def imports(path: Path) -> set[str]:
    """Top-level headscope modules imported anywhere in ``path`` (function bodies included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("headscope."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("headscope.")}
    return found


def test_every_module_has_a_layer():
    tops = {p.relative_to(ROOT).parts[0].removesuffix(".py") for p in ROOT.rglob("*.py")} - {"__init__"}
    assert tops == set(LEVEL), f"add {sorted(tops - set(LEVEL))} to LAYERS and to the package docstring"


def test_imports_only_go_up():
    wrong = []
    for path in ROOT.rglob("*.py"):
        top = path.relative_to(ROOT).parts[0].removesuffix(".py")
        if top == "__init__":
            continue  # the lazy facade re-exports everything
        if top in {"analysis"}:  # helpers must name the module they need, not go through the facade
            assert "    import headscope\n" not in path.read_text(), f"{path.relative_to(ROOT)} imports the facade"
        for target in imports(path) - {top}:
            if LEVEL[target] >= LEVEL[top]:
                wrong.append(f"{path.relative_to(ROOT)} imports headscope.{target}")
    assert wrong == []


def test_the_docstring_draws_these_layers():
    """Each layer is one line of the docstring's drawing, in this order."""
    drawing = headscope.__doc__.split("How the package is layered")[1]
    lines = [line[4:].split("  ")[0] for line in drawing.splitlines() if line.startswith("    ") and line[4] != " "]
    lines = [[n.strip().rstrip("/") for n in line.split(",")] for line in lines]
    assert lines == LAYERS[:-1]
