"""Tiny models and random tasks for the patching tests (tests/effects, tests/apps, tests/cli, ...):
a random Llama with grouped-query attention (float32 and float64), and random token tasks."""

from __future__ import annotations

import copy

import torch


def tiny_gqa_llama_model():
    """A random Llama with grouped-query attention: 4 query heads share 2 KV heads, 3 layers."""
    import headscope
    from tests.tiny_models import tiny_llama

    hf, tok = tiny_llama(n_layer=3, n_ctx=64)
    with torch.no_grad():  # sharper attention than random init gives, so patterns and keys matter
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
    return headscope.load_model(hf, tok, name="tiny-gqa-llama")


def float64_copy(model):
    """The same Llama in float64 throughout, for finite differences without float32 noise (Llama's
    RMSNorm computes in float32 whatever its input; here its instances compute in float64)."""
    import headscope

    hf = copy.deepcopy(model.hf).double()
    for mod in hf.modules():
        if type(mod).__name__ == "LlamaRMSNorm":

            def forward(x, mod=mod):
                return (
                    mod.weight
                    * x
                    * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + mod.variance_epsilon)
                )

            mod.forward = forward
    return headscope.load_model(hf, model.tokenizer, name="tiny-gqa-llama-f64")


def random_task(model, n_pairs=5, length=9, n_changed=2, seed=0, lengths=None, metric="logit_diff"):
    """A TokenizedTask of random ordinary tokens: corrupt = clean with ``n_changed`` positions
    (never 0) redrawn; named position X = the first changed one. ``lengths``: one per pair."""
    from headscope.probes.tasks import TokenizedTask

    g = torch.Generator().manual_seed(seed)
    vocab = model.ordinary_vocab()
    pick = lambda k: vocab[torch.randint(len(vocab), (k,), generator=g)].tolist()  # noqa: E731
    clean, corrupt, answer, wrong, x = [], [], [], [], []
    for i in range(n_pairs):
        n = lengths[i] if lengths else length
        c = [model.bos_id, *pick(n - 1)]
        k = list(c)
        where = sorted(torch.randperm(n - 1, generator=g)[:n_changed].add(1).tolist())
        for p, t in zip(where, pick(len(where)), strict=True):
            k[p] = t if t != c[p] else (t + 1)
        a, w = pick(2)
        clean.append(c)
        corrupt.append(k)
        answer.append(a)
        wrong.append(w if w != a else a + 1)
        x.append(where[0])
    return TokenizedTask("random", clean, corrupt, answer, wrong, {"X": x}, metric)
