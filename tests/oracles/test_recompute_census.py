"""The census recomputation shares no code with the census, and agrees with a real run (MiniLM).
(On a tiny model's run: tests/apps/test_census.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tests.oracles.recompute_census as rc

CENSUS_CODE = (
    "headscope.apps",
    "headscope.metrics",
    "headscope.effects",
    "headscope.circuits",
    "headscope.engines",
    "headscope.models",
    "headscope.scanner",
)


def test_it_imports_no_census_code():
    tree = ast.parse(Path(rc.__file__).read_text())
    names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    ours = [n for n in names if n.startswith(("headscope", "tests"))]
    assert not [n for n in ours if n.startswith(CENSUS_CODE)], ours
    assert set(ours) <= {
        "tests.oracles.recompute",
        "headscope.probes.corpus",
    }  # weights folder; the prose


@pytest.mark.real
def test_a_minilm_census_recomputes_from_its_files(minilm, tmp_path):
    """Every part on all-minilm-l6-v2 (a small census: 60 sentences, 3 sequences), each row
    recomputed."""
    import pandas as pd

    from headscope.apps.census import census
    from headscope.apps.settings import CensusSettings

    if __import__("importlib").util.find_spec("spacy") is None:
        pytest.skip(
            "spaCy is not installed: pip install 'headscope[syntax]' (it is part of the dev extra)"
        )
    st = CensusSettings(
        n_sentences=60,
        min_count=20,
        noop_sequences=3,
        repeat_len=8,
        repeat_sequences=2,
        n_prompts=6,
        bootstrap=50,
        n_null=20,
        readout="embeddings",
    )
    out = census(minilm, tmp_path / "run", st, figures=False)
    theirs = pd.read_csv(out / "scores.csv")
    n, problems = rc.compare(rc.recompute(out), theirs)
    assert problems == [] and n == len(theirs)
