"""The worked examples in the notebook helpers' docstrings run, as ``tests/test_doctests.py`` runs
the package's (the helpers left the package for ``analyses/lib/``, so that test no longer finds
them)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import lib

MODULES = ["lib"] + sorted(m.name for m in pkgutil.walk_packages(lib.__path__, "lib."))


def test_every_helper_module_is_found():
    assert {"lib.controls", "lib.timing", "lib.phase_change", "lib.attention_math"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(
        importlib.import_module(name), optionflags=doctest.ELLIPSIS, report=True
    )
    assert result.failed == 0, (
        f"{result.failed} of {result.attempted} examples in {name} failed (see the output)"
    )
