"""Checks of the path-patching oracle (tests/circuits/path_oracle.py) against closed forms and
against a second mechanism (hooks on the q/k/v projections instead of the hand-written attention).

headscope is used only to load the models (``model.hf``, the tokenizer)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.circuits import path_oracle as po
from tests.effects import patching_oracle as zo

METRICS = ("logit_diff", "prob", "loss")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gpt2(tiny_gpt2):
    """The tiny GPT-2 with its attention weights scaled up: at GPT-2's init (std 0.02) a head
    moves the logits by ~1e-6, too little to tell a patch from float32 noise."""
    import headscope

    hf = copy.deepcopy(tiny_gpt2.hf)
    with torch.no_grad():
        for block in hf.transformer.h:
            block.attn.c_attn.weight.mul_(15.0)
            block.attn.c_proj.weight.mul_(15.0)
    return headscope.load_model(hf, tiny_gpt2.tokenizer, name="tiny-gpt2-sharp")


@pytest.fixture(scope="module")
def tiny_gemma3(tiny_gemma3_dir):
    import headscope

    return headscope.load_model(str(tiny_gemma3_dir))  # layer 0: sliding window 4; layer 1: global


def _pair(model, n=11, changed=(3, 7), seed=0):
    """Random ordinary tokens: (base, source, answer, wrong), source = base with ``changed``
    positions redrawn."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.ordinary_vocab()
    pick = lambda k: vocab[torch.randint(len(vocab), (k,), generator=g)].tolist()  # noqa: E731
    base = [model.bos_id, *pick(n - 1)]
    source = list(base)
    for p, t in zip(changed, pick(len(changed)), strict=True):
        source[p] = t if t != base[p] else t + 1
    a, w = pick(2)
    return base, source, a, (w if w != a else a + 1)


def _close(got, want, rel):
    assert abs(got - want) <= rel * max(1.0, abs(want)), (got, want)


def _receivers(model, ls):
    out = [("logits",)]
    for lr in range(ls + 1, model.n_layers):
        out += [(kind, lr, hr) for kind in po.KINDS for hr in (0, model.n_heads - 1)]
    return out


