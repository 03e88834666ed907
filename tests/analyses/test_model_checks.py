"""From-scratch attention against real models (lib.model_checks): tiny GPT-2, then
the offline models."""

from __future__ import annotations

import math

import pytest
import torch

from lib.attention_math import attention, repeat_kv
from lib.model_checks import (
    all_patterns,
    permutation_table,
    prefix_check,
    recompute_check,
    recompute_layer,
)

_TEXT = "The river bank flooded after the storm, so the town moved its market up the hill."


def test_recompute_layer_shares_kv_heads_and_uses_rotated_keys():
    gen = torch.Generator().manual_seed(0)
    # [head=6, pos=5, d=4] each
    q, rot_q = torch.randn(2, 6, 5, 4, generator=gen, dtype=torch.float64)
    # [kv_head=2, pos, d] each
    k, rot_k, v = torch.randn(3, 2, 5, 4, generator=gen, dtype=torch.float64)
    z, w = recompute_layer({"q": q, "k": k, "v": v, "rot_q": rot_q, "rot_k": rot_k}, causal=True)
    z_ref, w_ref = attention(
        rot_q, rot_k.repeat_interleave(3, dim=0), v.repeat_interleave(3, dim=0), causal=True
    )
    torch.testing.assert_close(z, z_ref)
    torch.testing.assert_close(w, w_ref)
    assert (w[:, 0, 1:] == 0).all()  # causal
    _, w_plain = recompute_layer({"q": q, "k": k, "v": v}, causal=False)  # no rotary: q, k as given
    torch.testing.assert_close(w_plain, attention(q, repeat_kv(k, 6), repeat_kv(v, 6))[1])


# ------------------------------------------------------------------------ a tiny GPT-2 (always
# available)


def _ids(model, n=12):
    """``BOS`` + ``n`` seeded random ordinary tokens."""
    vocab = model.ordinary_vocab()
    return model.wrap(
        vocab[torch.randint(len(vocab), (n,), generator=torch.Generator().manual_seed(0))].tolist()
    )


def test_recompute_check_matches_tiny_gpt2(tiny_gpt2):
    t = recompute_check(tiny_gpt2, _ids(tiny_gpt2))
    assert t["layer"].tolist() == list(range(tiny_gpt2.n_layers))
    assert t["pattern_max_abs_diff"].max() < 1e-5
    assert t["z_max_abs_diff"].max() < 1e-5
    assert t["max_row_sum_err"].max() < 1e-5


def test_all_patterns_and_prefix_check_tiny_gpt2(tiny_gpt2):
    ids = _ids(tiny_gpt2)
    patterns = all_patterns(tiny_gpt2, ids)
    assert sorted(patterns) == list(range(tiny_gpt2.n_layers))
    assert (
        patterns[0].shape == (tiny_gpt2.n_heads, len(ids), len(ids))
        and patterns[0].dtype == torch.float32
    )
    t = prefix_check(tiny_gpt2, ids)
    assert t["layer"].tolist() == list(range(tiny_gpt2.n_layers))
    assert t["prefix_max_abs_diff"].max() < 1e-5
    assert (t["new_key_max_weight"] == 0).all()


def test_permutation_table_without_rotary_tiny_gpt2(tiny_gpt2):
    """GPT-2 adds positions to its input, so there is no RoPE row and already its queries move."""
    ids = _ids(tiny_gpt2, n=5)
    t = permutation_table(tiny_gpt2, ids, [0, 3, 4, 1, 2, 5]).set_index("computation")
    assert t.index.tolist() == [
        "queries, before positions",
        "from scratch, no positions, no mask",
        "the model (positions + mask)",
    ]
    assert math.isnan(t.loc["queries, before positions", "weights_gap"])
    assert t.loc["the model (positions + mask)", "weights_gap"] > 1e-3


# ------------------------------------------------------------------------ the real models


@pytest.mark.real
def test_recompute_matches_smollm2(smollm2):
    ids = smollm2.wrap(smollm2.encode(_TEXT))
    t = recompute_check(smollm2, ids, layers=[0, 17, 29])
    assert t["layer"].tolist() == [0, 17, 29]
    assert t["pattern_max_abs_diff"].max() < 1e-5
    assert t["z_max_abs_diff"].max() < 1e-5


@pytest.mark.real
def test_recompute_negative_controls_smollm2(smollm2):
    """The check has teeth: pre-RoPE keys, or the wrong KV head, do not reproduce the pattern."""
    ids = smollm2.wrap(smollm2.encode(_TEXT))
    acts = smollm2.attention_activations(ids, [3])[3]
    assert acts["rot_q"].shape == (9, len(ids), 64) and acts["rot_k"].shape == (3, len(ids), 64)
    _, no_rope = attention(acts["q"], repeat_kv(acts["k"], 9), repeat_kv(acts["v"], 9), causal=True)
    assert (no_rope - acts["pattern"]).abs().max() > 1e-2
    wrong_k = acts["rot_k"].repeat(3, 1, 1)  # head h -> KV head h % 3 instead of h // 3
    _, wrong = attention(acts["rot_q"], wrong_k, wrong_k, causal=True)
    assert (wrong - acts["pattern"]).abs().max() > 1e-2


@pytest.mark.real
def test_recompute_matches_minilm(minilm):
    ids = minilm.wrap(minilm.encode(_TEXT))
    t = recompute_check(minilm, ids)
    assert len(t) == 6
    assert t["pattern_max_abs_diff"].max() < 1e-5
    assert t["z_max_abs_diff"].max() < 1e-5


@pytest.mark.real
def test_prefix_rows_unchanged_smollm2(smollm2):
    ids = smollm2.wrap(smollm2.encode(_TEXT))
    t = prefix_check(smollm2, ids)
    assert len(t) == smollm2.n_layers
    assert t["prefix_max_abs_diff"].max() < 1e-5
    assert (t["new_key_max_weight"] == 0).all()


@pytest.mark.real
def test_permutation_real_model_changes(smollm2):
    ids = smollm2.wrap(smollm2.encode("The river bank flooded"))
    assert len(ids) == 5
    t = permutation_table(smollm2, ids, [0, 3, 4, 1, 2]).set_index("computation")
    assert t.loc["queries, before positions", "output_gap"] < 1e-5
    assert t.loc["from scratch, no positions, no mask", ["output_gap", "weights_gap"]].max() < 1e-5
    assert t.loc["from scratch, RoPE, no mask", "weights_gap"] > 1e-3
    assert t.loc["the model (positions + mask)", "weights_gap"] > 1e-2
