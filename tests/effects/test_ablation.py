"""Exact ablation against a plain-transformers recomputation (tests/effects/oracle.py): the same
effects, with the clean prefix reused and several heads per forward."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.effects.ablation import exact_effects, head_means
from headscope.effects.targets import TARGETS
from tests.effects import oracle


def _check(model, probe, target_name, heads, ablation, atol):
    target = TARGETS[target_name]
    means = head_means(model, probe, batch_size=3)
    values = means if ablation == "mean" else 0.0
    got = exact_effects(model, probe, target, heads, values, batch_size=3, rows_per_forward=6)
    hf = model.hf
    hf.set_attn_implementation("eager")  # the oracle runs the model as transformers ships it
    try:
        ref_means = oracle.head_means(
            hf, probe.sequences, model.n_layers, model.n_heads, model.d_head, probe.token_types
        )
        torch.testing.assert_close(means, ref_means, atol=1e-5, rtol=0)
        for layer, head in heads:
            value = ref_means[layer, head] if ablation == "mean" else torch.zeros(model.d_head)
            want = oracle.ablated_effect(
                hf,
                probe.sequences,
                target_name,
                layer,
                head,
                model.d_head,
                value,
                probe.repeat_len,
                probe.token_types,
            )
            s, c = got[(layer, head)]  # per sequence
            assert s.shape == c.shape == (len(probe),)
            assert float(s.sum() / c.sum()) == pytest.approx(want, abs=atol), (layer, head)
    finally:
        hf.set_attn_implementation("headscope")


@pytest.mark.parametrize("ablation", ["mean", "zero"])
def test_decoder_losses_match_plain_hooks(tiny_gpt2, ablation):
    text, repeat = headscope.default_probes(tiny_gpt2, n_prompts=4, repeat_len=6, seed=1)
    heads = [(0, 0), (0, 3), (1, 1), (1, 2)]
    _check(tiny_gpt2, repeat, "repeat_loss", heads, ablation, 1e-6)
    _check(tiny_gpt2, text, "text_loss", heads, ablation, 1e-6)


def test_encoder_embedding_matches_plain_hooks(tiny_bert):
    text, _ = headscope.default_probes(tiny_bert, n_prompts=4, repeat_len=6)
    _check(tiny_bert, text, "embedding", [(0, 1), (1, 3)], "mean", 1e-6)


def test_encoder_effects_with_token_types_match_plain_hooks(tiny_bert):
    text = headscope.text_probe(tiny_bert, n_prompts=4, token_types=True)
    assert any(1 in t for t in text.token_types)
    _check(tiny_bert, text, "embedding", [(0, 1), (1, 3)], "mean", 1e-6)
    _check(tiny_bert, text, "embedding", [(1, 0)], "zero", 1e-6)


def test_reusing_the_prefix_and_sharing_forwards_change_nothing(tiny_gpt2):
    """All heads of a layer in one forward from the kept block output == one full forward per
    head."""
    _, repeat = headscope.default_probes(tiny_gpt2, n_prompts=3, repeat_len=5)
    target = TARGETS["repeat_loss"]
    means = head_means(tiny_gpt2, repeat, batch_size=2)
    heads = [(layer, h) for layer in range(2) for h in range(4)]
    shared = exact_effects(
        tiny_gpt2, repeat, target, heads, means, batch_size=2, rows_per_forward=64
    )
    alone = exact_effects(tiny_gpt2, repeat, target, heads, means, batch_size=1, rows_per_forward=1)
    for key in heads:
        # sequence by sequence
        torch.testing.assert_close(shared[key][0], alone[key][0], atol=1e-6, rtol=0)
        assert torch.equal(shared[key][1], alone[key][1])


@pytest.mark.real
def test_smollm2_effects_match_plain_hooks_to_1e_4_nats(smollm2):
    """Grouped-query attention (9 query heads on 3 KV heads): heads whose induction, previous-token
    and sink scores are high, and one that does little."""
    text, repeat = headscope.default_probes(smollm2, n_prompts=3, repeat_len=20, seed=0)
    heads = [(18, 6), (17, 3), (16, 0), (18, 8), (2, 4)]
    _check(smollm2, repeat, "repeat_loss", heads, "mean", 1e-4)
    _check(smollm2, text, "text_loss", heads[:3], "zero", 1e-4)


@pytest.mark.real
def test_minilm_embedding_effects_match_plain_hooks(minilm):
    text, _ = headscope.default_probes(minilm, n_prompts=4)
    _check(minilm, text, "embedding", [(0, 2), (3, 5), (5, 11)], "mean", 1e-5)