def test_the_oracle_imports_nothing_from_headscope():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(po.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [m for m in names if m.split(".")[0] in ("headscope", "tests")], names


# ------------------------------------------------------------------- the hand-written attention


def test_hand_attention_reproduces_each_model(gpt2, tiny_gqa_llama, tiny_gemma3):
    for model in (gpt2, tiny_gqa_llama, tiny_gemma3):
        base, source, _, _ = _pair(model)
        for ids in (base, source):
            with po._eager(model.hf):
                want = po._last_logits(model.hf, ids)
            got = po.hand_logits(model.hf, ids)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_hand_attention_applies_gemmas_sliding_window(tiny_gemma3):
    """With layer 0's window (4 keys) lifted the logits change: the mask is really exercised (11
    tokens > 4)."""
    hf = tiny_gemma3.hf
    base, _, _, _ = _pair(tiny_gemma3)
    mod = po.attention(hf, 0)
    assert mod.sliding_window == 4
    want = po.hand_logits(hf, base)
    mod.sliding_window = None
    try:
        lifted = po.hand_logits(hf, base)
    finally:
        mod.sliding_window = 4
    assert (lifted - want).abs().max() > 1e-3


# ------------------------------------------------------------- a sender patched with itself


@pytest.mark.parametrize("metric", METRICS)
def test_a_sender_patched_with_its_own_activation_gives_the_base_metric(
    gpt2, tiny_gqa_llama, tiny_gemma3, metric
):
    for model in (gpt2, tiny_gqa_llama, tiny_gemma3):
        base, _, a, w = _pair(model)
        want = zo.plain_metric(model.hf, base, metric, a, w)
        for ls in range(model.n_layers):
            for receiver in _receivers(model, ls):
                for freeze in (False, True):
                    got = po.path_patched_metric(
                        model.hf,
                        model.n_heads,
                        base,
                        base,
                        (ls, 1),
                        receiver,
                        metric,
                        a,
                        w,
                        freeze_mlps=freeze,
                    )
                    _close(got, want, 1e-6)


def test_a_self_patch_is_exact_in_float64(tiny_gqa_llama64):
    model = tiny_gqa_llama64
    base, _, a, w = _pair(model)
    want = zo.plain_metric(model.hf, base, "logit_diff", a, w)
    for receiver in _receivers(model, 0):
        got = po.path_patched_metric(
            model.hf,
            model.n_heads,
            base,
            base,
            (0, 2),
            receiver,
            "logit_diff",
            a,
            w,
            freeze_mlps=True,
            sender_positions=[2, 7],
            receiver_positions=[0, 5, 10],
        )
        _close(got, want, 1e-9)


# ----------------------------------------------------- logits receiver, sender in the last layer


def test_logits_receiver_from_the_last_layer_is_a_plain_head_patch(
    gpt2, tiny_gqa_llama, tiny_gemma3
):
    for model in (gpt2, tiny_gqa_llama, tiny_gemma3):
        base, source, a, w = _pair(model)
        ls = model.n_layers - 1
        n = len(base)
        for hs in range(model.n_heads):
            for positions in (None, [n - 1], [3, n - 1]):
                for metric in METRICS:
                    got = po.path_patched_metric(
                        model.hf,
                        model.n_heads,
                        base,
                        source,
                        (ls, hs),
                        ("logits",),
                        metric,
                        a,
                        w,
                        sender_positions=positions,
                    )
                    want = zo.z_patched_metric(
                        model.hf,
                        model.n_heads,
                        base,
                        source,
                        ls,
                        hs,
                        range(n) if positions is None else positions,
                        metric,
                        a,
                        w,
                    )
                    _close(got, want, 1e-6)
        # and the patch is not a no-op here (the sender's source output differs at the end)
        changed = po.path_patched_metric(
            model.hf, model.n_heads, base, source, (ls, 0), ("logits",), "logit_diff", a, w
        )
        assert abs(changed - zo.plain_metric(model.hf, base, "logit_diff", a, w)) > 1e-5


# ---------------------------------------- frozen MLPs, logits receiver: the direct path, closed


def _direct_path_logit_diff(hf, n_heads, base, source, ls, hs, a, w, positions, identity_norm):
    """``(W_U[a] - W_U[w]) . N(r + W_O^hs dz)`` at the last position, in float64: ``r`` the base
    run's residual entering the final norm, ``dz`` the sender's source-minus-base output there
    (0 when the last position is not a sender position), ``N`` the final norm (or identity)."""
    z_base, _, _ = zo_records(hf, base)
    z_src, _, _ = zo_records(hf, source)
    gpt2 = type(hf).__name__.startswith("GPT2")
    norm = hf.transformer.ln_f if gpt2 else hf.model.norm
    kept = {}
    h = norm.register_forward_pre_hook(lambda m, args: kept.__setitem__("r", args[0][0, -1]))
    try:
        with po._eager(hf):
            po._last_logits(hf, base)
    finally:
        h.remove()
    r = kept["r"].double()
    last = len(base) - 1
    d = z_base[ls].shape[-1] // n_heads
    cols = slice(hs * d, (hs + 1) * d)
    dz = (z_src[ls][last, cols] - z_base[ls][last, cols]).double()
    if positions is not None and last not in positions:
        dz = torch.zeros_like(dz)
    W = po.out_proj(hf, ls).weight.detach().double()
    delta = dz @ W[cols] if gpt2 else W[:, cols] @ dz  # GPT-2's Conv1D weight is [in, out]
    x = r + delta
    if identity_norm:
        y = x
    elif gpt2:
        y = (x - x.mean()) / ((x - x.mean()).pow(2).mean() + norm.eps).sqrt()
        y = y * norm.weight.detach().double() + norm.bias.detach().double()
    else:
        y = norm.weight.detach().double() * x / (x.pow(2).mean() + norm.variance_epsilon).sqrt()
    W_U = hf.get_output_embeddings().weight.detach().double()
    return float((W_U[a] - W_U[w]) @ y)


def zo_records(hf, ids):
    return po.record_run(hf, ids, with_mlps=False)


def _gpt2_64(gpt2):
    return copy.deepcopy(gpt2.hf).double()


@pytest.mark.parametrize("identity_norm", [False, True])
def test_frozen_mlps_leave_only_the_direct_path_to_the_logits(
    gpt2, tiny_gqa_llama64, identity_norm
):
    """Every head after the sender and every MLP from its layer on frozen: the logits move by the
    sender's output change through W_O, the final norm and W_U alone (float64 models)."""
    models = [(_gpt2_64(gpt2), gpt2.n_heads), (tiny_gqa_llama64.hf, 4)]
    for hf, n_heads in models:
        if identity_norm:
            hf = copy.deepcopy(hf)
            if type(hf).__name__.startswith("GPT2"):
                hf.transformer.ln_f = torch.nn.Identity()
            else:
                hf.model.norm = torch.nn.Identity()
        base, source, a, w = _pair(tiny_gqa_llama64)
        n = len(base)
        base_metric = zo.plain_metric(hf, base, "logit_diff", a, w)
        for ls in range(hf.config.num_hidden_layers):
            for hs in (0, n_heads - 1):
                for positions in (None, [3, n - 1], [3, 7]):
                    got = po.path_patched_metric(
                        hf,
                        n_heads,
                        base,
                        source,
                        (ls, hs),
                        ("logits",),
                        "logit_diff",
                        a,
                        w,
                        freeze_mlps=True,
                        sender_positions=positions,
                    )
                    want = _direct_path_logit_diff(
                        hf, n_heads, base, source, ls, hs, a, w, positions, identity_norm
                    )
                    _close(got, want, 1e-9)
                    if positions == [3, 7]:  # the last position not sent: nothing changes
                        _close(got, base_metric, 1e-9)
        # the indirect paths are real: without frozen MLPs an early sender's effect differs
        free = po.path_patched_metric(
            hf, n_heads, base, source, (0, 0), ("logits",), "logit_diff", a, w
        )
        frozen = po.path_patched_metric(
            hf, n_heads, base, source, (0, 0), ("logits",), "logit_diff", a, w, freeze_mlps=True
        )
        assert abs(free - frozen) > 1e-6


# ------------------------------------------------------------------------ q, k, v receivers


def test_receiver_kinds_give_different_values(tiny_gqa_llama):
    model = tiny_gqa_llama
    base, source, a, w = _pair(model, changed=(1, 2, 3, 4, 5))
    want = zo.plain_metric(model.hf, base, "logit_diff", a, w)
    for freeze in (False, True):
        got = {
            kind: po.path_patched_metric(
                model.hf,
                4,
                base,
                source,
                (0, 1),
                (kind, 2, 3),
                "logit_diff",
                a,
                w,
                freeze_mlps=freeze,
            )
            for kind in po.KINDS
        }
        values = sorted(got.values())
        assert min(b - a for a, b in zip(values, values[1:], strict=False)) > 1e-5, got
        assert all(abs(v - want) > 1e-5 for v in got.values()), (got, want)


def test_a_sender_cannot_reach_earlier_positions(tiny_gqa_llama, tiny_gemma3):
    """Sender sent only at the last position: step 2's q / k / v at every earlier position are
    base's (causal attention), so patching the receiver there gives the base metric; including
    the last position does not."""
    for model in (tiny_gqa_llama, tiny_gemma3):
        base, source, a, w = _pair(model, changed=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10))
        n = len(base)
        want = zo.plain_metric(model.hf, base, "logit_diff", a, w)
        moved = 0
        for kind in po.KINDS:
            receiver = (kind, model.n_layers - 1, 2)
            early = po.path_patched_metric(
                model.hf,
                model.n_heads,
                base,
                source,
                (0, 0),
                receiver,
                "logit_diff",
                a,
                w,
                sender_positions=[n - 1],
                receiver_positions=list(range(n - 1)),
            )
            _close(early, want, 1e-6)
            full = po.path_patched_metric(
                model.hf,
                model.n_heads,
                base,
                source,
                (0, 0),
                receiver,
                "logit_diff",
                a,
                w,
                sender_positions=[n - 1],
            )
            moved += abs(full - want) > 1e-6
        assert moved == 3


