"""Patching recomputed with plain transformers, one prompt at a time, no padding, float64 metrics.

Shares no code with headscope: it imports nothing from headscope (no attention seam, no effects,
no tasks), and reads the Hugging Face model (``model.hf``) directly.

* head outputs: a forward pre-hook on the layer's output projection records / overwrites the
  head's slice of its input (the model runs its own eager attention);
* q, k, v, pattern: every attention module's forward is replaced by a hand-written one (Llama-style
  with rotary, or GPT-2), which records and overwrites the wanted tensor.
"""

from __future__ import annotations

import contextlib
import math

import torch


def attention_module(hf, layer: int):
    if type(hf).__name__.startswith("GPT2"):
        return hf.transformer.h[layer].attn
    return hf.model.layers[layer].self_attn


def output_projection(hf, layer: int):
    attn = attention_module(hf, layer)
    return attn.c_proj if hasattr(attn, "c_proj") else attn.o_proj


def metric_of(logits_last: torch.Tensor, metric: str, answer: int, wrong: int) -> float:
    x = logits_last.double()
    if metric == "logit_diff":
        return float(x[answer] - x[wrong])
    logp = torch.log_softmax(x, -1)[answer]
    return float(logp.exp()) if metric == "prob" else float(-logp)


@contextlib.contextmanager
def eager(hf):
    old = hf.config._attn_implementation
    hf.set_attn_implementation("eager")
    try:
        yield
    finally:
        hf.set_attn_implementation(old)


def _last_logits(hf, ids) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids])).logits[0, -1]


# ------------------------------------------------------------------------------ head outputs (z)


def z_patched_metric(
    hf,
    n_heads: int,
    base_ids,
    source_ids,
    layer: int,
    head: int,
    positions,
    metric: str,
    answer: int,
    wrong: int,
) -> float:
    """The base prompt's metric with head ``head``'s slice of the o_proj input at ``positions``
    taken from the source prompt."""
    proj = output_projection(hf, layer)
    kept = {}

    def record(module, args):
        kept["z"] = args[0][0].clone()  # [pos, head * d]

    def write(module, args):
        x = args[0].clone()
        d = x.shape[-1] // n_heads
        for p in positions:
            x[0, p, head * d : (head + 1) * d] = kept["z"][p, head * d : (head + 1) * d]
        return (x,)

    with eager(hf):
        h = proj.register_forward_pre_hook(record)
        try:
            _last_logits(hf, source_ids)
        finally:
            h.remove()
        h = proj.register_forward_pre_hook(write)
        try:
            return metric_of(_last_logits(hf, base_ids), metric, answer, wrong)
        finally:
            h.remove()


def plain_metric(hf, ids, metric, answer, wrong) -> float:
    with eager(hf):
        return metric_of(_last_logits(hf, ids), metric, answer, wrong)


# ------------------------------------------------------------------------------ q, k, v, pattern


