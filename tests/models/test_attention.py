"""The attention seam and its interventions, against oracles that share no code with them: a plain
PyTorch pre-hook on the output projection (ablation) and attention redone by hand from the
transformer-lens bridge's own q, k, v (key restriction)."""

from __future__ import annotations

import pytest
import torch

from headscope.models import attention
from headscope.models.attention import AttentionCall, ReplaceHeadOutput, RestrictKeys, intercept


def _zero_head_oracle(hf, proj, head: int, d_head: int, value=None):
    """A pre-hook on ``proj`` (the output projection) overwriting head ``head``'s slice of its
    input."""

    def pre(module, args):
        x = args[0].clone()  # [batch, pos, head * d_head]
        x[..., head * d_head : (head + 1) * d_head] = 0.0 if value is None else value
        return (x,)

    return proj.register_forward_pre_hook(pre)


def test_zero_and_mean_ablation_equal_a_plain_hook_on_the_output_projection(tiny_gpt2):
    tokens = torch.tensor([[0, 5, 6, 7, 8, 9], [0, 11, 12, 13, 14, 15]])
    proj = tiny_gpt2.hf.transformer.h[1].attn.c_proj
    mean = torch.linspace(-1, 1, 8)  # a [d_head] vector, as mean-ablation uses
    for value in (0.0, mean):
        got = tiny_gpt2.run(
            tokens, interventions=[ReplaceHeadOutput(layer=1, head=2, value=value)], output="logits"
        )
        handle = _zero_head_oracle(
            tiny_gpt2.hf, proj, 2, 8, None if isinstance(value, float) else value
        )
        try:
            want = tiny_gpt2.logits(tokens)
        finally:
            handle.remove()
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        assert (got - tiny_gpt2.logits(tokens)).abs().max() > 1e-4  # the ablation did something


def test_a_per_position_value_and_one_heads_value_read_back_ablate_alike(tiny_gpt2):
    tokens = torch.tensor([[0, 5, 6, 7, 8, 9], [0, 11, 12, 13, 14, 15]])
    value = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(0))  # [batch, query, dim]
    first = ReplaceHeadOutput(1, 2, value)
    again = ReplaceHeadOutput(1, 2, first.value)  # what a notebook reads back and passes on
    assert first.value.shape == again.value.shape == (2, 6, 1, 8)
    got = tiny_gpt2.run(tokens, interventions=[again], output="logits")
    proj = tiny_gpt2.hf.transformer.h[1].attn.c_proj
    d_head = 8

    def pre(_module, args):
        x = args[0].clone()
        x[..., 2 * d_head : 3 * d_head] = value
        return (x,)

    handle = proj.register_forward_pre_hook(pre)
    try:
        want = tiny_gpt2.logits(tokens)
    finally:
        handle.remove()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def tiny_gqa_llama():
    """A random Llama with grouped-query attention: 4 query heads share 2 KV heads."""
    import headscope
    from tests.tiny_models import tiny_llama

    hf, tok = tiny_llama(n_ctx=64, pad=False)
    return headscope.load_model(hf, tok, name="tiny-gqa-llama")


def test_grouped_query_attention_ablates_a_query_head_never_its_kv_head(tiny_gqa_llama):
    model = tiny_gqa_llama
    assert (model.n_heads, model.n_kv_heads) == (4, 2)
    tokens = torch.tensor([[1, 5, 6, 7, 8, 9, 10]])
    outputs = {}

    class Record:  # an intervention that changes nothing and keeps each layer's final output
        def before(self, call):
            return call

        def after(self, call, out):
            outputs[call.layer] = out.clone()  # [batch, query, head, dim]
            return out

    clean = model.run(tokens, interventions=[Record()], output="logits")
    clean_out = outputs[0]
    got = model.run(tokens, interventions=[ReplaceHeadOutput(0, 1, 0.0), Record()], output="logits")
    assert (outputs[0][:, :, 1] == 0).all() and (clean_out[:, :, 1] != 0).any()
    # head 0 shares KV head 0 with head 1 and is untouched: the KV head itself was not ablated
    torch.testing.assert_close(
        outputs[0][:, :, [0, 2, 3]], clean_out[:, :, [0, 2, 3]], atol=0, rtol=0
    )
    proj = model.hf.model.layers[0].self_attn.o_proj
    handle = _zero_head_oracle(model.hf, proj, 1, model.d_head)
    try:
        want = model.logits(tokens)
    finally:
        handle.remove()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert (got - clean).abs().max() > 1e-4


