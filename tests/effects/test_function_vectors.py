"""Function-vector heads (headscope.effects.function_vectors): the indirect effects equal a plain
full forward of transformers' eager attention with a forward pre-hook on the output projection (no
headscope code); a head given its own output changes nothing; a head that writes nothing has no
effect; the cached last position equals the full forward."""

from __future__ import annotations

import copy

import pytest
import torch

from headscope.effects import function_vectors as fv
from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall
from headscope.probes import icl


def _oracle_effects(model, prompts, means, heads):
    """IE by full forwards of an eager copy, the head's slice of the output projection's input
    set at the last position by a plain pre-hook."""
    hf = copy.deepcopy(model.hf)
    hf.set_attn_implementation("eager")
    layers = hf.model.layers
    d = hf.config.head_dim
    out = torch.zeros(len(prompts), len(heads), dtype=torch.float64)
    for p, (ids, ans) in enumerate(zip(prompts.ids, prompts.answer, strict=True)):
        x = torch.tensor([ids])
        with torch.no_grad():
            p0 = torch.softmax(hf(input_ids=x).logits[0, -1].double(), -1)[ans]
        for k, (la, h) in enumerate(heads):

            def pre(mod, args, la=la, h=h):
                y = args[0].clone()
                y[0, -1, h * d : (h + 1) * d] = means[la, h]
                return (y,)

            hook = layers[la].self_attn.o_proj.register_forward_pre_hook(pre)
            try:
                with torch.no_grad():
                    p1 = torch.softmax(hf(input_ids=x).logits[0, -1].double(), -1)[ans]
            finally:
                hook.remove()
            out[p, k] = p1 - p0
    return out


@pytest.fixture(scope="module")
def capital_prompts(smollm2):
    task = icl.icl_task("country-capital")
    clean = icl.build_prompts(smollm2, task, 6, "clean", seed=1)
    shuffled = icl.build_prompts(smollm2, task, 2, "shuffled", seed=2)
    return clean, shuffled


def test_indirect_effects_equal_a_plain_hooks_oracle_on_smollm2(smollm2, capital_prompts):
    clean, shuffled = capital_prompts
    means = fv.mean_outputs(smollm2, clean)
    heads = [(0, 0), (9, 4), (15, 2), (20, 5), (29, 8)]
    got, base = fv.indirect_effects(smollm2, shuffled, means, heads, jobs_per_forward=3)
    want = _oracle_effects(smollm2, shuffled, means, heads)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert got.abs().max() > 1e-4  # the heads move the answer: the check has teeth
    assert ((base > 0) & (base < 1)).all()


class _Own:
    """Records each layer's head outputs at the (only) position of a cached last-token run."""

    def __init__(self):
        self.z = {}

    def before(self, call: AttentionCall) -> AttentionCall:
        return call

    def after(self, call, out):
        self.z[call.layer] = out[0, -1].detach().clone()
        return out


def test_a_head_given_its_own_output_changes_nothing(smollm2, capital_prompts):
    """Every head's effect is 0 (to float32 rounding: under 1e-5, the oracle test's tolerance;
    a wrong head or position moves the answer by far more) when its mean output is its own
    output on the prompt."""
    _, shuffled = capital_prompts
    one = icl.IclPrompts("t", "shuffled", shuffled.ids[:1], shuffled.answer[:1], [0], [[]])
    own = _Own()
    smollm2.run_last(smollm2.prefix_cache(one.ids[0][:-1]), one.ids[0][-1], 1, [own])
    means = torch.stack([own.z[la] for la in range(smollm2.n_layers)])
    ie, _ = fv.indirect_effects(smollm2, one, means)
    # float32 rounding only: a batch of 96 copies rounds the last bits unlike a batch of one
    assert float(ie.abs().max()) < 1e-5
    # its own output from the full forward: the same
    _, _, z = fv.last_position(smollm2, one, outputs=True)
    ie_full, _ = fv.indirect_effects(smollm2, one, z[0])
    assert float(ie_full.abs().max()) < 1e-5


def test_the_cached_last_position_equals_the_full_forward(smollm2, capital_prompts):
    _, shuffled = capital_prompts
    ids = shuffled.ids[0]
    full = smollm2.run(torch.tensor([ids]), output="logits")[0, -1]
    cache = smollm2.prefix_cache(ids[:-1])
    length = cache.get_seq_length()
    cached = smollm2.run_last(cache, ids[-1], 3)
    for row in cached:
        torch.testing.assert_close(row, full, atol=1e-4, rtol=1e-5)
    # the prefix's cache is left as it was: a second run reads the same keys and values
    assert cache.get_seq_length() == length
    torch.testing.assert_close(smollm2.run_last(cache, ids[-1], 3), cached, atol=0, rtol=0)


