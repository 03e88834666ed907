"""Direct logit attribution against the oracle's recomputation from the weights (o_proj slices, the
final norm's weight and its scale from the same run; Gemma's post-attention norm)."""

from __future__ import annotations

import pytest
import torch

from headscope.effects.logit_attribution import direct_logit_attribution
from headscope.effects.patching import make_batches
from tests.effects import patching_oracle as oracle
from tests.patch_helpers import random_task


def _check(model, tt, atol=1e-5):
    got = direct_logit_attribution(
        model, make_batches(tt, 3, model.pad_id), len(tt), "clean"
    )  # [pair, layer, head]
    for i in range(len(tt)):
        want = oracle.dla(model.hf, tt.clean[i], tt.answer[i], tt.wrong[i], model.n_heads)
        torch.testing.assert_close(got[i], want, atol=atol, rtol=1e-4)
    assert got.abs().max() > 1e-3  # not all zero


def test_layernorm_gpt2_and_rmsnorm_llama(tiny_gpt2, tiny_gqa_llama):
    for model in (tiny_gpt2, tiny_gqa_llama):
        _check(model, random_task(model, n_pairs=4, lengths=[7, 9, 9, 8]))


def test_gemma_post_attention_norm_and_one_plus_weight(tiny_gemma3_dir):
    import headscope

    model = headscope.load_model(str(tiny_gemma3_dir))
    with (
        torch.no_grad()
    ):  # random init leaves the Gemma norms' weights at 0 (gain 1): make them matter
        for name, p in model.hf.named_parameters():
            if "norm" in name:
                p.copy_(torch.linspace(-0.5, 0.8, p.numel()).reshape(p.shape))
    _check(model, random_task(model, n_pairs=3, length=9))


def test_the_heads_sum_to_the_attention_layers_direct_effect(tiny_gqa_llama):
    """Sum over a layer's heads = the attention output of that layer (o_proj of the whole z) through
    the frozen final norm: nothing is lost between heads (Llama's o_proj has no bias)."""
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=2, length=8)
    got = direct_logit_attribution(model, make_batches(tt, 2, model.pad_id), 2)
    hf = model.hf
    outs, final = {}, {}
    hooks = [
        hf.model.layers[i].self_attn.o_proj.register_forward_hook(
            lambda m, a, o, i=i: outs.__setitem__(i, o[0, -1].double())
        )
        for i in range(model.n_layers)
    ]
    hooks.append(
        hf.model.layers[-1].register_forward_hook(
            lambda m, a, o: final.__setitem__(
                "r", o[0][0, -1].double() if isinstance(o, tuple) else o[0, -1].double()
            )
        )
    )
    try:
        with torch.no_grad():
            hf(input_ids=torch.tensor([tt.clean[0]]))
    finally:
        for h in hooks:
            h.remove()
    got, r = got.detach(), final["r"].detach()
    s = (r.pow(2).mean() + hf.model.norm.variance_epsilon).sqrt()
    W_U = hf.lm_head.weight.detach().double()
    direction = W_U[tt.answer[0]] - W_U[tt.wrong[0]]
    for layer in range(model.n_layers):
        want = (outs[layer].detach() * hf.model.norm.weight.detach().double() / s) @ direction
        assert float(got[0, layer].sum()) == pytest.approx(float(want), abs=1e-5)


@pytest.mark.real
def test_smollm2_and_gemma3(smollm2, gemma3):
    from headscope.probes.kits import load_kit

    for model in (smollm2, gemma3):
        tt = load_kit("ioi", model, n_pairs=2, seed=0).tokenize(model)
        _check(model, tt, atol=2e-4)
