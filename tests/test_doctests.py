"""The worked examples in docstrings are tests too: every module of the package, found by walking
it.

``headscope.__main__`` is left out: importing it runs the CLI (``main()`` then ``sys.exit``).
``headscope.cli.main`` only builds its click group on import, so it is included. Examples that need
a model are marked ``# doctest: +SKIP`` in their module and are parsed but not run.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import headscope

NOT_IMPORTED = {"headscope.__main__"}  # importing it runs the CLI
MODULES = ["headscope"] + sorted(
    m.name
    for m in pkgutil.walk_packages(headscope.__path__, "headscope.")
    if m.name not in NOT_IMPORTED
)


def run_doctests(name: str) -> doctest.TestResults:
    return doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, report=True)


def test_every_module_is_found():
    """walk_packages sees every .py file of the package (a typo'd __init__ would hide a
    subpackage)."""
    root = Path(headscope.__file__).parent
    on_disk = {
        ".".join(("headscope", *p.relative_to(root).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        for p in root.rglob("*.py")
    }
    assert on_disk == set(MODULES) | NOT_IMPORTED
    assert {
        "headscope.apps.show",
        "headscope.apps.compare",
        "headscope.metrics.sink",
        "headscope.cli.main",
    } <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = run_doctests(name)
    assert result.failed == 0, (
        f"{result.failed} of {result.attempted} examples in {name} failed (see the output)"
    )


@pytest.mark.parametrize(
    "name, at_least",
    [
        ("headscope.apps.show", 2),
        ("headscope.apps.compare", 2),
        ("headscope.result", 6),
        ("headscope.probes.pairs", 1),
    ],
)
def test_modules_with_examples_run_them(name, at_least):
    """views.py and compare.py mark their model-loading examples +SKIP; the others still run."""
    assert run_doctests(name).attempted >= at_least


def test_skipped_examples_are_still_parsed():
    finder = doctest.DocTestFinder()
    for name in ("headscope.apps.show", "headscope.apps.compare"):
        module = importlib.import_module(name)
        examples = [ex for t in finder.find(module) for ex in t.examples]
        skipped = [ex for ex in examples if ex.options.get(doctest.SKIP)]
        assert skipped and len(skipped) < len(examples), name
