"""Faithfulness: keeping every head changes nothing (exactly); a kept set equals an independent
recomputation with plain forward pre-hooks on the output projection; random sets are drawn as
asked."""

from __future__ import annotations

import pytest
import torch

from headscope.circuits.faithfulness import faithfulness, head_means
from headscope.effects.patching import make_batches
from headscope.errors import HeadscopeError
from tests.patch_helpers import random_task


def _hooked_metric(model, tt, keep, means):
    """Every head outside ``keep`` replaced by its mean with forward pre-hooks on o_proj (the HF
    model's own attention), one prompt at a time."""
    hf, H, d = model.hf, model.n_heads, model.d_head
    out = []
    for i in range(len(tt)):
        handles = []
        for la, layer in enumerate(hf.model.layers):

            def pre(mod, args, la=la):
                x = args[0].clone()
                for h in range(H):
                    if (la, h) not in keep:
                        x[..., h * d : (h + 1) * d] = means[la, h]
                return (x,)

            handles.append(layer.self_attn.o_proj.register_forward_pre_hook(pre))
        try:
            with torch.no_grad():
                logits = hf(input_ids=torch.tensor([tt.clean[i]])).logits[0, -1].double()
        finally:
            for h in handles:
                h.remove()
        out.append(float(logits[tt.answer[i]] - logits[tt.wrong[i]]))
    return torch.tensor(out, dtype=torch.float64)


def test_keeping_every_head_is_the_full_model_and_a_set_matches_plain_hooks(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=5, lengths=[9, 8, 9, 7, 9])
    batches = make_batches(tt, 3, model.pad_id)
    every = [(la, h) for la in range(model.n_layers) for h in range(model.n_heads)]
    got = faithfulness(model, batches, len(tt), tt.metric, every, n_random=0, resamples=100)
    assert got["faithfulness"][0] == 1.0 and got["recovered"][0] == 1.0
    assert torch.equal(got["m_set"], got["m_full"])
    keep = [(0, 1), (1, 3), (2, 0)]
    got = faithfulness(model, batches, len(tt), tt.metric, keep, n_random=7, seed=3)
    means = head_means(model, batches, "corrupt")
    want = _hooked_metric(model, tt, set(keep), means)
    torch.testing.assert_close(got["m_set"], want, atol=1e-5, rtol=1e-5)
    none = _hooked_metric(model, tt, set(), means)
    torch.testing.assert_close(got["m_none"], none, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got["m_set"], got["m_full"])  # the ablation does something
    assert len(got["random_sets"]) == 7 and all(len(s) == 3 for s in got["random_sets"])
    assert len(got["random_faithfulness"]) == 7
    f, lo, hi = got["faithfulness"]
    assert lo <= f <= hi
    # every head ablated, against the full model: the ratio of means, with its own interval
    e, e_lo, e_hi = got["empty"]
    assert e == pytest.approx(float(got["m_none"].mean() / got["m_full"].mean()), rel=1e-12)
    assert e_lo <= e <= e_hi and e_lo < e_hi
    # it does not depend on the set kept (every head ablated is every head ablated)
    same = faithfulness(model, batches, len(tt), tt.metric, every, n_random=0, resamples=100)
    assert same["empty"][0] == pytest.approx(e, rel=1e-12)


def test_bad_sets_get_one_line(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=2)
    batches = make_batches(tt, 2, model.pad_id)
    with pytest.raises(HeadscopeError, match="L9H0"):
        faithfulness(model, batches, 2, tt.metric, [(9, 0)])
    with pytest.raises(HeadscopeError, match="reference"):
        faithfulness(model, batches, 2, tt.metric, [(0, 0)], reference="abc")
