"""Composition scores (Elhage et al. 2021): against an independent oracle that builds the full
d_model x d_model matrices from the Hugging Face weights (no headscope code), against closed forms
on hand-built weights, and the null's calibration on a randomly initialised model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope
from headscope.circuits.composition import (
    COLUMNS,
    KINDS,
    composition,
    composition_scores,
)
from headscope.errors import HeadscopeError

# ------------------------------------------------------------------------------ the oracle


def _oracle_matrices(hf, kind: str, fold: bool = True):
    """Per layer, per query head: (W_QK, W_OV), full d_model x d_model float64 matrices read
    straight from the HF modules, with the foldings documented in headscope.circuits.composition:
    pre-attention norm gain (+ LayerNorm centring) on the input side of W_Q/W_K/W_V, Gemma's 1 + w,
    Gemma 3's post-attention norm gain on W_O's output side, q_norm/k_norm gains on W_Q/W_K.
    ``fold=False`` leaves every norm out (to show the test can fail)."""
    cfg = hf.config
    out = []
    if kind == "gpt2":
        d = cfg.n_embd
        H = cfg.n_head
        dh = d // H
        eye = torch.eye(d, dtype=torch.float64)
        centre = eye - torch.ones(d, d, dtype=torch.float64) / d
        for blk in hf.transformer.h:
            W = blk.attn.c_attn.weight.detach().double()  # [d_model (in), 3 d_model (out)]
            P = blk.attn.c_proj.weight.detach().double()  # [H dh (in), d_model (out)]
            inp = torch.diag(blk.ln_1.weight.detach().double()) @ centre if fold else eye
            heads = []
            for h in range(H):
                Wq = W[:, h * dh : (h + 1) * dh].T @ inp  # [dh, d_model]
                Wk = W[:, d + h * dh : d + (h + 1) * dh].T @ inp
                Wv = W[:, 2 * d + h * dh : 2 * d + (h + 1) * dh].T @ inp
                Wo = P[h * dh : (h + 1) * dh, :].T  # [d_model, dh]
                heads.append((Wq.T @ Wk, Wo @ Wv))
            out.append(heads)
        return out
    if kind == "neox":  # fused query_key_value: output rows h * 3 dh + (0: q, dh: k, 2 dh: v)
        d, H = cfg.hidden_size, cfg.num_attention_heads
        dh = d // H
        eye = torch.eye(d, dtype=torch.float64)
        centre = eye - torch.ones(d, d, dtype=torch.float64) / d
        for blk in hf.gpt_neox.layers:
            W = blk.attention.query_key_value.weight.detach().double()  # [3 d_model, d_model]
            P = blk.attention.dense.weight.detach().double()  # [d_model, H dh]
            inp = torch.diag(blk.input_layernorm.weight.detach().double()) @ centre if fold else eye
            heads = []
            for h in range(H):
                row = 3 * dh * h
                Wq = W[row : row + dh] @ inp
                Wk = W[row + dh : row + 2 * dh] @ inp
                Wv = W[row + 2 * dh : row + 3 * dh] @ inp
                Wo = P[:, h * dh : (h + 1) * dh]
                heads.append((Wq.T @ Wk, Wo @ Wv))
            out.append(heads)
        return out
    gemma = kind == "gemma3"
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    for blk in hf.model.layers:
        att = blk.self_attn

        def g(norm):
            w = norm.weight.detach().double()
            return (1.0 + w) if gemma else w

        d = cfg.hidden_size
        eye = torch.eye(d, dtype=torch.float64)
        inp = torch.diag(g(blk.input_layernorm)) if fold else eye
        outp = torch.diag(g(blk.post_attention_layernorm)) if (gemma and fold) else eye
        qn = torch.diag(g(att.q_norm)) if (gemma and fold) else torch.eye(dh, dtype=torch.float64)
        kn = torch.diag(g(att.k_norm)) if (gemma and fold) else torch.eye(dh, dtype=torch.float64)
        Wq_all = att.q_proj.weight.detach().double()  # [H dh, d_model]
        Wk_all = att.k_proj.weight.detach().double()  # [KV dh, d_model]
        Wv_all = att.v_proj.weight.detach().double()
        Wo_all = att.o_proj.weight.detach().double()  # [d_model, H dh]
        heads = []
        for h in range(H):
            j = h // (H // KV)
            Wq = qn @ Wq_all[h * dh : (h + 1) * dh] @ inp
            Wk = kn @ Wk_all[j * dh : (j + 1) * dh] @ inp
            Wv = Wv_all[j * dh : (j + 1) * dh] @ inp
            Wo = outp @ Wo_all[:, h * dh : (h + 1) * dh]
            heads.append((Wq.T @ Wk, Wo @ Wv))
        out.append(heads)
    return out


def _oracle_score(mats, kind, lr, hr, ls, hs) -> float:
    fro = torch.linalg.matrix_norm
    qk, ov_r = mats[lr][hr]
    _, ov_s = mats[ls][hs]
    if kind == "q":
        a, m = qk.T @ ov_s, qk
    elif kind == "k":
        a, m = qk @ ov_s, qk
    else:
        a, m = ov_r @ ov_s, ov_r
    return float(fro(a) / (fro(m) * fro(ov_s)))


def _check_against_oracle(model, family, pairs=None, atol=1e-5):
    got = composition_scores(model)  # [kind, lr, hr, ls, hs]
    mats = _oracle_matrices(model.hf, family)
    L, H = model.n_layers, model.n_heads
    if pairs is None:
        pairs = [
            (lr, hr, ls, hs)
            for lr in range(L)
            for hr in range(H)
            for ls in range(lr)
            for hs in range(H)
        ]
    worst = 0.0
    for ki, kind in enumerate(KINDS):
        for lr, hr, ls, hs in pairs:
            want = _oracle_score(mats, kind, lr, hr, ls, hs)
            worst = max(worst, abs(float(got[ki, lr, hr, ls, hs]) - want))
    assert worst < atol, worst
    # NaN exactly where the sender is not earlier
    for lr in range(L):
        for ls in range(L):
            block = got[:, lr, :, ls, :]
            assert bool(block.isnan().all()) == (ls >= lr)
    return mats, got


def _randomise_norms(hf, low, high, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.copy_(torch.rand(p.shape, generator=g) * (high - low) + low)


@pytest.fixture(scope="module")
def gpt2_norms():
    """A random 3-layer GPT-2 (LayerNorm, fused c_attn) with its norm weights away from 1."""
    from tests.tiny_models import tiny_gpt2_in_memory

    hf, tok = tiny_gpt2_in_memory(n_layer=3)
    _randomise_norms(hf, 0.1, 2.1)
    return headscope.load_model(hf, tok, name="tiny-gpt2-norms")


def test_gpt2_matches_oracle(gpt2_norms):
    mats, got = _check_against_oracle(gpt2_norms, "gpt2")
    # the folds matter here: the oracle without them disagrees (so this test can fail)
    bare = _oracle_matrices(gpt2_norms.hf, "gpt2", fold=False)
    assert abs(_oracle_score(bare, "k", 2, 0, 0, 1) - float(got[1, 2, 0, 0, 1])) > 1e-3


def test_gpt_neox_matches_oracle(tmp_path):
    """Notebook 07's attention-only GPT-NeoX (rotary, q/k/v fused head by head), 3 layers, its
    LayerNorm gains away from 1."""
    from tests.tiny_models import tiny_attention_only_neox

    hf, tok = tiny_attention_only_neox(n_layer=3)
    _randomise_norms(hf, 0.1, 2.1)
    model = headscope.load_model(hf, tok, name="tiny-neox")
    _, got = _check_against_oracle(model, "neox")
    bare = _oracle_matrices(model.hf, "neox", fold=False)
    assert abs(_oracle_score(bare, "k", 2, 1, 0, 3) - float(got[1, 2, 1, 0, 3])) > 1e-3


def test_gqa_llama_matches_oracle(tiny_gqa_llama):
    _check_against_oracle(tiny_gqa_llama, "llama")


def test_gqa_llama_with_norms_matches_oracle(tiny_llama):
    """tests/circuits/conftest.py's Llama: 4 query heads on 2 KV heads, norm gains in 0.1-2.1."""
    _, got = _check_against_oracle(tiny_llama, "llama")
    bare = _oracle_matrices(tiny_llama.hf, "llama", fold=False)
    assert abs(_oracle_score(bare, "v", 1, 3, 0, 0) - float(got[2, 1, 3, 0, 0])) > 1e-3


