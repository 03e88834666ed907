"""Every score of a real `headscope scan` agrees with an independent recomputation.

``scripts/recompute_scores.py`` recomputes score, chance and n of every (metric, layer, head) from
``tokens.jsonl`` alone, with plain Hugging Face eager attention, one sequence at a time, from the
definitions in headscope/catalog.py (it imports nothing from headscope's metrics/extract/scoring).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from headscope.cli.main import main
from tests.oracles.recompute import compare, recompute

TOL = 1e-3


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread for scan and recompute: on a shared 2-core machine, two OpenMP threads ran
    the same SmolLM2 forward 5-8x slower than one. Restored afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _scan(model: str, out, *extra: str) -> None:
    args = [
        "scan",
        model,
        "--out",
        str(out),
        "--n-prompts",
        "6",
        "--repeat-len",
        "20",
        "--batch-size",
        "4",
        "--quiet",
        "--no-figures",
        *extra,
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output + repr(result.exception)


def _assert_agrees(run_dir) -> pd.DataFrame:
    theirs = pd.read_csv(run_dir / "scores.csv")
    ours = recompute(run_dir)
    merged = theirs.merge(
        ours,
        on=["metric", "layer", "head"],
        suffixes=("_run", "_re"),
        how="outer",
        validate="one_to_one",
        indicator=True,
    )
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"]
    for col in ("score", "chance"):
        a, b = merged[f"{col}_run"].to_numpy(float), merged[f"{col}_re"].to_numpy(float)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=f"NaN pattern of {col}")
        ok = np.isnan(a) | (np.abs(a - b) <= TOL)
        assert ok.all(), merged.loc[~ok, ["metric", "layer", "head", f"{col}_run", f"{col}_re"]]
    assert (merged["n_run"] == merged["n_re"]).all()
    assert not compare(ours, theirs, TOL)[1]
    return merged


@pytest.mark.real
@pytest.mark.parametrize("model", ["smollm2-135m", "all-minilm-l6-v2", "gemma3-270m"])
def test_real_scan_matches_independent_recompute(model, tmp_path):
    out = tmp_path / "run"
    _scan(model, out)
    merged = _assert_agrees(out)
    assert set(merged.metric) == {
        "previous_token",
        "next_token",
        "sink",
        "separator",
        "punctuation",
        "entropy",
        "induction",
        "duplicate_token",
    }
    next_scores = merged.loc[merged.metric == "next_token", "score_run"]
    assert next_scores.isna().all() == (model != "all-minilm-l6-v2")  # NaN exactly on causal models
    assert (merged.n_run > 0).all()


@pytest.mark.real
@pytest.mark.parametrize(
    ("model", "option"),
    [("smollm2-135m", ("--text-join", "chat")), ("all-minilm-l6-v2", ("--token-types",))],
)
def test_inputs_as_in_training_match_independent_recompute(model, option, tmp_path):
    """The chat template's turns and BERT segment ids: saved with the run, recomputable from it."""
    out = tmp_path / "run"
    _scan(model, out, *option)
    _assert_agrees(out)
    meta = json.loads((out / "metadata.json").read_text())
    records = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    if option[0] == "--text-join":
        assert meta["settings"]["text_join"] == "chat" and meta["probes"]["text"]["join"] == "chat"
        # <|im_end|> after each of three turns
        assert all(r["token_ids"].count(2) == 3 for r in records if r["probe"] == "text")
    else:
        assert (
            meta["settings"]["token_types"] is True
            and meta["probes"]["text"]["token_types"] is True
        )
        assert all(
            set(r["token_type_ids"]) == {0, 1} and len(r["token_type_ids"]) == len(r["token_ids"])
            for r in records
            if r["probe"] == "text"
        )


@pytest.mark.real
def test_gemma3_beyond_its_window_matches_independent_recompute(tmp_path):
    """Sequences of 599-600 tokens, longer than Gemma 3's 512-token window: in its sliding layers a
    uniform head spreads over the window only, so chance differs from the global layers 5, 11,
    17."""
    out = tmp_path / "run"
    _scan(
        "gemma3-270m",
        out,
        "--n-prompts",
        "2",
        "--repeat-len",
        "300",
        "--seq-len",
        "600",
        "--bootstrap",
        "0",
    )
    merged = _assert_agrees(out)
    chance = merged[merged.metric == "sink"].groupby("layer")["chance_re"].first()
    sliding = [layer for layer in range(18) if layer not in (5, 11, 17)]
    assert chance.loc[sliding].nunique() == 1 and chance.loc[[5, 11, 17]].nunique() == 1
    assert chance.loc[0] < chance.loc[5] - 1e-4  # key 0 is out of reach of the later queries


def test_recompute_chance_is_uniform_over_each_layers_window():
    """A head that spreads its attention uniformly over the keys its layer can see scores exactly
    chance, in a sliding-window layer and a global one alike (and the two chances differ)."""
    from types import SimpleNamespace

    from tests.oracles.recompute import (
        METRICS,
        Acc,
        layer_windows,
        score_repeat,
        score_text,
        visibility,
    )

    cfg = SimpleNamespace(sliding_window=3, layer_types=["sliding_attention", "full_attention"])
    windows = layer_windows(cfg, 2, causal=True)
    assert windows == [3, None]
    L, n = 5, 11
    A = torch.stack(
        [
            visibility(n, True, w).double() / visibility(n, True, w).sum(1, keepdim=True)
            for w in windows
        ]
    )[:, None]  # [layer, head, query, key]
    accs = {m: Acc(2, 1) for m in METRICS}
    ids = [0, 7, 8, 9, 10, 11, 7, 8, 9, 10, 11]
    score_text(A, ids, True, 9, {11}, accs, windows)
    score_repeat(A, ids, L, True, accs, "test", windows)
    for metric in METRICS:
        score, chance, count = accs[metric].result()
        assert count > 0
        np.testing.assert_allclose(score[:, 0], chance, atol=1e-12, err_msg=metric)
    _, chance, _ = accs["sink"].result()
    assert chance[0] < chance[1]  # later queries of the sliding layer cannot see key 0
    assert layer_windows(SimpleNamespace(sliding_window=None, layer_types=None), 2, True) == [
        None,
        None,
    ]


@pytest.mark.parametrize("folder", ["tiny_gpt2_dir", "tiny_bert_dir"])
def test_tiny_local_scan_matches_independent_recompute(folder, request, tmp_path):
    """Fast: random 2-layer local checkpoints (causal GPT-2 and encoder BERT), found from
    metadata."""
    out = tmp_path / "run"
    _scan(str(request.getfixturevalue(folder)), out)
    merged = _assert_agrees(out)
    assert merged.loc[merged.metric == "next_token", "score_run"].isna().all() == (
        folder == "tiny_gpt2_dir"
    )


def test_the_recomputation_shares_no_code_with_what_it_checks():
    """The oracle is independent: it imports from headscope only where weights are found."""
    import ast

    import tests.oracles.recompute as oracle

    tree = ast.parse(Path(oracle.__file__).read_text())
    used = {
        n.module
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("headscope")
    }
    used |= {
        a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import)
        for a in n.names
        if a.name.startswith("headscope")
    }
    assert used <= {"headscope.models.sources"}, used
