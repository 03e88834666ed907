"""The worked examples in the analysis modules' docstrings are tests too: every module, found, not listed."""

import doctest
import importlib
import pkgutil

import pytest

import headscope.analysis

MODULES = sorted(m.name for m in pkgutil.iter_modules(headscope.analysis.__path__, "headscope.analysis."))


def test_every_analysis_module_is_found():
    assert {"headscope.analysis.attention_math", "headscope.analysis.cost", "headscope.analysis.model_checks",
            "headscope.analysis.score_scale", "headscope.analysis.induction"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0, f"{name}: {result}"
