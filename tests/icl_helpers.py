"""A small in-context task and the settings that run ``headscope icl`` on a tiny model in about a
second (shared by tests/cli/test_icl.py and the one-writer test)."""

from __future__ import annotations

import json
from pathlib import Path

#: 30 opposite pairs of short words (written for the tests)
PAIRS = [
    ("hot", "cold"), ("up", "down"), ("in", "out"), ("big", "small"), ("old", "new"),
    ("yes", "no"), ("on", "off"), ("day", "night"), ("left", "right"), ("top", "bottom"),
    ("fast", "slow"), ("high", "low"), ("open", "shut"), ("wet", "dry"), ("good", "bad"),
    ("full", "empty"), ("hard", "soft"), ("early", "late"), ("first", "last"), ("rich", "poor"),
    ("near", "far"), ("light", "dark"), ("long", "short"), ("win", "lose"), ("buy", "sell"),
    ("push", "pull"), ("give", "take"), ("come", "go"), ("start", "stop"), ("true", "false"),
]  # fmt: skip


def write_task(folder: Path) -> Path:
    path = Path(folder) / "opposites.json"
    path.write_text(json.dumps([{"input": x, "output": y} for x, y in PAIRS]))
    return path


def tiny_settings(task: Path) -> dict:
    """``headscope icl`` settings small enough for a tiny model: 2 shots, a few prompts of each
    kind, every query kept (a random model answers none right), 2 random sets."""
    return {
        "tasks": (str(task),),
        "shots": 2,
        "queries": 3,
        "mean_prompts": 3,
        "prompts": 2,
        "filter": "none",
        "test_prompts": 2,
        "fractions": (0.25, 0.5),
        "random_sets": 2,
        "repeat_sequences": 2,
        "bootstrap": 20,
    }