def test_restricted_keys_give_the_softmax_over_the_kept_keys_only(tiny_gpt2):
    """Head 1 of layer 1 keeps the first key and a window of 2 (sink + window); redo it by hand."""
    ids = [0, 5, 6, 7, 8, 9, 10, 11]
    n = len(ids)

    def keep(call):  # [query, key]: key 0, or q - 2 < k <= q
        q = torch.arange(call.shape[2])[:, None]
        k = torch.arange(call.shape[3])[None, :]
        return (k == 0) | ((k > q - 2) & (k <= q))

    outs = {}

    def record(call):
        outs[call.layer] = call.output()
        return outs[call.layer]

    tiny_gpt2.run(torch.tensor([ids]), handler=record, interventions=[RestrictKeys(1, [1], keep)])
    # the bridge's q, k, v: upstream of layer 1's change
    acts = tiny_gpt2.attention_activations(ids, [1])[1]
    q, k, v = acts["q"][1], acts["k"][1], acts["v"][1]  # [pos, d_head] for head 1
    s = (q @ k.T) / 8**0.5
    allowed = keep(
        AttentionCall(1, torch.zeros(1, 4, n, 8), torch.zeros(1, 4, n, 8), None, None, 1.0, True)
    )
    allowed &= torch.ones(n, n, dtype=torch.bool).tril()
    want = s.masked_fill(~allowed, float("-inf")).softmax(-1) @ v  # [pos, d_head]
    torch.testing.assert_close(outs[1][0, :, 1], want, atol=1e-5, rtol=0)
    # the other heads keep the model's own attention: the bridge's z
    torch.testing.assert_close(
        outs[1][0, :, [0, 2, 3]].transpose(0, 1), acts["z"][[0, 2, 3]], atol=1e-5, rtol=0
    )


def test_full_mask_closed_forms():
    z = torch.zeros(1, 2, 3, 4)  # [batch, head, pos, dim]
    # 2 queries, 3 keys (a cache)
    causal = AttentionCall(0, z[:, :, :2], z, z, None, 1.0, True).full_mask()
    assert causal.tolist() == [[[[True, True, False], [True, True, True]]]]  # bottom-right aligned
    assert AttentionCall(0, z, z, z, None, 1.0, False).full_mask().all()
    additive = torch.tensor([[[[0.0, torch.finfo(torch.float32).min, 0.0]]]])
    assert AttentionCall(0, z, z, z, additive, 1.0, False).full_mask().tolist() == [
        [[[True, False, True]]]
    ]


def test_the_handler_is_active_only_inside_intercept(tiny_gpt2):
    assert attention.active() is None
    with intercept(lambda call: call.output()):
        assert attention.active() is not None
    assert attention.active() is None
    with pytest.raises(RuntimeError, match="boom"), intercept(lambda call: call.output()):
        raise RuntimeError("boom")
    assert attention.active() is None

    def boom(call):
        raise RuntimeError("inside the forward")

    with pytest.raises(RuntimeError, match="inside the forward"):
        tiny_gpt2.run(torch.tensor([[0, 5, 6]]), handler=boom)
    assert attention.active() is None
    assert tiny_gpt2.run(torch.tensor([[0, 5, 6]]), output="logits").shape == (
        1,
        3,
        tiny_gpt2.hf.config.vocab_size,
    )


def test_interpolate_is_replace_at_one_and_nothing_at_zero(tiny_gpt2):
    from headscope.models.attention import Interpolate

    tokens = torch.tensor([[0, 5, 6, 7, 8]])
    value = torch.linspace(-1, 1, 8)
    full = tiny_gpt2.run(tokens, interventions=[ReplaceHeadOutput(1, 2, value)], output="logits")
    torch.testing.assert_close(
        tiny_gpt2.run(tokens, interventions=[Interpolate(1, 2, value, 1.0)], output="logits"),
        full,
        atol=1e-6,
        rtol=0,
    )
    torch.testing.assert_close(
        tiny_gpt2.run(tokens, interventions=[Interpolate(1, 2, value, 0.0)], output="logits"),
        tiny_gpt2.logits(tokens),
        atol=1e-6,
        rtol=0,
    )
    half = tiny_gpt2.run(tokens, interventions=[Interpolate(1, 2, value, 0.5)], output="logits")
    assert (half - full).abs().max() > 1e-5 and (half - tiny_gpt2.logits(tokens)).abs().max() > 1e-5