def test_only_the_receiver_head_sees_the_new_key_or_value(tiny_gqa_llama, tiny_gemma3):
    """Grouped-query attention (Llama: heads 2 and 3 share KV head 1; Gemma: all 4 heads share
    one): a k or v receiver changes head 3's output at its layer, its group partners' not at all."""
    for model in (tiny_gqa_llama, tiny_gemma3):
        hf, lr = model.hf, model.n_layers - 1
        base, source, _, _ = _pair(model, changed=(1, 2, 3, 4, 5))
        z_base, _, _ = po.record_run(hf, base, False)
        d = po.attention(hf, lr).head_dim
        group = range(4) if model is tiny_gemma3 else range(2, 4)
        for kind in ("k", "v"):
            receiver = (kind, lr, 3)
            _, new = po.frozen_run(hf, 4, base, source, (0, 1), receiver)
            kept = {}
            h = po.out_proj(hf, lr).register_forward_pre_hook(
                lambda m, args, kept=kept: kept.__setitem__("z", args[0][0].clone())
            )
            try:
                po.receiver_patched_logits(hf, base, receiver, new)
            finally:
                h.remove()
            for head in group:
                cols = slice(head * d, (head + 1) * d)
                same = torch.equal(kept["z"][:, cols], z_base[lr][:, cols])
                assert same == (head != 3), (type(hf).__name__, kind, head)


