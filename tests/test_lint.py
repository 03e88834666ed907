"""The tree passes ``ruff check`` with the settings in pyproject.toml (E501 at 100 columns on;
the executed notebooks in analyses/ are excluded there). ruff comes with the ``dev`` extra.

``ruff format --check`` is not asserted: the Python files pass it, but ruff also formats the
Python code blocks of Markdown files, and six of those (README.md, docs/) do not.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(REPO)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, f"ruff check failed:\n{res.stdout}{res.stderr}"
