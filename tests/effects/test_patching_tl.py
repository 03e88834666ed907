"""Exact patching agrees with transformer-lens' own patching functions run on its bridge
(``transformer_lens.patching``, 4.x, :class:`TransformerBridge`): head output, q, k, v and pattern
at all positions and head output by position, denoising, on a tiny GPT-2 and a tiny grouped-query
Llama (where transformer-lens patches a KV head: our ``kv_mode="group"``).

transformer-lens shares no code with headscope's patching: it runs its own hooks on its bridge, one
forward per (layer, head[, position]). Its ``hook_q``/``hook_k`` are before rotary, ours after; the
rotation depends only on the position, so patching either gives the same run."""

from __future__ import annotations

import pytest
import torch

from headscope.effects.patching import Request, exact_patching, make_batches
from tests.patch_helpers import random_task

TL = {  # transformer-lens function -> (our activation, positions)
    "get_act_patch_attn_head_out_all_pos": ("z", "all"),
    "get_act_patch_attn_head_q_all_pos": ("q", "all"),
    "get_act_patch_attn_head_k_all_pos": ("k", "all"),
    "get_act_patch_attn_head_v_all_pos": ("v", "all"),
    "get_act_patch_attn_head_pattern_all_pos": ("pattern", "all"),
    "get_act_patch_attn_head_out_by_pos": ("z", "each"),
}


def _agree(model, atol=1e-4):
    patching = pytest.importorskip("transformer_lens.patching")
    tt = random_task(model, n_pairs=3, length=7, n_changed=2, seed=11)
    bridge = model.bridge
    clean = torch.tensor(tt.clean)
    corrupt = torch.tensor(tt.corrupt)
    rows = torch.arange(len(tt))
    answer, wrong = torch.tensor(tt.answer), torch.tensor(tt.wrong)

    def metric(logits):  # [batch, pos, vocab] -> [batch]: the logit difference at the last position
        last = logits[:, -1].double()
        return last[rows, answer] - last[rows, wrong]

    with torch.no_grad():
        _, cache = bridge.run_with_cache(clean)
    batches = make_batches(tt, len(tt), model.pad_id)
    checked = 0
    for name, (kind, positions) in TL.items():
        theirs = getattr(patching, name)(
            bridge, corrupt, cache, metric, reduce="none"
        ).values  # [..., batch]
        units = model.n_kv_heads if kind in ("k", "v") else model.n_heads
        every = tuple((la, u) for la in range(model.n_layers) for u in range(units))
        ours = exact_patching(
            model,
            batches,
            len(tt),
            tt.metric,
            [Request("denoising", kind, "group", (positions,), every)],
        )
        for (_, _, _, label, layer, unit), per_pair in ours.items():
            want = theirs[layer, unit] if label == "all" else theirs[layer, int(label), unit]
            torch.testing.assert_close(per_pair, want.double().cpu(), atol=atol, rtol=0)
            checked += 1
        spread = float(theirs.max() - theirs.min())
        assert spread > 1e-3, (name, spread)  # the patches move the metric: the comparison can fail
    return checked


def test_agrees_with_transformer_lens_on_gpt2(tiny_gpt2):
    assert _agree(tiny_gpt2) == 5 * 2 * 4 + 2 * 7 * 4


def test_agrees_with_transformer_lens_on_grouped_query_llama(tiny_gqa_llama):
    assert _agree(tiny_gqa_llama) == 3 * (4 + 4 + 2 + 2 + 4) + 3 * 7 * 4
