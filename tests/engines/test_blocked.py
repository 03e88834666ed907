"""The blocked engine: exact pattern blocks from q and k, equal to eager attention and to the
hook_pattern path; it stops the forward after the last layer and refuses softmaxes it cannot
model."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.engines import blocked
from headscope.engines.blocked import BlockHandler, block_rows, pattern_blocks
from headscope.engines.extract import score_probe
from headscope.metrics import REGISTRY
from headscope.models.attention import AttentionCall
from headscope.probes.pairs import packed_text_probe
from tests.engines.agree import assert_engines_agree


def reference(q, k, mask, scale, causal):
    """Eager attention weights, the textbook way: [b, h, q, k]."""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    elif causal:
        s = s.masked_fill(torch.triu(torch.ones(s.shape[-2:], dtype=torch.bool), 1), float("-inf"))
    return torch.nan_to_num(s.softmax(-1), nan=0.0)


def assemble(blocks, n_k):
    rows = []
    for _, p in blocks:
        pad = torch.zeros(*p.shape[:-1], n_k - p.shape[-1])
        rows.append(torch.cat([p, pad], -1))
    return torch.cat(rows, 2)


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_blocks_reassemble_to_eager_attention(rows, kv_heads, causal):
    g = torch.Generator().manual_seed(0)
    b, h, n, d = 2, 4, 11, 8
    q = torch.randn(b, h, n, d, generator=g)
    k = torch.randn(b, kv_heads, n, d, generator=g)
    want = reference(q, k, None, d**-0.5, causal)
    got = assemble(pattern_blocks(q, k, None, d**-0.5, causal, rows), n)
    torch.testing.assert_close(got, want)


def test_blocks_with_padding_masks_bool_and_additive():
    g = torch.Generator().manual_seed(1)
    b, h, n, d = 2, 2, 7, 4
    q, k = torch.randn(b, h, n, d, generator=g), torch.randn(b, h, n, d, generator=g)
    real = torch.tensor([[1] * 7, [1] * 4 + [0] * 3], dtype=torch.bool)
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
    bool_mask = real[:, None, None, :] & causal  # [b, 1, q, k]
    want = reference(q, k, bool_mask, 0.5, True)
    got = assemble(pattern_blocks(q, k, bool_mask, 0.5, True, 2), n)
    torch.testing.assert_close(got, want)
    additive = torch.zeros(b, 1, n, n).masked_fill(~bool_mask, torch.finfo(torch.float32).min)
    got2 = assemble(pattern_blocks(q, k, additive, 0.5, True, 3), n)
    torch.testing.assert_close(got2, want)
    # the log blocks are the log of the blocks where attention is non-zero, and finite everywhere
    for _, p, logp in pattern_blocks(q, k, bool_mask, 0.5, True, 3, with_log=True):
        assert torch.isfinite(logp).all()
        torch.testing.assert_close(logp.exp(), p)
        torch.testing.assert_close(-(p * logp).sum(-1), torch.special.entr(p).sum(-1))
    # a fully masked row (possible with exotic masks) gives zeros, never NaN
    empty = bool_mask.clone()
    empty[1, 0, 6] = False
    got3 = assemble(pattern_blocks(q, k, empty, 0.5, True, 4), n)
    assert torch.isfinite(got3).all() and got3[1, :, 6].abs().sum() == 0


def test_block_rows_respects_the_byte_budget():
    assert block_rows(1, 9, 4096, 32 * 2**20) == 227
    assert block_rows(64, 32, 8192, 1) == 16  # never fewer than 16 rows


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_bert"])
def test_blocked_engine_equals_hooks_engine(fixture, request):
    model = request.getfixturevalue(fixture)
    assert model.attention_interface
    assert_engines_agree(model, n_prompts=5, repeat_len=7, batch_size=2, engines=("blocked",))


def test_token_types_reach_every_engine(tiny_bert):
    """Segment ids change the patterns, and every engine feeds them the same way (the recompute
    test checks them against transformers' own eager attention)."""
    typed = headscope.text_probe(tiny_bert, n_prompts=5, token_types=True)
    assert_engines_agree(
        tiny_bert, None, None, batch_size=2, engines=("blocked", "fused"), probes=[typed]
    )
    metrics = [m for m in REGISTRY.values() if m.probe == "text"]
    with_types = score_probe(tiny_bert, typed, metrics, batch_size=2, engine="blocked")
    without = score_probe(
        tiny_bert,
        headscope.text_probe(tiny_bert, n_prompts=5),
        metrics,
        batch_size=2,
        engine="blocked",
    )
    # they reach the model
    assert (with_types["sink"].score - without["sink"].score).abs().max() > 1e-6


def test_small_blocks_change_nothing(tiny_gpt2, monkeypatch):
    """Force many query blocks per layer (1-byte budget -> 16-row blocks) on a long sequence."""
    probe = packed_text_probe(tiny_gpt2, None, seq_len=100, n_sequences=2)
    metrics = list(REGISTRY.values())
    want = score_probe(tiny_gpt2, probe, metrics, batch_size=2, engine="hooks")
    starts = []
    orig_blocks = blocked.pattern_blocks

    def blocks(*args, **kwargs):
        for item in orig_blocks(*args, **kwargs):
            starts.append((args[-1], item[0]))  # (rows per block, first row)
            yield item

    monkeypatch.setattr(blocked, "BLOCK_BYTES", 1)
    monkeypatch.setattr(blocked, "pattern_blocks", blocks)
    got = score_probe(tiny_gpt2, probe, metrics, batch_size=2, engine="blocked")
    # really blocked
    assert {rows for rows, _ in starts} == {16} and max(q for _, q in starts) == 96
    for name in got:
        torch.testing.assert_close(
            got[name].score, want[name].score, atol=1e-5, rtol=0, equal_nan=True
        )


def test_blocked_forward_stops_after_the_last_layer(tiny_gpt2):
    fired = []
    mlp = tiny_gpt2.hf.transformer.h[0].mlp
    handle = mlp.register_forward_hook(lambda *a: fired.append("mlp0"))
    try:
        layers = []
        blocked.ENGINE.run(
            tiny_gpt2,
            torch.tensor([[0, 5, 6]]),
            torch.ones(1, 3, dtype=torch.bool),
            None,
            lambda layer, rows, qs: layers.append((layer, rows.shape, qs)),
            layers=[0],
        )
    finally:
        handle.remove()
    assert layers == [(0, (1, tiny_gpt2.n_heads, 3, 3), 0)] and fired == []


@pytest.mark.real
@pytest.mark.parametrize("fixture", ["smollm2", "minilm"])
def test_blocked_and_fused_equal_hooks_on_real_models(fixture, request):
    assert_engines_agree(request.getfixturevalue(fixture), n_prompts=4, repeat_len=30, batch_size=4)


@pytest.mark.parametrize("kwarg", ["softcap", "s_aux", "position_bias"])
def test_attention_it_cannot_model_is_refused_not_mis_scored(kwarg):
    """Logit soft-capping, learned sinks and position biases change the pattern; say so, never
    guess."""
    q = torch.randn(1, 2, 4, 8)
    call = AttentionCall(
        layer=0,
        query=q,
        key=q,
        value=q,
        mask=None,
        scale=0.5,
        causal=True,
        extras={kwarg: torch.ones(1)},
    )
    with pytest.raises(
        headscope.HeadscopeError, match=f"uses {kwarg}.*blocked engine.*use --engine hooks"
    ):
        BlockHandler(lambda *a: None, [0])(call)
