"""The package's layers (headscope/__init__.py's docstring): each module imports only from layers
above it, counting imports inside functions, so no module imports one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

import headscope

ROOT = Path(headscope.__file__).parent
LAYERS = [  # top to bottom, as the package docstring draws them
    ["errors"],
    ["result", "outputs", "timing", "uncertainty", "support"],
    ["sources", "attention", "metrics", "probes"],
    ["models", "kernels", "corpus"],
    ["engines", "long_probes", "loading"],
    ["extract"],
    ["effects", "examples", "scale"],
    ["circuits"],
    ["catalog"],
    ["config"],
    ["report", "plots", "kvplan"],
    ["html_report"],
    ["rundir"],
    ["runner", "compare", "views", "scoring"],
    ["analysis", "scale.sweep"],
    ["cli_views", "cli_long", "cli_scale"],
    ["cli"],
    ["__main__"],
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}


#: scale/ is two layers: sharding (below the runner, which uses it) and sweeps (above it, using it).
SWEEP = ("sweep", "sweep_plots")


def unit(dotted: str) -> str:
    """The layer unit of ``headscope.<dotted>``: its top-level module, or ``scale.sweep``."""
    parts = dotted.split(".")
    if parts[0] == "scale" and len(parts) > 1 and parts[1] in SWEEP:
        return "scale.sweep"
    return parts[0]


def top_of(path: Path) -> str:
    return unit(".".join(path.relative_to(ROOT).with_suffix("").parts))


def imports(path: Path) -> set[str]:
    """Layer units of headscope imported anywhere in ``path`` (function bodies included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("headscope."):
            found.add(unit(node.module.split(".", 1)[1]))
        elif isinstance(node, ast.Import):
            found |= {unit(a.name.split(".", 1)[1]) for a in node.names if a.name.startswith("headscope.")}
    return found


def test_every_module_has_a_layer():
    tops = {top_of(p) for p in ROOT.rglob("*.py")} - {"__init__"}
    assert tops == set(LEVEL), f"add {sorted(tops - set(LEVEL))} to LAYERS and to the package docstring"


def test_imports_only_go_up():
    wrong = []
    for path in ROOT.rglob("*.py"):
        top = top_of(path)
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
