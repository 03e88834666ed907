"""The public surface (headscope/__init__.py): every exported name is its module's object, loaded
lazily."""

import importlib
import subprocess
import sys
from importlib.metadata import version

import pytest

import headscope


def test_every_export_is_the_object_of_its_module():
    for name, module in headscope._EXPORTS.items():
        assert getattr(headscope, name) is getattr(importlib.import_module(module), name), name
    assert sorted(headscope.__all__) == sorted([*headscope._EXPORTS, "__version__"])


def test_submodules_never_shadow_an_export():
    """Importing every submodule (which sets package attributes) must leave the API names alone."""
    import pkgutil

    for mod in pkgutil.walk_packages(headscope.__path__, "headscope."):
        if mod.name != "headscope.__main__":  # importing it runs the CLI
            importlib.import_module(mod.name)
    for name, module in headscope._EXPORTS.items():
        assert getattr(headscope, name) is getattr(importlib.import_module(module), name), name


def test_version_is_the_installed_distribution():
    assert headscope.__version__ == version("headscope")


def test_unknown_attribute():
    with pytest.raises(AttributeError, match=r"^module 'headscope' has no attribute 'scna'$"):
        headscope.scna  # noqa: B018


def test_import_is_light():
    """Heavy imports happen on first use, not on ``import headscope``."""
    code = (
        "import sys, headscope; heavy = ['torch', 'transformers', 'pandas', 'matplotlib']; "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