def test_step_two_receiver_input_is_the_closed_form(tiny_gqa_llama64):
    """Frozen MLPs: layer lr's input residual is base's plus the sender's output change through
    W_O at every position, so the receiver's q / k / v is the layer's own projection (RMSNorm,
    q/k/v_proj, HF's rotary) of that residual."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = tiny_gqa_llama64
    hf = model.hf
    base, source, _, _ = _pair(model)
    z_base, _, _ = po.record_run(hf, base, False)
    z_src, _, _ = po.record_run(hf, source, False)
    for ls, hs, lr, hr in [(0, 1, 1, 3), (0, 2, 2, 0), (1, 3, 2, 1)]:
        kept = {}

        def grab(m, args, kwargs, kept=kept):
            kept["r"] = (args[0] if args else kwargs["hidden_states"])[0]
            kept["pe"] = kwargs["position_embeddings"]

        block = hf.model.layers[lr]
        h = block.register_forward_pre_hook(grab, with_kwargs=True)
        try:
            with po._eager(hf):
                po._last_logits(hf, base)
        finally:
            h.remove()
        cols = slice(hs * 8, (hs + 1) * 8)
        dz = z_src[ls][:, cols] - z_base[ls][:, cols]  # [pos, 8]
        x = kept["r"] + dz @ po.out_proj(hf, ls).weight[:, cols].T
        with torch.no_grad():
            x = block.input_layernorm(x)[None]
            attn = block.self_attn
            q = attn.q_proj(x).view(1, -1, 4, 8).transpose(1, 2)
            k = attn.k_proj(x).view(1, -1, 2, 8).transpose(1, 2)
            v = attn.v_proj(x).view(1, -1, 2, 8).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, *kept["pe"])
        want = {"q": q[0, hr], "k": k[0, hr // 2], "v": v[0, hr // 2]}
        for kind in po.KINDS:
            _, got = po.frozen_run(hf, 4, base, source, (ls, hs), (kind, lr, hr), True)
            torch.testing.assert_close(got, want[kind], rtol=1e-10, atol=1e-12)


def _projection_path_patch(model, base, source, sender, receiver, a, w, positions=None):
    """Steps 2 and 3 again with forward hooks on the q/k/v projections instead of the hand-written
    attention: q_norm, rotary (and for GPT-2 nothing) act per head and per position, so replacing
    the projection's output rows of one head is replacing that head's q (k, v: only without
    grouped-query attention). HF eager attention throughout."""
    hf = model.hf
    kind, lr, hr = receiver
    ls, hs = sender
    z_base, _, _ = po.record_run(hf, base, False)
    z_src, _, _ = po.record_run(hf, source, False)
    attn = po.attention(hf, lr)
    gpt2 = hasattr(attn, "c_attn")
    d = attn.head_dim
    if gpt2:
        proj, offset = attn.c_attn, {"q": 0, "k": 1, "v": 2}[kind] * attn.split_size
    else:
        proj, offset = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}[kind], 0
    cols = slice(offset + hr * d, offset + (hr + 1) * d)
    frozen = {i: z_base[i].clone() for i in range(ls, model.n_layers)}
    frozen[ls][:, hs * d : (hs + 1) * d] = z_src[ls][:, hs * d : (hs + 1) * d]
    kept = {}
    handles = [
        po.out_proj(hf, i).register_forward_pre_hook(lambda m, a, i=i: (frozen[i][None],))
        for i in range(ls, model.n_layers)
    ]
    handles.append(proj.register_forward_hook(lambda m, a, o: kept.__setitem__("x", o[0].clone())))
    with po._eager(hf), po._hooks(handles):
        po._last_logits(hf, base)
    rows = list(range(len(base))) if positions is None else positions

    def write(m, a, o):
        o = o.clone()
        o[0, rows, cols] = kept["x"][rows, cols]
        return o

    with po._eager(hf), po._hooks([proj.register_forward_hook(write)]):
        return po.metric_value(po._last_logits(hf, base), "logit_diff", a, w)


def test_hand_attention_agrees_with_patching_the_projections(gpt2, tiny_gqa_llama, tiny_gemma3):
    cases = [
        (gpt2, ["q", "k", "v"]),
        (tiny_gqa_llama, ["q"]),  # k/v: the projection is the KV head, shared by a group
        (tiny_gemma3, ["q"]),  # q_norm and rotary before the hand attention's patch
    ]
    for model, kinds in cases:
        base, source, a, w = _pair(model)
        for kind in kinds:
            for positions in (None, [0, 4, 10]):
                receiver = (kind, model.n_layers - 1, 1)
                want = _projection_path_patch(
                    model, base, source, (0, 2), receiver, a, w, positions
                )
                got = po.path_patched_metric(
                    model.hf,
                    model.n_heads,
                    base,
                    source,
                    (0, 2),
                    receiver,
                    "logit_diff",
                    a,
                    w,
                    receiver_positions=positions,
                )
                _close(got, want, 1e-5)
                assert abs(got - zo.plain_metric(model.hf, base, "logit_diff", a, w)) > 1e-5


def test_bad_arguments_are_refused(tiny_gqa_llama):
    hf = tiny_gqa_llama.hf
    base, source, a, w = _pair(tiny_gqa_llama)
    bad = [
        dict(sender=(1, 0), receiver=("q", 1, 0)),  # receiver not after the sender
        dict(sender=(0, 4), receiver=("logits",)),  # no head 4
        dict(sender=(0, 0), receiver=("pattern", 2, 0)),
        dict(sender=(0, 0), receiver=("logits",), sender_positions=[11]),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            po.path_patched_metric(
                hf, 4, base, source, metric="logit_diff", answer=a, wrong=w, **kw
            )
    with pytest.raises(ValueError):
        po.path_patched_metric(hf, 4, base, source[:-1], (0, 0), ("logits",), "prob", a, w)


# ------------------------------------------------------------------------------ the real models


def _ioi(model):
    tok = model.tokenizer
    base = tok("When Mary and John went to the store, John gave a drink to")["input_ids"]
    source = tok("When Mary and John went to the store, Mary gave a drink to")["input_ids"]
    answer = tok(" Mary", add_special_tokens=False)["input_ids"]
    wrong = tok(" John", add_special_tokens=False)["input_ids"]
    assert len(base) == len(source) and len(answer) == len(wrong) == 1
    return base, source, answer[0], wrong[0]


@pytest.mark.real
def test_on_smollm2(smollm2):
    """30 layers x 9 heads on 3 KV heads: the hand attention reproduces the model; a self patch
    gives the base metric for every receiver kind; last-layer sender = plain head patch; frozen
    MLPs = the direct-path closed form."""
    model = smollm2
    hf = model.hf
    base, source, a, w = _ioi(model)
    n = len(base)
    with po._eager(hf):
        want = po._last_logits(hf, base)
    torch.testing.assert_close(po.hand_logits(hf, base), want, rtol=1e-5, atol=1e-5)
    plain = zo.plain_metric(hf, base, "logit_diff", a, w)
    for receiver in [("logits",), ("q", 20, 4), ("k", 20, 5), ("v", 20, 8)]:
        got = po.path_patched_metric(
            hf, 9, base, base, (10, 7), receiver, "logit_diff", a, w, freeze_mlps=True
        )
        _close(got, plain, 1e-6)
    for hs in (0, 4):
        got = po.path_patched_metric(hf, 9, base, source, (29, hs), ("logits",), "logit_diff", a, w)
        want = zo.z_patched_metric(hf, 9, base, source, 29, hs, range(n), "logit_diff", a, w)
        _close(got, want, 1e-6)
    for ls, hs in [(10, 7), (25, 2)]:
        got = po.path_patched_metric(
            hf, 9, base, source, (ls, hs), ("logits",), "logit_diff", a, w, freeze_mlps=True
        )
        want = _direct_path_logit_diff(hf, 9, base, source, ls, hs, a, w, None, False)
        _close(got, want, 1e-4)  # float32 model against the float64 closed form
    values = {
        kind: po.path_patched_metric(
            hf, 9, base, source, (10, 7), (kind, 20, 4), "logit_diff", a, w
        )
        for kind in po.KINDS
    }
    assert len({round(v, 6) for v in values.values()}) == 3, values


@pytest.mark.real
def test_on_gemma3(gemma3):
    """18 layers x 4 heads on 1 KV head, q_norm / k_norm, local and global rotary: the hand
    attention reproduces the model; self patch = base; last-layer sender = plain head patch; the
    three receiver kinds differ."""
    model = gemma3
    hf = model.hf
    base, source, a, w = _ioi(model)
    n = len(base)
    with po._eager(hf):
        want = po._last_logits(hf, base)
    torch.testing.assert_close(po.hand_logits(hf, base), want, rtol=1e-5, atol=1e-5)
    plain = zo.plain_metric(hf, base, "logit_diff", a, w)
    for receiver in [("logits",), ("q", 16, 1), ("k", 16, 2), ("v", 11, 3)]:
        got = po.path_patched_metric(
            hf, 4, base, base, (6, 0), receiver, "logit_diff", a, w, freeze_mlps=True
        )
        _close(got, plain, 1e-6)
    for hs in (0, 3):
        got = po.path_patched_metric(hf, 4, base, source, (17, hs), ("logits",), "logit_diff", a, w)
        want = zo.z_patched_metric(hf, 4, base, source, 17, hs, range(n), "logit_diff", a, w)
        _close(got, want, 1e-6)
    values = {
        kind: po.path_patched_metric(hf, 4, base, source, (6, 1), (kind, 12, 1), "logit_diff", a, w)
        for kind in po.KINDS
    }
    assert len({round(v, 6) for v in values.values()}) == 3, values
