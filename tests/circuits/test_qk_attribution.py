"""QK attribution (headscope.circuits.qk_attribution): the table adds up to the model's own logit
on every family it reads, and an oracle written from the transformers weights with plain forward
hooks (no headscope code) gives the same contributions."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.circuits import qk_attribution as qa
from headscope.errors import HeadscopeError


def _ids(model, rows=3, n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 90, (rows, n), generator=g)
    if model.bos_id is not None:
        ids[:, 0] = model.bos_id
    ids[:, n // 2 + 1 :] = ids[:, 1 : n - n // 2]  # a repeat: induction targets exist
    return ids


def _every_head_sums_to_its_logit(model, query="all", key="argmax", tol=1e-5):
    rec = qa.record(model, _ids(model))
    worst = 0.0
    for la in range(model.n_layers):
        for h in range(model.n_heads):
            inst = qa.instances(rec, la, h, query, key)
            c = qa.table(rec, la, h, inst.rows, inst.query, inst.key)
            logit = rec.logits(la)[inst.rows, h, inst.query, inst.key]
            worst = max(worst, float((c.sum((1, 2)) - logit).abs().max()))
            assert c.shape[1] == c.shape[2] == len(rec.components(la))
    assert worst < tol
    return rec


@pytest.fixture(scope="module")
def tiny_gemma3(tiny_gemma3_dir):
    return headscope.load_model(str(tiny_gemma3_dir))


def test_the_table_adds_up_to_the_logit_gpt2(tiny_gpt2):
    """LayerNorm (its centring and bias), learned positions, fused q/k/v, biases."""
    rec = _every_head_sums_to_its_logit(tiny_gpt2)
    # the stream's constants are GPT-2's attention output biases of the layers before
    la = 1
    const = rec.streams[la] - rec.writers[:, :, : rec.graph.writers_before_attn(la)].sum(2)
    bias = tiny_gpt2.hf.transformer.h[0].attn.c_proj.bias.detach()
    torch.testing.assert_close(const, bias.expand_as(const), atol=1e-5, rtol=0)


def test_the_table_adds_up_to_the_logit_gqa_llama(tiny_gqa_llama):
    """RMSNorm, rotary, 4 query heads on 2 KV heads; induction keys too."""
    _every_head_sums_to_its_logit(tiny_gqa_llama)
    _every_head_sums_to_its_logit(tiny_gqa_llama, "all", "induction")


def test_the_table_adds_up_to_the_logit_gemma3(tiny_gemma3):
    """Gemma 3's q/k norms frozen, (1 + w) gains, a sliding-window layer, the attention output
    normalised before the residual add."""
    rec = _every_head_sums_to_its_logit(tiny_gemma3)
    # layer 0's window of 4: the last query cannot see position 0 there, and says so
    with pytest.raises(HeadscopeError, match="cannot see key 0"):
        qa.instances(rec, 0, 0, "last", "sink")
    inst = qa.instances(rec, 1, 0, "last", "sink")  # the global layer can
    assert (inst.key == 0).all()


def test_the_table_adds_up_to_the_logit_smollm2(smollm2):
    rec = qa.record(smollm2, _ids(smollm2, rows=2, n=16))
    for la, h in ((0, 0), (14, 3), (29, 8)):
        inst = qa.instances(rec, la, h, "all", "argmax")
        c = qa.table(rec, la, h, inst.rows, inst.query, inst.key)
        logit = rec.logits(la)[inst.rows, h, inst.query, inst.key]
        assert float((c.sum((1, 2)) - logit).abs().max()) < 1e-5


def _oracle_llama(model, ids, la, h, i, j, a, b):
    """c_ab by hand: components by plain hooks on the transformers modules, the norm frozen at
    the stream's RMS, rotary from the config's theta, q . k / sqrt(d_head)."""
    hf = model.hf
    cfg = hf.config
    dh = cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    seen = {}

    def embed(m, args, kw):
        seen["embed"] = (args[0] if args else kw["hidden_states"]).detach()

    hooks = [hf.model.layers[0].register_forward_pre_hook(embed, with_kwargs=True)]
    for n, layer in enumerate(hf.model.layers):
        hooks.append(layer.input_layernorm.register_forward_pre_hook(
            lambda m, a_, n=n: seen.__setitem__(("x", n), a_[0].detach())))  # fmt: skip
        hooks.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, a_, n=n: seen.__setitem__(("z", n), a_[0].detach())))  # fmt: skip
        hooks.append(layer.mlp.register_forward_hook(
            lambda m, a_, o, n=n: seen.__setitem__(("mlp", n), o.detach())))  # fmt: skip
    with torch.no_grad():
        hf(input_ids=ids)
    for hk in hooks:
        hk.remove()

    def component(name, row, pos):
        if name == "embed":
            return seen["embed"][row, pos]
        if name.startswith("MLP"):
            return seen[("mlp", int(name[3:]))][row, pos]
        lay, head = (int(x) for x in name[1:].split("H"))
        w = hf.model.layers[lay].self_attn.o_proj.weight  # [d, H * dh]
        z = seen[("z", lay)][row, pos, head * dh : (head + 1) * dh]
        return w[:, head * dh : (head + 1) * dh] @ z

    attn = hf.model.layers[la].self_attn
    norm = hf.model.layers[la].input_layernorm
    theta = getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]
    inv = 1.0 / theta ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)

    def rot(v, pos):
        ang = pos * inv
        cos, sin = torch.cat([ang.cos(), ang.cos()]), torch.cat([ang.sin(), ang.sin()])
        half = torch.cat([-v[dh // 2 :], v[: dh // 2]])
        return v * cos + half * sin

    def part(name, pos, proj, slot):
        x = seen[("x", la)][0, pos].double()
        s = torch.rsqrt(x.pow(2).mean() + norm.variance_epsilon)
        y = component(name, 0, pos).double() * s * norm.weight.double()
        w = proj.weight.double()[slot * dh : (slot + 1) * dh]
        return rot(w @ y, pos)

    q = part(a, i, attn.q_proj, h)
    k = part(b, j, attn.k_proj, h // group)
    return float(q @ k) / dh**0.5


@pytest.mark.parametrize("la,h,i,j,a,b", [
    (1, 0, 7, 2, "embed", "embed"),
    (2, 3, 10, 4, "L1H2", "L0H1"),
    (2, 1, 11, 3, "MLP1", "L1H3"),
])  # fmt: skip
def test_contributions_equal_a_hand_written_oracle(tiny_gqa_llama, la, h, i, j, a, b):
    model = tiny_gqa_llama
    ids = _ids(model, rows=1, n=12)
    rec = qa.record(model, ids)
    names = rec.components(la)
    c = qa.table(rec, la, h, torch.tensor([0]), torch.tensor([i]), torch.tensor([j]))[0]
    want = _oracle_llama(model, ids, la, h, i, j, a, b)
    assert abs(float(c[names.index(a), names.index(b)]) - want) < 1e-5
    assert abs(want) > 1e-4  # a pair that carries something


def test_knockouts_exact_and_first_order_agree_for_a_small_component(tiny_gqa_llama):
    """Knocking out a component is exact (the norm recomputed); for a component small against
    the stream it agrees with the first-order change; bias is not a stream component."""
    model = tiny_gqa_llama
    rec = qa.record(model, _ids(model, rows=2, n=12))
    la, h = 2, 1
    inst = qa.instances(rec, la, h, "all", "argmax")
    c = qa.table(rec, la, h, inst.rows, inst.query, inst.key)
    names = rec.components(la)
    small = min(range(len(names) - 1), key=lambda x: float(rec.writers[:, :, x].norm()))
    ko = qa.knockouts(rec, la, h, inst, small, small, c)
    for side in ("q", "k"):
        err = (ko[f"ko_{side}"] - ko[f"fo_{side}"]).abs().max()
        assert err <= 0.2 * ko[f"ko_{side}"].abs().max() + 1e-6
    full = qa.knockouts(rec, la, h, inst, len(names) - 1, len(names) - 1, c)
    assert torch.isnan(full["ko_q"]).all() and torch.isnan(full["fo_k"]).all()


def test_rules_refuse_what_no_prompt_can_have(tiny_gqa_llama):
    rec = qa.record(tiny_gqa_llama, _ids(tiny_gqa_llama, rows=2, n=8))
    with pytest.raises(HeadscopeError, match="comes after its query"):
        qa.instances(rec, 1, 0, 3, 5)
    with pytest.raises(HeadscopeError, match="Unknown key position 'IO'"):
        qa.instances(rec, 1, 0, "last", "IO")
    with pytest.raises(HeadscopeError, match="outside prompts of 8 tokens"):
        qa.instances(rec, 1, 0, 9, "argmax")
    # null keys: never the chosen key nor the head's top key, and visible
    inst = qa.instances(rec, 1, 0, "all", "sink")
    pat = rec.pattern(1)[inst.rows, 0, inst.query]
    ok = inst.null >= 0
    assert (inst.null[ok] != inst.key[ok]).all()
    assert (inst.null[ok] != pat.argmax(-1)[ok]).all()
    assert (inst.null[ok] <= inst.query[ok]).all()
