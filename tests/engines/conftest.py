"""The ``cuda`` marker: tests that need a CUDA GPU run where one exists and are skipped with a reason
elsewhere (CI has none). ``pytest -m cuda tests/engines`` runs only them (benchmarks/gpu_check.sh).

``HEADSCOPE_CUDA_TESTS_DEVICE=cpu`` runs them on the CPU instead (the uncompiled path): a dry run
of the GPU check where there is no GPU. They take their device from the ``accel`` fixture.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = os.environ.get("HEADSCOPE_CUDA_TESTS_DEVICE", "cuda")


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped with a reason where there is none)")


def pytest_collection_modifyitems(config, items):
    if DEVICE != "cuda" or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"no CUDA GPU here (torch {torch.__version__}, "
                                   f"cuda {torch.version.cuda or 'not built'})")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture
def accel() -> torch.device:
    """The device the ``cuda`` tests run on (CUDA, or the CPU for a dry run)."""
    return torch.device(DEVICE)