def test_gemma3_matches_oracle(tiny_gemma3_dir):
    _check_against_oracle(headscope.load_model(str(tiny_gemma3_dir)), "gemma3")


def test_gemma3_with_norms_matches_oracle(tiny_gemma3_sharp):
    """Every Gemma norm (input, post-attention, q_norm, k_norm) randomised: 1 + w with w in
    -0.9-1.1, so forgetting the 1 + or any fold shows."""
    _, model = tiny_gemma3_sharp
    _, got = _check_against_oracle(model, "gemma3")
    bare = _oracle_matrices(model.hf, "gemma3", fold=False)
    assert abs(_oracle_score(bare, "q", 1, 2, 0, 0) - float(got[0, 1, 2, 0, 0])) > 1e-3


# ------------------------------------------------------------------------------ closed forms


def _hand_llama(sender_writes: str, rank_one: bool = False):
    """A 2-layer Llama, d_model 8, 2 query heads of d_head 4 on 1 KV head, norms 1, weights set by
    hand. Let a = dims 0-3, b = dims 4-7 (E_a, E_b their coordinate embeddings). Sender L0H0
    reads a and writes ``sender_writes`` ("b" or "a"): W_OV = E_w E_a^T. Receiver L1H0: W_K
    reads b, W_Q reads a, W_V reads a, so W_QK = E_a E_b^T. K-composition is
    ``||E_a E_b^T E_w E_a^T|| / (||E_a E_b^T|| ||E_w E_a^T||)``: 4^0.5 / 4 = 1/2 when w = b,
    0 when w = a. With ``rank_one`` every projection keeps only its first row: 1 and 0."""
    from tests.tiny_models import tiny_llama

    hf, tok = tiny_llama(n_head=2, n_kv_head=1, hidden=8, intermediate=16, n_ctx=32, head_dim=4)
    eye = torch.eye(8)
    Ea, Eb = eye[:, :4], eye[:, 4:]  # [d_model, 4]
    keep = torch.diag(torch.tensor([1.0, 0, 0, 0])) if rank_one else torch.eye(4)
    with torch.no_grad():
        for layer in hf.model.layers:
            att = layer.self_attn
            for p in (att.q_proj.weight, att.k_proj.weight, att.v_proj.weight, att.o_proj.weight):
                p.zero_()
        s = hf.model.layers[0].self_attn
        s.v_proj.weight[:] = keep @ Ea.T  # W_V [d_head, d_model]: reads a
        w = Eb if sender_writes == "b" else Ea
        s.o_proj.weight[:, :4] = w @ keep  # W_O of head 0 [d_model, d_head]
        s.o_proj.weight[:, 4:] = Ea  # head 1 writes a (some other head)
        r = hf.model.layers[1].self_attn
        r.q_proj.weight[:4] = keep @ Ea.T  # receiver head 0: query reads a
        r.q_proj.weight[4:] = Eb.T  # head 1: query reads b
        r.k_proj.weight[:] = keep @ Eb.T  # the one KV head: key reads b
        r.v_proj.weight[:] = Ea.T
        r.o_proj.weight[:, :4] = Eb
        r.o_proj.weight[:, 4:] = Eb
        s.q_proj.weight[:] = torch.randn(8, 8)
        s.k_proj.weight[:] = torch.randn(4, 8)
    return headscope.load_model(hf, tok, name=f"hand-llama-{sender_writes}")


