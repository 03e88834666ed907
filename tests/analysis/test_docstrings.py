"""The worked examples in the analysis modules' docstrings are tests too."""

import doctest
import importlib

import pytest

MODULES = ["headscope.analysis.copying", "headscope.analysis.induction", "headscope.analysis.profiles",
           "headscope.analysis.sinks"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
