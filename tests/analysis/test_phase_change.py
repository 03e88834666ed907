"""Notebook 07's helpers: the repeated-span data, an attention-only model saved as checkpoints that
headscope loads like any other, and the in-context-learning score."""

from __future__ import annotations

import torch

import headscope
from headscope.analysis.phase_change import icl_score, repeated_spans, train_attention_only


def test_repeated_spans_repeat_a_span_until_the_context_is_full():
    x = repeated_spans(16, 40, 50, torch.Generator().manual_seed(0), min_span=5, max_span=9)
    assert x.shape == (16, 40) and (x[:, 0] == 50).all() and int(x[:, 1:].max()) < 50
    for row in x[:, 1:]:
        span = next(s for s in range(5, 10) if torch.equal(row[s:], row[:-s]))
        assert span >= 5


def test_training_saves_attention_only_checkpoints_headscope_can_scan(tmp_path):
    ckpts = train_attention_only(tmp_path, steps=4, save_every=2, vocab=32, n_ctx=32, d_model=16, batch=4)
    assert [c.name for c in ckpts] == ["step-0000", "step-0002", "step-0004"]
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(ckpts[-1])
    assert all(float(p.abs().sum()) == 0 for block in hf.transformer.h for p in block.mlp.parameters())
    model = headscope.load_model(str(ckpts[-1]))
    result = headscope.scan(model, headscope.default_probes(model, n_prompts=2, repeat_len=6, probes=("repeat",)),
                            metrics=["induction"], bootstrap=0, examples=False)
    assert len(result.scores) == 2 * 4
    score = icl_score(ckpts[0], n=8, early=(2, 6), late=(20, 30))
    assert set(score) == {"early", "late", "icl"} and abs(score["icl"] - (score["late"] - score["early"])) < 1e-12