def test_a_planted_head_carries_the_task_in_closed_form():
    """A tiny Llama in which only head 0 of layer 0 writes to the stream (every other head's
    output projection and every MLP's down projection zero): the last position's stream is its
    token's embedding plus that head's write, so its effect is, on paper,

        softmax(W_U norm(e + W_O m))[answer] - softmax(W_U norm(e + W_O z))[answer]

    with m its mean output and z its own output there; every other head's effect is exactly 0.
    The mean output is planted to write the answer's unembedding direction, so the head carries
    the task: its effect is large."""
    import headscope
    from tests.tiny_models import tiny_llama

    hf, tok = tiny_llama(n_layer=2, n_head=4, n_kv_head=2, hidden=32, seed=3)
    d = hf.config.head_dim
    with torch.no_grad():
        for la, layer in enumerate(hf.model.layers):
            layer.mlp.down_proj.weight.zero_()
            keep = layer.self_attn.o_proj.weight[:, :d].clone()
            layer.self_attn.o_proj.weight.zero_()
            if la == 0:
                layer.self_attn.o_proj.weight[:, :d] = keep
        hf.model.norm.weight.fill_(400.0)  # sharp logits: a direction can win the softmax
    model = headscope.load_model(hf, tok, name="planted")
    ids = [[model.bos_id, 5, 9, 13, 5, 9], [model.bos_id, 7, 8, 21, 7, 8]]
    answers = [13, 21]
    prompts = icl.IclPrompts("t", "shuffled", ids, answers, [0, 1], [[], []])
    w_o = hf.model.layers[0].self_attn.o_proj.weight[:, :d].detach().double()
    w_u = hf.lm_head.weight.detach().double()
    # plant: the mean output whose write is the first answer's unembedding direction, scaled up
    m = torch.linalg.lstsq(w_o, 8 * w_u[answers[0]] / w_u[answers[0]].norm()).solution
    means = torch.zeros(model.n_layers, model.n_heads, d)
    means[0, 0] = m.float()
    _, _, z = fv.last_position(model, prompts, outputs=True)
    heads = [(la, h) for la in range(2) for h in range(4)]
    ie, _ = fv.indirect_effects(model, prompts, means, heads)
    norm = hf.model.norm
    eps, g = norm.variance_epsilon, norm.weight.detach().double()

    def prob(stream, ans):
        x = stream / torch.sqrt(stream.pow(2).mean() + eps) * g
        return torch.softmax(w_u @ x, -1)[ans]

    for p, (row, ans) in enumerate(zip(ids, answers, strict=True)):
        e = hf.model.embed_tokens.weight[row[-1]].detach().double()
        own = z[p, 0, 0].double()
        want = prob(e + w_o @ m, ans) - prob(e + w_o @ own, ans)
        assert abs(float(ie[p, 0]) - float(want)) < 1e-5
        assert float(ie[p, 1:].abs().max()) == 0.0  # every other head writes nothing
    assert float(ie[0, 0]) > 0.5  # the planted head carries the first prompt's answer


def test_refused_in_one_line(tiny_bert, smollm2, capital_prompts):
    clean, _ = capital_prompts
    with pytest.raises(HeadscopeError, match="is an encoder"):
        fv.check_model(tiny_bert)
    means = torch.zeros(smollm2.n_layers, smollm2.n_heads, 64)
    with pytest.raises(HeadscopeError, match="outside"):
        fv.indirect_effects(smollm2, clean, means, [(30, 0)])


def test_the_function_vector_and_its_addition_equal_plain_hooks(smollm2, capital_prompts):
    """The vector is each head's mean output through its slice of o_proj, summed; adding it after
    block l at the last position equals a full forward of an eager copy with a plain forward hook
    on that block."""
    clean, shuffled = capital_prompts
    means = fv.mean_outputs(smollm2, clean)
    heads = [(9, 4), (15, 2), (20, 5)]
    vec = fv.function_vector(smollm2, means, heads)
    o = [smollm2.hf.model.layers[la].self_attn.o_proj.weight.detach().double() for la, _ in heads]
    d = smollm2.hf.config.head_dim
    want = sum(w[:, h * d : (h + 1) * d] @ means[la, h].double()
               for w, (la, h) in zip(o, heads, strict=True))  # fmt: skip
    torch.testing.assert_close(vec.double(), want, atol=1e-5, rtol=1e-5)
    vectors = torch.stack([vec * 4, torch.zeros_like(vec)])
    got = fv.added_at_layer(smollm2, shuffled, vectors, 10, jobs_per_forward=2)
    hf = copy.deepcopy(smollm2.hf)
    hf.set_attn_implementation("eager")
    for p, (ids, ans) in enumerate(zip(shuffled.ids, shuffled.answer, strict=True)):

        def hook(mod, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            hidden = hidden.clone()
            hidden[0, -1] += 4 * vec
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        handle = hf.model.layers[10].register_forward_hook(hook)
        try:
            with torch.no_grad():
                pr = torch.softmax(hf(input_ids=torch.tensor([ids])).logits[0, -1].double(), -1)
        finally:
            handle.remove()
        assert abs(float(pr[ans]) - float(got["prob"][p, 0])) < 1e-5
        assert abs(float(got["prob"][p, 1]) - float(got["base_prob"][p])) < 1e-6
    assert (got["prob"][:, 0] - got["base_prob"]).abs().max() > 1e-4


def test_the_cached_last_position_with_a_sliding_window(tiny_gemma3_dir):
    """Tiny Gemma 3: layer 0 sees a window of 4, so its cache keeps the last 3 keys; the last
    position read through it equals the full forward, and the cache is left as it was."""
    import headscope

    model = headscope.load_model(str(tiny_gemma3_dir))
    ids = [model.bos_id, *range(5, 17)]
    full = model.run(torch.tensor([ids]), output="logits")[0, -1]
    cache = model.prefix_cache(ids[:-1])
    first = model.run_last(cache, ids[-1], 2)
    torch.testing.assert_close(first[1], full, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(model.run_last(cache, ids[-1], 2), first, atol=0, rtol=0)
