"""The explicit attention every patching run uses equals the model's own attention (its sdpa)."""

from __future__ import annotations

import pytest
import torch

from headscope.effects.stages import STAGES, attend


def _compare(model, tokens, mask=None, atol=2e-6):
    seen = []

    def handler(call):
        own = call.output()  # [batch, query, head, dim]
        keep = dict.fromkeys(STAGES)
        ours = attend(call, keep=keep)
        seen.append(float((own - ours).abs().max()))
        b, h, n_q, n_k = call.shape
        assert keep["z"].shape == own.shape and keep["pattern"].shape == (b, h, n_q, n_k)
        assert keep["k"].shape[1] == model.n_kv_heads and keep["k_head"].shape[1] == model.n_heads
        torch.testing.assert_close(
            keep["pattern"].sum(-1), torch.ones(b, h, n_q), atol=1e-5, rtol=0
        )
        return own

    model.run(tokens, mask, handler=handler)
    assert len(seen) == model.n_layers
    assert max(seen) < atol, seen


def test_matches_sdpa_on_gpt2_and_grouped_query_llama(tiny_gpt2, tiny_gqa_llama):
    for model in (tiny_gpt2, tiny_gqa_llama):
        tokens = torch.randint(5, 200, (3, 11))
        mask = torch.ones_like(tokens, dtype=torch.bool)
        mask[1, 7:] = False  # right padding
        _compare(model, tokens)
        _compare(model, tokens, mask)


def test_matches_sdpa_with_a_sliding_window(tiny_gemma3_dir):
    import headscope

    model = headscope.load_model(str(tiny_gemma3_dir))  # layer 0 sees 4 keys back
    assert model.reach[0] is not None
    _compare(model, torch.randint(5, 200, (2, 12)))


def test_refuses_what_it_does_not_reproduce():
    from headscope.errors import HeadscopeError
    from headscope.models.attention import AttentionCall

    call = AttentionCall(
        layer=0,
        query=torch.zeros(1, 2, 3, 4),
        key=torch.zeros(1, 1, 3, 4),
        value=torch.zeros(1, 1, 3, 4),
        mask=None,
        scale=0.5,
        causal=True,
        extras={"sinks": 1},
    )
    with pytest.raises(HeadscopeError, match="sinks"):
        attend(call)


def test_softcap_is_applied_before_the_mask():
    from headscope.models.attention import AttentionCall

    q, k = torch.randn(1, 1, 3, 4) * 5, torch.randn(1, 1, 3, 4) * 5
    v = torch.randn(1, 1, 3, 4)
    call = AttentionCall(
        layer=0, query=q, key=k, value=v, mask=None, scale=0.5, causal=True, extras={"softcap": 2.0}
    )
    keep = {"pattern": None}
    attend(call, keep=keep)
    s = torch.tanh((q @ k.transpose(-1, -2)) * 0.5 / 2.0) * 2.0
    s = s.masked_fill(~torch.ones(3, 3, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(keep["pattern"], s.softmax(-1))


@pytest.mark.real
def test_matches_sdpa_on_smollm2(smollm2):
    tokens = torch.tensor(
        [[smollm2.bos_id, *smollm2.encode("When Mary and John went to the store, John gave a")]]
    )
    _compare(smollm2, tokens, atol=1e-5)
