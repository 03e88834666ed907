"""The [SEP] / BOS no-op test against an independent oracle: HF eager attention, patched by hand."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

from headscope.effects.noop import drop_keys, noop_effects, removed_keys
from headscope.models.attention import AttentionCall
from headscope.probes.pairs import text_probe


def test_drop_keys_renormalises_the_row_and_spares_a_row_with_nothing_else():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=gen) for _ in range(3))  # [batch, head, pos, dim]

    def compute(call):  # plain softmax attention with the call's boolean mask
        s = call.query @ call.key.transpose(-1, -2) * call.scale
        s = s.masked_fill(~call.full_mask(), float("-inf"))
        return (s.softmax(-1) @ call.value).transpose(1, 2)  # [batch, query, head, dim]

    call = AttentionCall(
        layer=0, query=q, key=k, value=v, mask=None, scale=0.5, causal=True, compute=compute
    )
    A = (
        (q @ k.transpose(-1, -2) * 0.5)
        .masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
        .softmax(-1)
    )
    keys = torch.zeros(1, 5, dtype=torch.bool)
    keys[0, 0] = True
    out = drop_keys(0, torch.tensor([1]), keys).before(call).output()  # head 1 loses key 0
    want = A.clone()
    want[0, 1, 1:, 0] = 0
    want[0, 1, 1:] /= want[0, 1, 1:].sum(-1, keepdim=True)  # renormalised over the other keys
    torch.testing.assert_close(
        out, (want @ v).transpose(1, 2)
    )  # query 0 of head 1: unchanged (only key 0)
    torch.testing.assert_close(out[:, :, 0], call.output()[:, :, 0])  # head 0 untouched


@contextlib.contextmanager
def patched_eager(module_name: str, layer: int, head: int, drop: torch.Tensor):
    """HF's own eager attention, with head ``head`` of ``layer`` barred from the keys ``drop``
    ``[batch, key]`` (rows that would see nothing else are left alone). Shares no headscope code."""
    import importlib

    mod = importlib.import_module(module_name)
    original = mod.eager_attention_forward

    def eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if module.layer_idx != layer:
            return original(
                module,
                query,
                key,
                value,
                attention_mask,
                scaling=scaling,
                dropout=dropout,
                **kwargs,
            )
        scaling = query.size(-1) ** -0.5 if scaling is None else scaling
        w = query @ key.transpose(-1, -2) * scaling  # [batch, head, query, key]
        if attention_mask is not None:
            w = w + attention_mask
        visible = w > torch.finfo(w.dtype).min / 2
        bar = drop[:, None, :].expand_as(w[:, head]) & visible[:, head]
        keeps_some = (visible[:, head] & ~bar).any(-1, keepdim=True)
        w[:, head] = w[:, head].masked_fill(bar & keeps_some, float("-inf"))
        p = w.softmax(-1)
        return (p @ value).transpose(1, 2), p

    mod.eager_attention_forward = eager
    try:
        yield
    finally:
        mod.eager_attention_forward = original


def oracle(folder, model, probe, layer, head):
    """Per sequence (one at a time, no padding): the target change, by plain HF eager attention."""
    from transformers import AutoModel, AutoModelForCausalLM

    cls = AutoModelForCausalLM if model.causal else AutoModel
    hf = cls.from_pretrained(folder, attn_implementation="eager").eval()
    name = (
        "transformers.models.gpt2.modeling_gpt2"
        if model.causal
        else "transformers.models.bert.modeling_bert"
    )
    out = []
    for ids in probe.sequences:
        x = torch.tensor([ids])
        drop = torch.zeros(1, len(ids), dtype=torch.bool)
        if model.causal:
            drop[0, 0] = True
        else:
            drop[0, 1:] = x[0, 1:] == model.sep_id

        def target(x=x):
            with torch.no_grad():
                if model.causal:
                    logits = hf(input_ids=x).logits[0, :-1]
                    return F.cross_entropy(logits.double(), x[0, 1:], reduction="sum")
                return hf(input_ids=x).last_hidden_state[0].mean(0).double()

        clean = target()
        with patched_eager(name, layer, head, drop):
            changed = target()
        out.append(
            float(changed - clean)
            if model.causal
            else float(1 - F.cosine_similarity(clean, changed, dim=0))
        )
    return out


@pytest.mark.parametrize("which", ["tiny_gpt2", "tiny_bert"])
def test_noop_effects_match_patched_hf_eager(which, request):
    model = request.getfixturevalue(which)
    folder = request.getfixturevalue(which + "_dir")
    probe = text_probe(model, n_prompts=5)
    got = noop_effects(
        model, probe, batch_size=3
    )  # padded batches, heads of a layer in one forward
    sizes = []
    for (layer, head), (sums, counts) in got.items():
        want = torch.tensor(oracle(folder, model, probe, layer, head), dtype=torch.float64)
        # float32 forwards, sdpa against eager: losses differ by ~1e-6 nats; 1 - cos is second order
        # in the change of the embedding (~1e-4 relative on a random tiny BERT), so its noise is
        # relative
        tol = dict(rtol=1e-3, atol=1e-5) if model.causal else dict(rtol=2e-2, atol=1e-12)
        torch.testing.assert_close(sums, want, **tol)
        sizes.append(float(want.abs().max()))
        assert counts.tolist() == [len(s) - 1 if model.causal else 1 for s in probe.sequences]
    floor = 1e-3 if model.causal else 1e-9
    assert sorted(sizes)[len(sizes) // 2] > floor  # the effects are far larger than the tolerance
    keys = removed_keys(
        model,
        torch.tensor([probe.sequences[0]]),
        torch.ones(1, len(probe.sequences[0]), dtype=torch.bool),
    )
    assert int(keys.sum()) == (1 if model.causal else probe.sequences[0][1:].count(model.sep_id))
