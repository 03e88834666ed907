"""QK attribution (headscope.circuits.qk_attribution): the table adds up to the model's own logit
on every family it reads, and an oracle written from the transformers weights with plain forward
hooks (no headscope code) gives the same contributions."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.circuits import qk_attribution as qa
from headscope.circuits import qk_rules as rules
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
            inst = rules.instances(rec, la, h, query, key)
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
        rules.instances(rec, 0, 0, "last", "sink")
    inst = rules.instances(rec, 1, 0, "last", "sink")  # the global layer can
    assert (inst.key == 0).all()


def test_the_table_adds_up_to_the_logit_smollm2(smollm2):
    rec = qa.record(smollm2, _ids(smollm2, rows=2, n=16))
    for la, h in ((0, 0), (14, 3), (29, 8)):
        inst = rules.instances(rec, la, h, "all", "argmax")
        c = qa.table(rec, la, h, inst.rows, inst.query, inst.key)
        logit = rec.logits(la)[inst.rows, h, inst.query, inst.key]
        assert float((c.sum((1, 2)) - logit).abs().max()) < 1e-5


def _oracle(model, ids, la, h, i, j, a, b):
    """c_ab by hand from the transformers weights, for GPT-2, Llama-like models and Gemma 3:
    components by plain hooks on the transformers modules (the embedding entering block 0, each
    head's slice of the output projection, each MLP's output as it joins the stream; Gemma 3's
    norm on the attention output frozen at the layer's whole output), the input norm frozen at the
    stream's scale, the projections by hand, Gemma 3's q/k norms frozen at the head's whole query
    and key, rotary from the config's theta, the softmax scale from the config."""
    hf, cfg = model.hf, model.hf.config
    gpt2 = cfg.model_type == "gpt2"
    gemma = cfg.model_type.startswith("gemma3")
    blocks = hf.transformer.h if gpt2 else hf.model.layers
    d = cfg.hidden_size
    n_heads = cfg.num_attention_heads
    dh = d // n_heads if gpt2 else getattr(cfg, "head_dim", None) or d // n_heads
    group = 1 if gpt2 else n_heads // cfg.num_key_value_heads
    seen = {}

    def keep(key):
        return lambda m, args, out=None: seen.__setitem__(
            key, (args[0] if out is None else out).detach()
        )

    def embed(m, args, kw):
        seen["embed"] = (args[0] if args else kw["hidden_states"]).detach()

    hooks = [blocks[0].register_forward_pre_hook(embed, with_kwargs=True)]
    for n, blk in enumerate(blocks):
        attn = blk.attn if gpt2 else blk.self_attn
        o = attn.c_proj if gpt2 else attn.o_proj
        hooks.append(
            (blk.ln_1 if gpt2 else blk.input_layernorm).register_forward_pre_hook(keep(("x", n)))
        )
        hooks.append(o.register_forward_pre_hook(keep(("z", n))))
        hooks.append(
            o.register_forward_hook(
                lambda m, a_, out, n=n: seen.__setitem__(("o", n), out.detach())
            )
        )
        mlp_out = blk.post_feedforward_layernorm if gemma else blk.mlp
        hooks.append(
            mlp_out.register_forward_hook(
                lambda m, a_, out, n=n: seen.__setitem__(("mlp", n), out.detach())
            )
        )
    with torch.no_grad():
        hf(input_ids=ids)
    for hk in hooks:
        hk.remove()

    def rms(v, w, eps):  # Gemma's (1 + w)
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * (1 + w.double())

    def component(name, pos):
        if name == "embed":
            return seen["embed"][0, pos].double()
        if name.startswith("MLP"):
            return seen[("mlp", int(name[3:]))][0, pos].double()
        lay, head = (int(x) for x in name[1:].split("H"))
        z = seen[("z", lay)][0, pos, head * dh : (head + 1) * dh].double()
        blk = blocks[lay]
        if gpt2:
            return z @ blk.attn.c_proj.weight[head * dh : (head + 1) * dh].double()
        w = blk.self_attn.o_proj.weight.double()  # [d, H * dh]
        write = w[:, head * dh : (head + 1) * dh] @ z
        if gemma:  # the norm on the whole attention output, its scale frozen
            norm = blk.post_attention_layernorm
            out = seen[("o", lay)][0, pos].double()
            write = write * torch.rsqrt(out.pow(2).mean() + norm.eps) * (1 + norm.weight.double())
        return write

    blk = blocks[la]
    x_all = seen[("x", la)][0].double()  # [pos, d]

    def normed(name, pos):  # the input norm, frozen at the stream's scale there
        x, c = x_all[pos], component(name, pos)
        if gpt2:
            ln = blk.ln_1
            s = torch.rsqrt(x.var(unbiased=False) + ln.eps)
            return (c - c.mean()) * s * ln.weight.double()
        ln = blk.input_layernorm
        eps = getattr(ln, "variance_epsilon", getattr(ln, "eps", None))
        s = torch.rsqrt(x.pow(2).mean() + eps)
        return c * s * ((1 + ln.weight.double()) if gemma else ln.weight.double())

    def proj(side, slot):
        if gpt2:
            w = blk.attn.c_attn.weight.double()  # [d, 3d]: x @ w
            off = {"q": 0, "k": d}[side]
            return w[:, off + slot * dh : off + (slot + 1) * dh].T  # [dh, d]
        lin = blk.self_attn.q_proj if side == "q" else blk.self_attn.k_proj
        return lin.weight.double()[slot * dh : (slot + 1) * dh]

    def rot(v, pos):
        if gpt2:
            return v
        if gemma:
            params = cfg.rope_parameters[cfg.layer_types[la]]
        else:
            params = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}
        assert params.get("rope_type", "default") == "default"
        inv = 1.0 / params["rope_theta"] ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)
        ang = pos * inv
        cos, sin = torch.cat([ang.cos(), ang.cos()]), torch.cat([ang.sin(), ang.sin()])
        return v * cos + torch.cat([-v[dh // 2 :], v[: dh // 2]]) * sin

    def part(name, pos, side, slot):
        w = proj(side, slot)
        v = w @ normed(name, pos)
        if gemma:  # the q/k norm frozen at the head's whole query or key there
            ln = blk.input_layernorm
            whole = w @ rms(x_all[pos], ln.weight, ln.eps)
            qk_norm = blk.self_attn.q_norm if side == "q" else blk.self_attn.k_norm
            v = v * torch.rsqrt(whole.pow(2).mean() + qk_norm.eps) * (1 + qk_norm.weight.double())
        return rot(v, pos)

    scale = cfg.query_pre_attn_scalar**-0.5 if gemma else dh**-0.5
    return float(part(a, i, "q", h) @ part(b, j, "k", h // group)) * scale


ORACLE_PAIRS = {  # (layer, head, query, key, query-side, key-side), three per model
    "gpt2": [(1, 0, 7, 2, "embed", "embed"), (1, 3, 10, 4, "L0H1", "MLP0"),
             (1, 2, 11, 6, "MLP0", "L0H3")],
    "llama": [(1, 0, 7, 2, "embed", "embed"), (2, 3, 10, 4, "L1H2", "L0H1"),
              (2, 1, 11, 3, "MLP1", "L1H3")],
    "gemma3": [(1, 0, 11, 2, "embed", "embed"), (1, 3, 10, 4, "L0H1", "MLP0"),
               (1, 2, 11, 7, "MLP0", "L0H3")],
    "smollm2": [(5, 2, 13, 4, "embed", "L3H1"), (12, 7, 15, 9, "MLP4", "MLP0"),
                (20, 0, 14, 6, "L17H3", "L16H0")],
}  # fmt: skip


@pytest.mark.parametrize("which", list(ORACLE_PAIRS))
def test_contributions_equal_a_hand_written_oracle(which, request):
    """Three pairs on each of tiny GPT-2 (LayerNorm, learned positions), a tiny GQA Llama
    (RMSNorm, rotary), tiny Gemma 3 (q/k norms, (1 + w) gains, the attention output normed,
    a sliding-window layer) and SmolLM2, against :func:`_oracle` (no headscope code)."""
    fixture = {"gpt2": "tiny_gpt2", "llama": "tiny_gqa_llama", "gemma3": "tiny_gemma3",
               "smollm2": "smollm2"}[which]  # fmt: skip
    model = request.getfixturevalue(fixture)
    ids = _ids(model, rows=1, n=16)
    rec = qa.record(model, ids)
    sizes = []
    for la, h, i, j, a, b in ORACLE_PAIRS[which]:
        names = rec.components(la)
        c = qa.table(rec, la, h, torch.tensor([0]), torch.tensor([i]), torch.tensor([j]))[0]
        want = _oracle(model, ids, la, h, i, j, a, b)
        assert abs(float(c[names.index(a), names.index(b)]) - want) < 1e-5, (la, h, a, b)
        sizes.append(abs(want))
    assert max(sizes) > 1e-3  # the pairs carry something: the comparison has teeth


def test_knockouts_exact_and_first_order_agree_for_a_small_component(tiny_gqa_llama):
    """Knocking out a component is exact (the norm recomputed); for a component small against
    the stream it agrees with the first-order change; bias is not a stream component."""
    model = tiny_gqa_llama
    rec = qa.record(model, _ids(model, rows=2, n=12))
    la, h = 2, 1
    inst = rules.instances(rec, la, h, "all", "argmax")
    c = qa.table(rec, la, h, inst.rows, inst.query, inst.key)
    names = rec.components(la)
    small = min(range(len(names) - 1), key=lambda x: float(rec.writers[:, :, x].norm()))
    ko = qa.knockouts(rec, la, h, inst, small, small, c)
    for side in ("q", "k"):
        err = (ko[f"ko_{side}"] - ko[f"fo_{side}"]).abs().max()
        assert err <= 0.2 * ko[f"ko_{side}"].abs().max() + 1e-6
    same = qa.knockouts(rec, la, h, inst, small, small, c.sum(1))  # key-side totals suffice
    for k in ko:
        torch.testing.assert_close(same[k], ko[k], atol=0, rtol=0)
    q_part = qa.Side(rec, la, h, "q").part(inst.rows, inst.query, small)
    torch.testing.assert_close(
        q_part, qa.Side(rec, la, h, "q").parts(inst.rows, inst.query)[:, small]
    )
    full = qa.knockouts(rec, la, h, inst, len(names) - 1, len(names) - 1, c)
    assert torch.isnan(full["ko_q"]).all() and torch.isnan(full["fo_k"]).all()


def test_rules_refuse_what_no_prompt_can_have(tiny_gqa_llama):
    rec = qa.record(tiny_gqa_llama, _ids(tiny_gqa_llama, rows=2, n=8))
    with pytest.raises(HeadscopeError, match="comes after its query"):
        rules.instances(rec, 1, 0, 3, 5)
    with pytest.raises(HeadscopeError, match="Unknown key position 'IO'"):
        rules.instances(rec, 1, 0, "last", "IO")
    with pytest.raises(HeadscopeError, match="outside prompts of 8 tokens"):
        rules.instances(rec, 1, 0, 9, "argmax")
    inst = rules.instances(rec, 1, 0, "all", 3)  # every query from the key's position on
    assert (inst.key == 3).all() and inst.query.min() == 3 and len(inst) == 2 * 5
    # null keys: never the chosen key nor the head's top key, and visible
    inst = rules.instances(rec, 1, 0, "all", "sink")
    pat = rec.pattern(1)[inst.rows, 0, inst.query]
    ok = inst.null >= 0
    assert (inst.null[ok] != inst.key[ok]).all()
    assert (inst.null[ok] != pat.argmax(-1)[ok]).all()
    assert (inst.null[ok] <= inst.query[ok]).all()


def _planted_induction_model():
    """A two-layer attention-only GPT-2 built by hand: layer 0's head attends to the previous
    position (its query codes position p, its key position p + 1) and writes the previous token's
    identity into its own subspace; layer 1's head matches the current token (query) against
    that subspace (key): an induction head. The MLPs are zero."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.tiny_models import _bpe_tokenizer

    tok = _bpe_tokenizer()
    d, n_tok, n_pos = 64, 8, 32
    cfg = GPT2Config(vocab_size=len(tok), n_positions=n_pos, n_embd=d, n_layer=2, n_head=1,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    hf = GPT2LMHeadModel(cfg).eval()
    g = torch.Generator().manual_seed(0)
    # an orthonormal basis of the vectors with mean 0 (a layer norm's centring leaves them be)
    m = torch.randn(d, d, generator=g)
    m[:, 0] = 1.0
    basis = torch.linalg.qr(m).Q[:, 1:]  # [d, d - 1], each column orthogonal to the ones
    u, u_prev, r = basis[:, :n_tok], basis[:, n_tok : 2 * n_tok], basis[:, 16 : 16 + n_pos]
    e = torch.eye(d)
    with torch.no_grad():
        for p in hf.parameters():
            p.zero_()
        for blk in hf.transformer.h:
            blk.ln_1.weight.fill_(1.0)
            blk.ln_2.weight.fill_(1.0)
        hf.transformer.ln_f.weight.fill_(1.0)
        hf.transformer.wte.weight[10 : 10 + n_tok] = u.T
        hf.transformer.wpe.weight[:] = r.T
        a0, a1 = hf.transformer.h[0].attn, hf.transformer.h[1].attn
        wq = sum(torch.outer(r[:, p], e[p]) for p in range(n_pos))  # position p -> code p
        wk = sum(torch.outer(r[:, p], e[p + 1]) for p in range(n_pos - 1))  # p -> code p + 1
        wv = sum(torch.outer(u[:, t], e[t]) for t in range(n_tok)) / 5.66
        a0.c_attn.weight[:] = torch.cat([wq * 2.3, wk * 2.3, wv], 1)  # Conv1D: x @ W
        a0.c_proj.weight[:] = sum(torch.outer(e[t], u_prev[:, t]) for t in range(n_tok))
        wq1 = sum(torch.outer(u[:, t], e[t]) for t in range(n_tok))
        wk1 = sum(torch.outer(u_prev[:, t], e[t]) for t in range(n_tok))
        a1.c_attn.weight[:] = torch.cat([wq1 * 2.0, wk1 * 2.0, wq1], 1)
        a1.c_proj.weight[:] = torch.eye(d)
    return headscope.load_model(hf, tok, name="planted-induction")


def test_a_planted_induction_head_reads_the_previous_token_head_on_its_key_side():
    """The closed form: layer 1's score at its induction target is the current token (the
    embedding, query side) against the previous token's identity that layer 0's head wrote (key
    side), and nothing else carries it."""
    model = _planted_induction_model()
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randperm(8, generator=g) + 10 for _ in range(3)]
    ids = torch.stack([torch.cat([torch.tensor([model.bos_id]), s, s]) for s in seqs])
    rec = qa.record(model, ids)
    prev = rec.pattern(0)[:, 0]  # layer 0 attends to the previous position
    assert (prev[:, 2:].argmax(-1) == torch.arange(1, 16)).all()
    inst = rules.instances(rec, 1, 0, "all", "induction")
    assert len(inst) == 3 * 8 and (inst.key == inst.query - 7).all()
    assert (rec.pattern(1)[inst.rows, 0, inst.query, inst.key] > 0.9).all()
    c = qa.table(rec, 1, 0, inst.rows, inst.query, inst.key).mean(0)
    names = rec.components(1)
    a, b = divmod(int(c.abs().argmax()), c.shape[1])
    assert (names[a], names[b]) == ("embed", "L0H0")
    assert c[a, b] > 0.95 * c.sum()  # the whole logit, up to the layer norm's scale
    key_side = c.sum(0)
    assert key_side[names.index("L0H0")] > 10 * key_side[names.index("embed")].abs()


@pytest.mark.parametrize("which", ["gpt2", "llama", "gemma3"])
def test_subspaces_add_up_to_the_logit(which, tiny_gpt2, tiny_gqa_llama, tiny_gemma3):
    """The singular directions of W_QK (no rotary: GPT-2) and the rotation planes (rotary) each
    split the logit exactly; the singular values come largest first."""
    model = {"gpt2": tiny_gpt2, "llama": tiny_gqa_llama, "gemma3": tiny_gemma3}[which]
    rec = qa.record(model, _ids(model))
    for la in range(model.n_layers):
        inst = rules.instances(rec, la, 1, "all", "argmax")
        names, parts = qa.subspaces(rec, la, 1, inst.rows, inst.query, inst.key)
        logit = rec.logits(la)[inst.rows, 1, inst.query, inst.key]
        torch.testing.assert_close(parts.sum(1), logit, atol=1e-5, rtol=0)
        assert parts.shape[1] == len(names) and len(names) > 1
        assert names[0] == ("sv0" if which == "gpt2" else "plane0")


@pytest.mark.parametrize("side", ["q", "k"])
def test_knockouts_equal_transformers_eager_attention_with_the_component_removed(
    tiny_gqa_llama, side
):
    """The oracle: transformers' own eager attention weights, with the query (or key)
    projection's input at the one position replaced by the norm of the stream minus the
    component (a plain forward pre-hook, no headscope code)."""
    _eager_knockouts(tiny_gqa_llama, 2, 3, "L1H2", side)


def _eager_knockouts(model, la, h, comp_name, side):
    import copy

    ids = _ids(model, rows=2, n=12)
    rec = qa.record(model, ids)
    inst = rules.instances(rec, la, h, "all", "argmax")
    c = qa.table(rec, la, h, inst.rows, inst.query, inst.key)
    names = rec.components(la)
    comp = names.index(comp_name)
    ko = qa.knockouts(rec, la, h, inst, comp, comp, c)
    hf = copy.deepcopy(model.hf)
    hf.set_attn_implementation("eager")
    layer = hf.model.layers[la]
    proj = layer.self_attn.q_proj if side == "q" else layer.self_attn.k_proj
    moved = []
    for t in (0, 5, len(inst) - 1):
        row, i, j = int(inst.rows[t]), int(inst.query[t]), int(inst.key[t])
        at = i if side == "q" else j
        x = rec.streams[la][row, at] - rec.writers[row, at, comp]

        def pre(m, args, row=row, at=at, x=x):
            y = args[0].clone()
            y[row, at] = layer.input_layernorm(x)
            return (y,)

        hook = proj.register_forward_pre_hook(pre)
        try:
            with torch.no_grad():
                att = hf(input_ids=ids, output_attentions=True).attentions[la]
        finally:
            hook.remove()
        want = float(att[row, h, i, j]) - float(ko["attn"][t])
        assert abs(float(ko[f"ko_{side}"][t]) - want) < 1e-5
        moved.append(abs(want))
    assert max(moved) > 1e-4  # the component moves the attention: the check has teeth


def test_a_soft_capped_model_sums_to_the_logit_before_the_cap():
    """Gemma 2 caps its attention logits (tanh): the table adds up to the logit before the cap,
    and exact knock-outs renormalise the capped logits as the model's own attention does."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from tests.tiny_models import _bpe_tokenizer

    tok = _bpe_tokenizer()
    cfg = Gemma2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, attn_logit_softcapping=2.0, sliding_window=64,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.eos_token_id)  # fmt: skip
    torch.manual_seed(0)
    hf = Gemma2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(25.0)  # logits past the cap's linear range
            layer.self_attn.k_proj.weight.mul_(25.0)
    model = headscope.load_model(hf, tok, name="tiny-gemma2-capped")
    rec = _every_head_sums_to_its_logit(model)
    assert float(rec.logits(1).abs().max()) > 2.0  # some logit beyond the cap
    for side in ("q", "k"):  # knock-outs through the cap: transformers' eager attention agrees
        _eager_knockouts(model, 1, 2, "L0H1", side)


@pytest.mark.parametrize("small", [False, True])
def test_parts_shared_across_a_layers_heads_equal_each_heads_own(tiny_gemma3, monkeypatch, small):
    """The store (every query head's parts at once, the key parts per KV head, kept by position)
    gives each head exactly its own parts; with room for 2 query positions of the last layer,
    the parts past it are computed alone and still equal."""
    rec = qa.record(tiny_gemma3, _ids(tiny_gemma3))
    last = tiny_gemma3.n_layers - 1
    if small:
        d_head = rec.calls[last].query.shape[-1]
        row = len(rec.components(last)) * tiny_gemma3.n_heads * d_head * 8
        monkeypatch.setattr(qa, "STORE_BYTES", 2 * row)
    full = False
    for la in range(tiny_gemma3.n_layers):
        for h in range(tiny_gemma3.n_heads):
            inst = rules.instances(rec, la, h, "all", "argmax")
            for side, pos in (("q", inst.query), ("k", inst.key)):
                got = qa.side_parts(rec, la, h, side, inst.rows, pos)
                want = qa.Side(rec, la, h, side).parts(inst.rows, pos)
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            stores = [s for k, s in rec._stores.items() if k != "layer"]
            assert all(s.used <= s.room for s in stores)
            full |= rec._stores["q"].used < len(inst.query)  # some queries were not kept
    assert full == small
