"""Copying scores: closed-form synthetic cases, the weights read from real checkpoints, and
SmolLM2."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import headscope
from headscope.circuits.copying import COPYING, COPYING_K, copying_scores
from headscope.errors import HeadscopeError
from lib import copying
from lib.copying import (
    HeadWeights,
    eigen_copying_scores,
    expand_kv_heads,
    induction_copying_heads,
    ov_copying,
    ov_copying_score,
    own_token_ranks,
)


def _orthonormal(n: int, d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, d, generator=g, dtype=torch.float64))
    return q  # [n, d], orthonormal columns


# ------------------------------------------------------------------------------ eigenvalue score


def test_eigen_score_is_plus_one_for_a_pure_copier_and_minus_one_for_a_suppressor():
    E = _orthonormal(40, 8)  # 40 tokens in an 8-dim residual stream
    P = _orthonormal(8, 3, seed=1)  # the head reads and writes a 3-dim subspace
    # M = E P P^T E^T is positive semi-definite: every non-zero eigenvalue is positive
    assert ov_copying_score(E, P, P.T, E.T) == pytest.approx(1.0)
    assert ov_copying_score(E, P, -P.T, E.T) == pytest.approx(-1.0)


def test_eigen_score_is_zero_for_a_rotation():
    E = _orthonormal(40, 8)
    P = _orthonormal(8, 2, seed=2)
    J = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)  # 90 degrees: eigenvalues +-i
    assert ov_copying_score(E, P, J @ P.T, E.T) == pytest.approx(0.0, abs=1e-12)


def test_small_matrix_gives_the_eigenvalues_of_the_full_vocab_matrix():
    g = torch.Generator().manual_seed(3)
    E, V, Wo, U = (
        torch.randn(*s, generator=g, dtype=torch.float64)
        for s in ((30, 6), (6, 4), (4, 6), (6, 30))
    )
    lam = torch.linalg.eigvals(E @ V @ Wo @ U)  # [30, 30]: rank 4, 26 zero eigenvalues
    expected = float(lam.real.sum() / lam.abs().sum())
    assert ov_copying_score(E, V, Wo, U) == pytest.approx(expected, rel=1e-9)


def _weights(n_layers=2, n_heads=2, n_vocab=12, d=6, d_head=3, seed=0, centre=False) -> HeadWeights:
    g = torch.Generator().manual_seed(seed)
    return HeadWeights(
        model="synthetic",
        token_ids=torch.arange(n_vocab),
        embed=torch.randn(n_vocab, d, generator=g),
        W_V=torch.randn(n_layers, n_heads, d, d_head, generator=g),
        W_O=torch.randn(n_layers, n_heads, d_head, d, generator=g),
        ln1=torch.rand(n_layers, d, generator=g) + 0.5,
        unembed=torch.randn(d, n_vocab, generator=g),
        centre=centre,
    )


def _normed(w: HeadWeights, layer: int) -> torch.Tensor:
    e = w.embed.double()
    if w.centre:
        e = e - e.mean(-1, keepdim=True)
    return e / torch.sqrt(e.pow(2).mean(-1, keepdim=True) + w.eps) * w.ln1[layer].double()


@pytest.mark.parametrize("centre", [False, True])
def test_eigen_copying_scores_use_the_normed_embeddings_of_each_layer(centre):
    w = _weights(centre=centre)
    table = eigen_copying_scores(w)
    assert list(table["head_name"]) == ["L0H0", "L0H1", "L1H0", "L1H1"]
    for row in table.itertuples():
        full = (
            _normed(w, row.layer)
            @ w.W_V[row.layer, row.head].double()
            @ w.W_O[row.layer, row.head].double()
            @ w.unembed.double()
        )  # [vocab, vocab]
        lam = torch.linalg.eigvals(full)
        assert row.eigen_copying == pytest.approx(float(lam.real.sum() / lam.abs().sum()), rel=1e-6)


# ------------------------------------------------------------------------------ own-token ranks


def test_own_token_ranks_of_a_copier_and_a_suppressor():
    n = 7
    x = torch.eye(n)  # input i holds token i
    cols = torch.arange(n)
    eye = torch.eye(n)
    assert own_token_ranks(x, cols, eye, eye, eye).tolist() == [0] * n
    assert own_token_ranks(x, cols, eye, -eye, eye).tolist() == [n - 1] * n
    # a head that always writes token 0: token 0 ranks first, every other token is beaten once
    to_zero = torch.zeros(n, n)
    to_zero[:, 0] = 1.0
    ranks = own_token_ranks(x, cols, eye, to_zero, eye)  # ties do not count as beating
    assert ranks[0] == 0 and (ranks[1:] == 1).all()


def test_own_token_ranks_are_the_same_in_chunks():
    g = torch.Generator().manual_seed(4)
    x, V, Wo, U = (
        torch.randn(50, 8, generator=g),
        torch.randn(8, 4, generator=g),
        torch.randn(4, 8, generator=g),
        torch.randn(8, 20, generator=g),
    )
    cols = torch.randint(0, 20, (50,), generator=g)
    ranks = own_token_ranks(x, cols, V, Wo, U, chunk=7)  # 50 inputs: W_O is folded into U first
    assert torch.equal(ranks, own_token_ranks(x, cols, V, Wo, U, chunk=1000))
    logits = x.double() @ V.double() @ Wo.double() @ U.double()  # [50, 20], the plain way
    assert torch.equal(ranks, (logits > logits.gather(1, cols[:, None])).sum(1))
    # 2 inputs: not folded
    assert torch.equal(own_token_ranks(x[:2], cols[:2], V, Wo, U), ranks[:2])


def test_columns_refuse_special_tokens():
    w = HeadWeights(
        model="m",
        token_ids=torch.tensor([2, 3, 5]),
        embed=torch.zeros(3, 2),
        W_V=torch.zeros(1, 1, 2, 1),
        W_O=torch.zeros(1, 1, 1, 2),
        ln1=torch.ones(1, 2),
        unembed=torch.zeros(2, 3),
    )
    assert w.columns(torch.tensor([5, 2])).tolist() == [2, 0]
    with pytest.raises(HeadscopeError, match="not ordinary"):
        w.columns(torch.tensor([4]))


def test_expand_kv_heads_follows_repeat_kv():
    w = torch.arange(6.0).view(2, 3)  # [layer, kv_head]
    assert expand_kv_heads(w, 9)[1].tolist() == [3, 3, 3, 4, 4, 4, 5, 5, 5]
    with pytest.raises(HeadscopeError):
        expand_kv_heads(w, 8)


def test_induction_copying_heads_needs_both_halves():
    scores = pd.DataFrame(
        {"metric": "induction", "layer": [0, 0, 1], "head": [0, 1, 0], "score": [0.9, 0.2, 0.6]}
    )
    cop = pd.DataFrame(
        {
            "model": "m",
            "layer": [0, 0, 1],
            "head": [0, 1, 0],
            "head_name": ["L0H0", "L0H1", "L1H0"],
            "copying": [0.1, 0.9, 0.7],
        }
    )
    out = induction_copying_heads(scores, cop)
    assert out.loc[out["induction_head"], "head_name"].tolist() == ["L1H0"]
    assert out["head_name"].tolist()[0] == "L1H0"
    assert out.set_index("head_name").loc["L0H0", "prefix_matching"]
    assert not out.set_index("head_name").loc["L0H0", "copies"]
    assert "null" not in out.columns
    with_null = induction_copying_heads(scores, cop.assign(null=[0.0, 0.05, 0.1]))
    # the control travels with its head
    assert with_null.set_index("head_name").loc["L0H1", "null"] == 0.05
    spread = induction_copying_heads(scores, cop.assign(ci_low=[0.0, 0.8, 0.6], ci_high=0.95))
    row = spread.set_index("head_name").loc["L1H0"]  # the interval travels with its head too
    assert (row["copying_low"], row["copying_high"]) == (0.6, 0.95) and "ci_low" not in spread
    with pytest.raises(HeadscopeError, match="no 'induction' rows"):
        induction_copying_heads(scores.assign(metric="sink"), cop)


# ------------------------------------------------------------------------------ a real checkpoint


def test_head_weights_of_tiny_gpt2_match_the_checkpoint(tiny_gpt2):
    w = copying.head_weights(tiny_gpt2)
    hf = tiny_gpt2.bridge.original_model
    d = hf.config.n_embd
    dh = d // hf.config.n_head
    attn = hf.transformer.h[1].attn
    W_v = attn.c_attn.weight[:, 2 * d : 3 * d]  # Conv1D: [d_model, 3 d_model], q|k|v
    torch.testing.assert_close(w.W_V[1, 2], W_v[:, 2 * dh : 3 * dh])
    torch.testing.assert_close(w.W_O[1, 2], attn.c_proj.weight[2 * dh : 3 * dh, :])
    torch.testing.assert_close(w.ln1[1], hf.transformer.h[1].ln_1.weight)
    gamma = hf.transformer.ln_f.weight
    torch.testing.assert_close(w.unembed, gamma[:, None] * hf.lm_head.weight.T[:, w.token_ids])
    assert w.centre  # GPT-2 uses LayerNorm
    assert tiny_gpt2.bos_id not in set(w.token_ids.tolist())


def test_attention_inputs_are_the_normed_residual_stream(tiny_gpt2):
    hf = tiny_gpt2.bridge.original_model
    tokens = torch.tensor([tiny_gpt2.wrap(tiny_gpt2.encode("The cat sat on the mat."))])
    got = copying.attention_inputs(tiny_gpt2, tokens, [0, 1])
    with torch.no_grad():
        hidden = hf(tokens, output_hidden_states=True).hidden_states  # residual before each block
        for layer in (0, 1):
            torch.testing.assert_close(
                got[layer], hf.transformer.h[layer].ln_1(hidden[layer]), atol=1e-5, rtol=1e-5
            )


def test_ov_copying_runs_on_a_repeat_probe(tiny_gpt2):
    probe = headscope.repeat_probe(tiny_gpt2, repeat_len=6, n_sequences=3, seed=0)
    table = copying.ov_copying(tiny_gpt2, probe, heads=[(0, 1), (1, 3)], k=5)
    assert table["head_name"].tolist() == ["L0H1", "L1H3"]
    assert (table["n"] == 18).all()
    assert table["copying"].between(0, 1).all()
    assert (table["chance"] == 5 / len(tiny_gpt2.ordinary_vocab())).all()


def test_encoders_are_refused(tiny_bert):
    with pytest.raises(HeadscopeError, match="encoder"):
        copying.head_weights(tiny_bert)


@pytest.mark.real
def test_smollm2_weights_follow_grouped_query_attention(smollm2):
    w = copying.head_weights(smollm2)
    v_proj = smollm2.bridge.original_model.model.layers[18].self_attn.v_proj.weight  # [3 * 64, 576]
    for head in (0, 4, 8):
        kv = head // 3
        torch.testing.assert_close(w.W_V[18, head], v_proj[kv * 64 : (kv + 1) * 64].T)
    assert not w.centre  # RMSNorm


@pytest.mark.real
def test_smollm2_l23h2_copies_and_l18h6_does_not(smollm2):
    probe = headscope.repeat_probe(smollm2, repeat_len=50, n_sequences=2, seed=0)
    table = copying.ov_copying(smollm2, probe, heads=[(23, 2), (18, 6)]).set_index("head_name")
    assert table.loc["L23H2", "copying"] > 0.4
    assert table.loc["L18H6", "copying"] < 0.1


# ------------------------------------------------------------------------------ on real inputs


def test_copying_scores_are_ov_copying_for_every_head(tiny_gpt2):
    probe = headscope.default_probes(tiny_gpt2, n_prompts=5, repeat_len=6)[1]
    got = copying_scores(tiny_gpt2, probe, max_sequences=3)
    table = ov_copying(tiny_gpt2, headscope.repeat_probe(tiny_gpt2, 6, n_sequences=5), k=COPYING_K)
    assert got.metric is COPYING and got.count == 3 * 6
    first3 = ov_copying(
        tiny_gpt2, type(probe)(probe.name, probe.sequences[:3], probe.repeat_len), k=COPYING_K
    )
    want = torch.tensor(
        first3.pivot(index="layer", columns="head", values="copying").to_numpy(),
        dtype=torch.float64,
    )
    torch.testing.assert_close(got.score, want)
    want_null = torch.tensor(
        first3.pivot(index="layer", columns="head", values="null").to_numpy(), dtype=torch.float64
    )
    torch.testing.assert_close(got.null, want_null)
    assert got.chance == COPYING_K / (len(tiny_gpt2.ordinary_vocab())) and len(table) == 8


def test_ov_copying_intervals_resample_sequences(tiny_gpt2):
    """The interval is the bootstrap of the per-sequence hits (copying_scores keeps them), it
    holds the score, and it collapses where every sequence agrees."""
    from headscope.uncertainty import bootstrap

    probe = headscope.repeat_probe(tiny_gpt2, 6, n_sequences=5)
    table = ov_copying(tiny_gpt2, probe, k=COPYING_K, resamples=300, seed=4)
    per_seq = copying_scores(tiny_gpt2, probe, max_sequences=5)
    want = bootstrap(per_seq.seq_total, per_seq.seq_count, None, 300, 0.95, 4)
    grid = {c: table.pivot(index="layer", columns="head", values=c).to_numpy() for c in table}
    np.testing.assert_allclose(grid["ci_low"], want.ci_low.numpy())
    np.testing.assert_allclose(grid["ci_high"], want.ci_high.numpy())
    assert (table.ci_low <= table.copying).all() and (table.copying <= table.ci_high).all()
    assert (table.ci_high > table.ci_low).any()  # sequences differ: some interval has width
    every = ov_copying(tiny_gpt2, probe, k=len(tiny_gpt2.ordinary_vocab()), resamples=300)
    assert (every.copying == 1).all() and (every.ci_low == 1).all() and (every.ci_high == 1).all()
    assert ov_copying(tiny_gpt2, probe, k=COPYING_K, resamples=0)["ci_low"].isna().all()
