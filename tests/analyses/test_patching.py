"""The patching notebook's helpers: agreement with intervals over pairs, attention from END against
HF's eager attention weights, OV name copying against a hand computation from the HF weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.apps.patch import patch
from lib.patching import (
    WANG_GPT2_SMALL,
    agreement,
    attention_from_end,
    name_copying,
    wang_table,
)
from tests.patch_helpers import random_task


@pytest.fixture(scope="module")
def task(tiny_gqa_llama):
    tt = random_task(tiny_gqa_llama, n_pairs=6, lengths=[9, 8, 9, 9, 7, 9], seed=3)
    tt.positions["Y"] = [2] * 6
    return tt


def test_agreement_is_spearman_and_top_overlap_with_an_interval(tiny_gqa_llama, task):
    r = patch(
        tiny_gqa_llama,
        task,
        activations=("z", "v"),
        positions=("all", "X"),
        estimator="both",
        directions=("denoising",),
        bootstrap=0,
    )
    got = agreement(r, resamples=200)
    assert len(got) == 2 * 3  # z, v group, v head at all and X
    t = r.table
    for row in got.itertuples():
        sub = t[
            (t.activation == row.activation)
            & (t.kv_mode == row.kv_mode)
            & (t.position == row.position)
        ]
        piv = sub.pivot(index="head_name", columns="estimator", values="effect")
        want = piv["exact"].rank().corr(piv["attribution"].rank())
        assert row.spearman == pytest.approx(want, abs=1e-9)
        # a percentile interval of a rank statistic need not contain the point; it is an interval
        assert -1 <= row.spearman_ci_low <= row.spearman_ci_high <= 1
        assert 0 <= row.overlap_ci_low <= row.overlap_ci_high <= 10
        top = min(10, len(piv))
        a = set(piv["attribution"].abs().sort_values(ascending=False).index[:top])
        e = set(piv["exact"].abs().sort_values(ascending=False).index[:top])
        assert row.top10_overlap == len(a & e)
    with pytest.raises(Exception, match="per-pair"):
        agreement(type(r)(**{**r.__dict__, "per_pair": {}}))


def test_attention_from_end_is_the_models_own_attention_weight(tiny_gqa_llama, task):
    heads = [(0, 1), (2, 3)]
    got = attention_from_end(tiny_gqa_llama, task, heads, to=("X", "Y"), resamples=50).set_index(
        ["head_name", "to"]
    )
    hf = tiny_gqa_llama.hf
    old = hf.config._attn_implementation
    hf.set_attn_implementation("eager")
    try:
        per = {(h, p): [] for h in ("L0H1", "L2H3") for p in ("X", "Y")}
        for i, ids in enumerate(task.clean):
            with torch.no_grad():
                att = hf(input_ids=torch.tensor([ids]), output_attentions=True).attentions
            for la, h in heads:
                for p in ("X", "Y"):
                    per[(f"L{la}H{h}", p)].append(float(att[la][0, h, -1, task.positions[p][i]]))
    finally:
        hf.set_attn_implementation(old)
    for key, values in per.items():
        assert got.loc[key, "attention"] == pytest.approx(np.mean(values), abs=1e-6)
        assert got.loc[key, "ci_low"] <= got.loc[key, "attention"] <= got.loc[key, "ci_high"]


def test_name_copying_is_the_rank_of_the_name_under_the_ov_circuit(tiny_gqa_llama, task):
    model, hf = tiny_gqa_llama, tiny_gqa_llama.hf
    heads = [(1, 0), (1, 3), (2, 2)]
    got = name_copying(model, task, heads, at="X", k=20, resamples=0).set_index("head_name")
    vocab = model.ordinary_vocab().sort().values
    g, d = model.n_heads // model.n_kv_heads, model.d_head
    for la, h in heads:
        inputs = []
        hook = hf.model.layers[la].self_attn.register_forward_pre_hook(
            lambda m, a, kw, got=inputs: got.append(kw["hidden_states"][0].detach()),
            with_kwargs=True,
        )
        try:
            for ids in task.clean:
                with torch.no_grad():
                    hf(input_ids=torch.tensor([ids]))
        finally:
            hook.remove()
        attn = hf.model.layers[la].self_attn
        Wv = attn.v_proj.weight[(h // g) * d : (h // g + 1) * d]  # [d, d_model]
        Wo = attn.o_proj.weight[:, h * d : (h + 1) * d]  # [d_model, d]
        U = (
            hf.lm_head.weight[vocab] * hf.model.norm.weight
        )  # [vocab, d_model]: final norm's gain folded in
        hits, ranks = [], []
        for x, ids, p in zip(inputs, task.clean, task.positions["X"], strict=True):
            logits = U @ (Wo @ (Wv @ x[p]))
            own = logits[(vocab == ids[p]).nonzero()[0, 0]]
            rank = int((logits > own).sum())
            ranks.append(rank)
            hits.append(rank < 20)
        name = f"L{la}H{h}"
        assert got.loc[name, "name_copying"] == pytest.approx(np.mean(hits))
        assert got.loc[name, "median_rank"] == pytest.approx(
            float(torch.tensor(ranks, dtype=torch.float64).median())
        )


def test_the_published_heads():
    t = wang_table()
    assert len(t) == len(WANG_GPT2_SMALL) and "L9H9" in t.loc[0, "GPT-2 small heads"]