class HandAttention:
    """Replaces every attention module's forward by a hand-written attention for a ``with`` block.

    ``record``: ``{layer: {"q", "k", "v", "pattern"}}`` filled on each run (k, v per KV head);
    ``patch``: ``(layer, kind, kv_mode, head, positions, source)`` applied on the next run, where
    ``source`` is the recorded dict of another run's layer.
    """

    def __init__(self, hf):
        self.hf = hf
        self.record: dict = {}
        self.patch = None
        self.modules = [attention_module(hf, i) for i in range(hf.config.num_hidden_layers)]

    def __enter__(self):
        for i, m in enumerate(self.modules):
            m.forward = self._make(i, m)
        return self

    def __exit__(self, *exc):
        for m in self.modules:
            del m.forward

    def _make(self, layer, mod):
        gpt2 = hasattr(mod, "c_attn")

        def forward(hidden_states, *args, position_embeddings=None, **kwargs):
            b, n, _ = hidden_states.shape
            d = mod.head_dim
            if gpt2:
                q, k, v = mod.c_attn(hidden_states).split(mod.split_size, dim=2)
                q, k, v = (
                    t.view(b, n, -1, d).transpose(1, 2) for t in (q, k, v)
                )  # [b, head, pos, d]
                scale = 1 / math.sqrt(d) if mod.scale_attn_weights else 1.0
            else:
                from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

                q = mod.q_proj(hidden_states).view(b, n, -1, d).transpose(1, 2)
                k = mod.k_proj(hidden_states).view(b, n, -1, d).transpose(1, 2)
                v = mod.v_proj(hidden_states).view(b, n, -1, d).transpose(1, 2)
                cos, sin = position_embeddings
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
                scale = mod.scaling
            n_heads, n_kv = q.shape[1], k.shape[1]
            group = n_heads // n_kv
            p = self.patch if self.patch is not None and self.patch[0] == layer else None
            if p is not None and p[1] == "q":
                q = q.clone()
                q[0, p[3], p[4]] = p[5]["q"][0, p[3], p[4]]
            if p is not None and p[1] in ("k", "v") and p[2] == "group":  # the KV head itself
                t = (k if p[1] == "k" else v).clone()
                t[0, p[3], p[4]] = p[5][p[1]][0, p[3], p[4]]
                k, v = (t, v) if p[1] == "k" else (k, t)
            self.record.setdefault(layer, {}).update(
                q=q.detach().clone(), k=k.detach().clone(), v=v.detach().clone()
            )
            k_h = torch.stack([k[:, h // group] for h in range(n_heads)], 1)  # [b, head, pos, d]
            v_h = torch.stack([v[:, h // group] for h in range(n_heads)], 1)
            if (
                p is not None and p[1] in ("k", "v") and p[2] == "head"
            ):  # only what query head h reads
                src = p[5][p[1]][0, p[3] // group]  # [pos, d] of the source's KV head
                t = (k_h if p[1] == "k" else v_h).clone()
                t[0, p[3], p[4]] = src[p[4]]
                k_h, v_h = (t, v_h) if p[1] == "k" else (k_h, t)
            scores = (q.double() @ k_h.double().transpose(-1, -2)) * scale  # [b, head, q, k]
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
            pattern = torch.softmax(scores, -1)
            if p is not None and p[1] == "pattern":
                pattern = pattern.clone()
                pattern[0, p[3], p[4]] = p[5]["pattern"][0, p[3], p[4]].double()
            self.record[layer]["pattern"] = pattern.detach().clone()
            z = (pattern @ v_h.double()).to(hidden_states.dtype)  # [b, head, pos, d]
            z = z.transpose(1, 2).reshape(b, n, -1)
            out = mod.c_proj(z) if gpt2 else mod.o_proj(z)
            if gpt2:
                out = mod.resid_dropout(out)
            return out, None

        return forward


def qkv_patched_metric(
    hf,
    base_ids,
    source_ids,
    layer: int,
    kind: str,
    kv_mode: str,
    head: int,
    positions,
    metric: str,
    answer: int,
    wrong: int,
) -> float:
    """The base prompt's metric with query head ``head``'s q / pattern rows, or the k / v it reads
    (``kv_mode="head"``), or KV head ``head``'s k / v (``"group"``) at ``positions`` from the
    source."""
    with HandAttention(hf) as hand:
        with torch.no_grad():
            hf(input_ids=torch.tensor([source_ids]))
        source = hand.record[layer]
        hand.record = {}
        hand.patch = (layer, kind, kv_mode, head, list(positions), source)
        return metric_of(_last_logits(hf, base_ids), metric, answer, wrong)


def hand_metric(hf, ids, metric, answer, wrong) -> float:
    """The metric through the hand-written attention, nothing patched (it must match the model)."""
    with HandAttention(hf):
        return metric_of(_last_logits(hf, ids), metric, answer, wrong)


# ----------------------------------------------------------------------- direct logit attribution


def dla(hf, ids, answer: int, wrong: int, n_heads: int) -> torch.Tensor:
    """``[layer, head]``: each head's o_proj contribution at the last position, through the final
    norm with its scale from this run (RMSNorm: Llama weight or Gemma 1 + weight; LayerNorm), and
    Gemma's post-attention norm the same way, onto W_U[answer] - W_U[wrong]."""
    n_layers = hf.config.num_hidden_layers
    z, post_in, final_in = {}, {}, {}
    handles = []
    gpt2 = type(hf).__name__.startswith("GPT2")
    layers = hf.transformer.h if gpt2 else hf.model.layers
    for i in range(n_layers):
        handles.append(
            output_projection(hf, i).register_forward_pre_hook(
                lambda m, a, i=i: z.__setitem__(i, a[0][0, -1].double().clone())
            )
        )
        if hasattr(layers[i], "pre_feedforward_layernorm"):
            handles.append(
                layers[i].post_attention_layernorm.register_forward_pre_hook(
                    lambda m, a, i=i: post_in.__setitem__(i, a[0][0, -1].double().clone())
                )
            )
    handles.append(
        layers[-1].register_forward_hook(
            lambda m, a, o: final_in.__setitem__(
                "r", (o[0] if isinstance(o, tuple) else o)[0, -1].double().clone()
            )
        )
    )
    try:
        with eager(hf):
            _last_logits(hf, ids)
    finally:
        for h in handles:
            h.remove()
    W_U = hf.get_output_embeddings().weight.double()
    direction = W_U[answer] - W_U[wrong]
    r = final_in["r"]
    if gpt2:
        ln = hf.transformer.ln_f
        sigma = ((r - r.mean()).pow(2).mean() + ln.eps).sqrt()
        final = lambda c: (c - c.mean(-1, keepdim=True)) * ln.weight.double() / sigma  # noqa: E731
    else:
        norm = hf.model.norm
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        gemma = "Gemma" in type(norm).__name__
        w = (1 + norm.weight.double()) if gemma else norm.weight.double()
        s = (r.pow(2).mean() + eps).sqrt()
        final = lambda c: c * w / s  # noqa: E731
    out = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    for i in range(n_layers):
        proj = output_projection(hf, i)
        W = proj.weight.double()
        d = z[i].shape[0] // n_heads
        for h in range(n_heads):
            zh = z[i][h * d : (h + 1) * d]
            c = (
                zh @ W[h * d : (h + 1) * d] if gpt2 else W[:, h * d : (h + 1) * d] @ zh
            )  # Conv1D is [in, out]
            if i in post_in:
                pn = layers[i].post_attention_layernorm
                x = post_in[i]
                c = c * (1 + pn.weight.double()) / (x.pow(2).mean() + pn.eps).sqrt()
            out[i, h] = final(c) @ direction
    return out