@pytest.mark.parametrize("rank_one", [False, True])
def test_closed_form_key_subspace(rank_one):
    got = composition_scores(_hand_llama("b", rank_one))  # [kind, lr, hr, ls, hs]
    q, k, v = got[:, 1, 0, 0, 0].tolist()
    assert k == pytest.approx(1.0 if rank_one else 0.5, abs=1e-12)
    assert q == pytest.approx(0.0, abs=1e-7)  # W_QK^T W_OV = E_b E_a^T E_b E_a^T = 0
    assert v == pytest.approx(0.0, abs=1e-7)  # receiver's W_V reads a, the sender writes b


def test_closed_form_orthogonal():
    got = composition_scores(_hand_llama("a"))
    q, k, v = got[:, 1, 0, 0, 0].tolist()
    assert k == pytest.approx(0.0, abs=1e-7)  # writes a, the key reads b
    assert q == pytest.approx(0.5, abs=1e-12)  # the query reads a: ||E_b E_a^T E_a E_a^T|| / 4
    # V: W_OV^r = E_b E_a^T, so ||E_b E_a^T E_a E_a^T|| / (2 * 2) = 1/2
    assert v == pytest.approx(0.5, abs=1e-12)


# ------------------------------------------------------------------------------ the table, inputs


def test_table_rows_and_columns(tiny_gqa_llama):
    df = composition(tiny_gqa_llama, n_null=8)
    L, H = tiny_gqa_llama.n_layers, tiny_gqa_llama.n_heads
    assert list(df.columns) == COLUMNS
    assert len(df) == 3 * H * H * L * (L - 1) // 2
    assert (df.sender_layer < df.receiver_layer).all()
    assert set(df.kind) == set(KINDS)
    raw = composition_scores(tiny_gqa_llama)
    row = df[(df.kind == "v") & (df.sender == "L0H1") & (df.receiver == "L2H3")].iloc[0]
    assert row.score == pytest.approx(float(raw[2, 2, 3, 0, 1]), abs=1e-15)
    assert row.z == pytest.approx((row.score - row.null_mean) / row.null_sd)
    assert 0 <= row.percentile <= 1 and row.n_null == 8
    # senders of one layer share the null draws; the null is seeded and reproducible
    same = df[(df.kind == "k") & (df.receiver == "L2H0") & (df.sender_layer == 1)]
    assert same.null_mean.nunique() == 1
    again = composition(tiny_gqa_llama, n_null=8)
    assert np.array_equal(df.null_sd.to_numpy(), again.null_sd.to_numpy())
    other = composition(tiny_gqa_llama, n_null=8, seed=1)
    assert not np.array_equal(df.null_sd.to_numpy(), other.null_sd.to_numpy())


