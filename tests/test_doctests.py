"""The worked examples in public docstrings are tests too."""

import doctest
import importlib

import pytest

MODULES = [
    "headscope.errors", "headscope.sources", "headscope.probes", "headscope.scoring",
    "headscope.metrics.previous_token", "headscope.metrics.next_token", "headscope.metrics.sink",
    "headscope.metrics.separator", "headscope.metrics.punctuation", "headscope.metrics.entropy",
    "headscope.metrics.induction", "headscope.metrics.duplicate_token",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
