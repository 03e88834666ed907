"""The real offline models: their known structure comes out, and padding changes nothing."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.extract import score_probe
from headscope.metrics import REGISTRY

pytestmark = pytest.mark.real


def _score(result, metric):
    return headscope.matrix(result.scores, metric)


@pytest.mark.parametrize("fixture", ["smollm2", "minilm"])
def test_padded_batches_score_like_single_sequences(fixture, request):
    model = request.getfixturevalue(fixture)
    probe = headscope.text_probe(model, headscope.load_pairs(), n_prompts=6)
    assert len({len(s) for s in probe.sequences}) > 1
    metrics = list(REGISTRY.values())
    single = score_probe(model, probe, metrics, batch_size=1)
    padded = score_probe(model, probe, metrics, batch_size=6)
    for name in single:
        torch.testing.assert_close(padded[name].score, single[name].score, atol=2e-5, rtol=0, equal_nan=True)
        assert padded[name].count == single[name].count


def test_smollm2_induction_heads_and_sinks(smollm2):
    probes = headscope.default_probes(smollm2, n_prompts=16, repeat_len=50, seed=0)
    result = headscope.scan(smollm2, probes)
    induction = _score(result, "induction")
    # strong induction heads sit in layers 17-18
    assert induction.loc[17:18].to_numpy().max() > 0.7
    best_layer = int(induction.stack().idxmax()[0])
    assert best_layer in (17, 18)
    assert (induction.loc[17:18] > 0.5).to_numpy().sum() >= 3
    sink = _score(result, "sink")
    assert sink.to_numpy().max() > 0.95
    assert (sink > 0.3).to_numpy().mean() > 0.3  # most heads lean on the first token
    assert result.scores.query("metric == 'next_token'")["score"].isna().all()


def test_minilm_previous_token_head_and_cls(minilm):
    probes = headscope.default_probes(minilm, n_prompts=16, repeat_len=50, seed=0)
    result = headscope.scan(minilm, probes)
    prev = _score(result, "previous_token")
    assert prev.loc[0].max() > 0.95
    nxt = _score(result, "next_token")
    assert nxt.notna().all().all() and nxt.to_numpy().max() > 0.5
    sep = result.scores.query("metric == 'separator'")
    assert sep["n"].iloc[0] > 0 and sep["score"].notna().all()