def test_named_pairs_and_chunks_agree_with_the_whole_table(tiny_gqa_llama):
    full = composition(tiny_gqa_llama, kinds="k", n_null=8)
    some = composition(
        tiny_gqa_llama, kinds=["k"], n_null=8, pairs=[("L0H1", "L2H3"), ((1, 0), (2, 2))]
    )
    assert list(some.sender) == ["L0H1", "L1H0"] and list(some.receiver) == ["L2H3", "L2H2"]
    merged = some.merge(full, on=["sender", "receiver", "kind"], suffixes=("", "_full"))
    for c in ("score", "null_mean", "null_sd", "z", "percentile"):
        assert np.allclose(merged[c], merged[c + "_full"], rtol=0, atol=1e-12)
    tiny = composition(tiny_gqa_llama, kinds="k", n_null=8, max_bytes=1)  # one unit per chunk
    assert np.allclose(tiny.z, full.z, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kinds": ["k", "kk"]}, "Unknown composition kind 'kk'; use q, k or v. Did you mean: k?"),
        ({"pairs": [("L2H0", "L1H0")]}, "Receiver L1H0 is not after sender L2H0"),
        ({"pairs": [("L1H0", "L1H3")]}, "a receiver must sit in a later layer"),
        ({"pairs": [("L0H9", "L1H0")]}, "No head L0H9: layers 0-2, heads 0-3."),
        ({"pairs": [("layer0", "L1H0")]}, "name a head as L{layer}H{head}"),
        ({"n_null": 1}, "n_null must be an integer of at least 2"),
    ],
)
def test_bad_input_is_one_line(tiny_gqa_llama, kwargs, message):
    with pytest.raises(HeadscopeError) as err:
        composition(tiny_gqa_llama, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_encoder_refused(tiny_bert):
    with pytest.raises(HeadscopeError, match="is an encoder"):
        composition_scores(tiny_bert)


# ------------------------------------------------------------------------------ the null


def test_null_is_calibrated_on_a_random_model(capsys):
    """A randomly initialised Llama (std init, norms 1): its heads are random senders, so their
    scores come from the null's own distribution and |z| > 2 should be rare (~5%; with 32 draws z
    is t-like, P(|t_31| > 2) = 5.4%). A null that is too narrow (e.g. the wrong folds, a shape
    mix-up) pushes the share far up; one that is too wide pushes it to 0."""
    from tests.tiny_models import tiny_llama

    hf, tok = tiny_llama(n_layer=6, n_head=8, n_kv_head=4, hidden=64, intermediate=128, n_ctx=32)
    model = headscope.load_model(hf, tok, name="random-llama")
    df = composition(model)
    share = (df.z.abs() > 2).groupby(df.kind).mean()
    with capsys.disabled():
        print(f"\nrandom Llama, share |z| > 2 by kind: {share.round(4).to_dict()}")
    assert ((share > 0.01) & (share < 0.12)).all(), share.to_dict()
    # an isotropic random sender (norms 1) scores about d_model^-1/2 against any receiver:
    # E ||M X||^2 / ||X||^2 = ||M||^2 / d_model for X with isotropic columns
    # (each null mean is a mean of 32 draws of sd ~0.012, so each within 10%, all within 2%)
    assert df.null_mean.to_numpy() == pytest.approx(64**-0.5, rel=0.1)
    assert df.null_mean.mean() == pytest.approx(64**-0.5, rel=0.02)
    # the percentile agrees: about 5% of scores lie outside the null's 2.5-97.5% range
    outside = ((df.percentile <= 1 / 32) | (df.percentile >= 31 / 32)).mean()
    assert outside < 0.15


# ------------------------------------------------------------------------------ the real models


@pytest.mark.real
def test_smollm2_matches_oracle_on_a_subset(smollm2):
    """Receivers in layers 17 and 29, senders in layers 0 and 16, a few heads each (30 x 9 heads,
    3 KV heads; the full d_model x d_model oracle for 36k pairs would take minutes)."""
    pairs = [
        (lr, hr, ls, hs)
        for lr in (17, 29)
        for hr in (0, 4, 8)
        for ls in (0, 16)
        for hs in (0, 5, 7)
    ]
    _check_against_oracle(smollm2, "llama", pairs=pairs)


@pytest.mark.real
def test_gemma3_matches_oracle_on_a_subset(gemma3):
    """Gemma 3 270M (18 x 4 heads, 1 KV head; every fold: 1 + w gains, sandwich norm, q/k norm)."""
    pairs = [(lr, hr, ls, hs) for lr in (6, 17) for hr in (0, 3) for ls in (0, 5) for hs in (1, 2)]
    _check_against_oracle(gemma3, "gemma3", pairs=pairs)


@pytest.mark.real
def test_smollm2_null_sits_at_its_closed_form_and_the_share_beyond_two(smollm2, capsys):
    """Every pair, the default 32 null draws (~25 s on one thread): the null's median mean is the
    isotropic closed form ``d_model ** -0.5`` (SmolLM2's norm gains are near 1, so its folds barely
    tilt the random senders); the share of pairs beyond 2 null sd, by kind, is printed."""
    df = composition(smollm2)
    above = (df.z > 2).groupby(df.kind).mean()
    beyond = (df.z.abs() > 2).groupby(df.kind).mean()
    with capsys.disabled():
        print(
            f"\nsmollm2, all {len(df) // 3} pairs: share z > 2 {above.round(3).to_dict()}, "
            f"|z| > 2 {beyond.round(3).to_dict()}"
        )
    assert len(df) == 3 * 9 * 9 * 30 * 29 // 2
    for kind, sub in df.groupby("kind"):
        assert abs(sub["null_mean"].median() - 576**-0.5) < 0.05 * 576**-0.5, kind
