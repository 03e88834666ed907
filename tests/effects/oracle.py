"""Effects recomputed with plain transformers: forward pre-hooks on each layer's output projection,
one sequence at a time, no padding. Shares no code with headscope.effects.heads or the attention
seam."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def output_projection(hf, layer: int):
    """The module whose input is the concatenated per-head attention outputs ``[.., head *
    dim]``."""
    name = type(hf).__name__
    if name.startswith("GPT2"):
        return hf.transformer.h[layer].attn.c_proj
    if name.startswith("Bert"):
        return hf.bert.encoder.layer[layer].attention.output.dense
    return hf.model.layers[layer].self_attn.o_proj  # Llama, Gemma, Qwen, ...


def _forward(hf, ids, hidden: bool, types=None):
    tokens = torch.tensor([ids])
    extra = {} if types is None else {"token_type_ids": torch.tensor([types])}
    with torch.no_grad():
        if hidden:
            return hf.base_model(input_ids=tokens, **extra).last_hidden_state[0]  # [pos, d_model]
        return hf(input_ids=tokens, **extra).logits[0]  # [pos, vocab]


def _types(token_types, sequences):
    return [None] * len(sequences) if token_types is None else token_types


def head_means(hf, sequences, n_layers, n_heads, d_head, token_types=None):
    """Mean of each head's slice of the projection's input over every position of every sequence
    (``token_types``: each sequence's segment ids, fed when given)."""
    sums = torch.zeros(n_layers, n_heads, d_head, dtype=torch.float64)
    count = 0
    handles = []
    for layer in range(n_layers):

        def pre(module, args, layer=layer):
            sums[layer] += args[0][0].double().reshape(-1, n_heads, d_head).sum(0)

        handles.append(output_projection(hf, layer).register_forward_pre_hook(pre))
    try:
        for ids, types in zip(sequences, _types(token_types, sequences), strict=True):
            _forward(hf, ids, hidden=False, types=types)
            count += len(ids)
    finally:
        for h in handles:
            h.remove()
    return sums / count


def target_sums(hf, sequences, target: str, repeat_len=None, token_types=None):
    """Per sequence: (summed CE over the target tokens, count), or the sentence embedding."""
    out = []
    for ids, types in zip(sequences, _types(token_types, sequences), strict=True):
        if target == "embedding":
            out.append(_forward(hf, ids, hidden=True, types=types).double().mean(0))
            continue
        logits = _forward(hf, ids, hidden=False, types=types).double()
        n = len(ids)
        ts = range(repeat_len + 2, 2 * repeat_len + 1) if target == "repeat_loss" else range(1, n)
        ce = [F.cross_entropy(logits[t - 1], torch.tensor(ids[t])) for t in ts]
        out.append((float(sum(ce)), len(ce)))
    return out


def ablated_effect(
    hf, sequences, target, layer, head, d_head, value, repeat_len=None, token_types=None
) -> float:
    """The pooled effect of replacing head ``head``'s slice by ``value`` at every position."""
    clean = target_sums(hf, sequences, target, repeat_len, token_types)

    def pre(module, args):
        x = args[0].clone()
        x[..., head * d_head : (head + 1) * d_head] = value.to(x.dtype)
        return (x,)

    handle = output_projection(hf, layer).register_forward_pre_hook(pre)
    try:
        ablated = target_sums(hf, sequences, target, repeat_len, token_types)
    finally:
        handle.remove()
    if target == "embedding":
        return float(
            sum(1 - F.cosine_similarity(a, b, dim=0) for a, b in zip(clean, ablated, strict=True))
            / len(clean)
        )
    return (sum(s for s, _ in ablated) - sum(s for s, _ in clean)) / sum(c for _, c in clean)
