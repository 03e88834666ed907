"""Notebook 07's helpers: the repeated-span data, an attention-only model saved as checkpoints that
headscope loads like any other, and the in-context-learning score."""

from __future__ import annotations

import pytest
import torch

import headscope
from lib.phase_change import (
    attention_by_offset,
    icl_score,
    repeated_spans,
    train_attention_only,
)


def test_repeated_spans_repeat_a_span_until_the_context_is_full():
    x = repeated_spans(16, 40, 50, torch.Generator().manual_seed(0), min_span=5, max_span=9)
    assert x.shape == (16, 40) and (x[:, 0] == 50).all() and int(x[:, 1:].max()) < 50
    for row in x[:, 1:]:
        span = next(s for s in range(5, 10) if torch.equal(row[s:], row[:-s]))
        assert span >= 5


@pytest.mark.parametrize("positions", ["rotary", "learned"])
def test_training_saves_attention_only_checkpoints_headscope_can_scan(tmp_path, positions):
    ckpts = train_attention_only(
        tmp_path,
        steps=4,
        save_every=2,
        vocab=32,
        n_ctx=32,
        d_model=16,
        batch=4,
        warmup=2,
        positions=positions,
    )
    assert [c.name for c in ckpts] == ["step-0000", "step-0002", "step-0004"]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpts[-1])
    assert hf.config.model_type == {"rotary": "gpt_neox", "learned": "gpt2"}[positions]
    mlps = [m for name, m in hf.named_modules() if name.endswith(".mlp")]
    assert len(mlps) == 2 and all(
        float(p.detach().abs().sum()) == 0 for m in mlps for p in m.parameters()
    )
    assert float(hf.get_input_embeddings().weight.detach().abs().sum()) > 0
    model = headscope.load_model(str(ckpts[-1]))
    result = headscope.scan(
        model,
        headscope.default_probes(model, n_prompts=2, repeat_len=6, probes=("repeat",)),
        metrics=["induction"],
        bootstrap=0,
        examples=False,
    )
    assert len(result.scores) == 2 * 4
    score = icl_score(ckpts[0], n=8, early=(2, 6), late=(20, 30))
    assert (
        set(score) == {"early", "late", "icl"}
        and abs(score["icl"] - (score["late"] - score["early"])) < 1e-12
    )


def test_attention_by_offset_reads_each_heads_mass_per_offset(tmp_path):
    ckpts = train_attention_only(
        tmp_path, steps=1, save_every=1, vocab=32, n_ctx=32, d_model=16, batch=2
    )
    off = attention_by_offset(ckpts[0], span=6, n=4)
    assert off.shape == (2, 4, 13)
    # per query the masses over offsets 0..q sum to 1, so their mean over the 6 queries does too
    assert torch.allclose(off.sum(-1), torch.ones(2, 4), atol=1e-5)


def test_an_unknown_position_scheme_is_refused(tmp_path):
    with pytest.raises(ValueError, match="positions='alibi'"):
        train_attention_only(tmp_path, steps=1, vocab=8, n_ctx=8, d_model=8, positions="alibi")
