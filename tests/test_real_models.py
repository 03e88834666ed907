"""The real offline models: their known structure comes out, and padding changes nothing."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.engines.extract import score_probe
from headscope.metrics import REGISTRY

pytestmark = pytest.mark.real


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: on this shared 2-core machine a gemma3-270m scan took 37 s with one and
    69 s with two (SmolLM2: 5-8x slower with two, see test_recompute_real). Restored afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _score(result, metric):
    return headscope.matrix(result.scores, metric)


@pytest.mark.parametrize("fixture", ["smollm2", "minilm", "gemma3"])
def test_padded_batches_score_like_single_sequences(fixture, request):
    model = request.getfixturevalue(fixture)
    probe = headscope.text_probe(model, headscope.load_pairs(), n_prompts=6)
    assert len({len(s) for s in probe.sequences}) > 1
    metrics = list(REGISTRY.values())
    single = score_probe(model, probe, metrics, batch_size=1)
    padded = score_probe(model, probe, metrics, batch_size=6)
    for name in single:
        torch.testing.assert_close(
            padded[name].score, single[name].score, atol=2e-5, rtol=0, equal_nan=True
        )
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


def test_gemma3_structure_and_tokens(gemma3):
    m = gemma3
    assert (m.n_layers, m.n_heads, m.n_kv_heads, m.d_head, m.causal) == (18, 4, 1, 256, True)
    assert type(m.hf).__name__ == "Gemma3ForCausalLM"
    cfg = m.hf.config
    assert cfg.sliding_window == 512
    assert [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert set(cfg.layer_types) == {"sliding_attention", "full_attention"}
    assert (
        m.provenance["weights_sha256"]
        == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    )
    assert m.provenance["repo_id"] == "google/gemma-3-270m"
    assert (m.bos_id, m.sep_id, m.eos_id) == (2, 1, None)  # <bos>; the separator is <eos>
    ids = m.join_pair("The cat sat.", "It purred.")
    assert ids[0] == 2 and ids.count(2) == 1 and ids.count(1) == 1  # BOS once, SEP once
    assert m.str_tokens(ids)[:2] == ["<bos>", "The"]


def test_gemma3_induction_heads_in_global_layers_and_the_loss_drop(gemma3):
    """Measured: induction L5H1 0.87, L11H2 0.63, L5H2 0.53 (16 x 50 tokens), all in global layers;
    loss ~16 nats on the first copy of R, ~1 on the second. L5H1 is also the strongest sink on
    text."""
    from lib.induction import repeat_loss_summary, token_losses

    probes = headscope.default_probes(gemma3, n_prompts=16, repeat_len=50, seed=0)
    result = headscope.scan(gemma3, probes, null=False, examples=False, bootstrap=0)
    induction = _score(result, "induction")
    assert tuple(induction.stack().idxmax()) == (5, 1) and induction.loc[5, 1] > 0.75
    strong = {layer for (layer, _), v in induction.stack().items() if v > 0.5}
    assert strong and strong <= {5, 11, 17}  # only the global (full-attention) layers
    sink = _score(result, "sink")
    assert sink.to_numpy().max() > 0.9 and (sink > 0.3).to_numpy().mean() > 0.5
    assert result.scores.query("metric == 'next_token'")["score"].isna().all()
    losses = token_losses(
        gemma3, headscope.repeat_probe(gemma3, repeat_len=50, n_sequences=4, seed=0)
    )
    summary = repeat_loss_summary(losses, 50)
    assert summary["first_copy"] > 10 and summary["second_copy"] < 2.5
