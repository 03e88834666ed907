"""Exact edge patching recomputed with plain transformers hooks: no headscope code (a GPT-2 or a
Llama-style model, named modules, one forward per edge).

For an edge writer -> reader and a pair (noising): every writer's value is taken from a clean and
a corrupt forward (block 0's input; a head's slice of the output projection's input times its
slice of the projection's weight; an MLP's output), ``delta = clean - corrupt``, and the clean
prompt is run again with the reader alone reading ``stream - delta``: for a query, key or value,
the projection's output slice of that head is recomputed from ``norm(stream - delta)``; for an
MLP, its norm's input is shifted; for the logits, the final norm's input.
"""

from __future__ import annotations

import torch


def _parts(hf):
    """(blocks, per block: ln1, ln2, q, k, v, o, mlp; final norm; fused GPT-2 c_attn?)"""
    if hasattr(hf, "transformer"):  # GPT-2
        blocks = list(hf.transformer.h)
        return (
            blocks,
            [
                dict(ln1=b.ln_1, ln2=b.ln_2, qkv=b.attn.c_attn, o=b.attn.c_proj, mlp=b.mlp)
                for b in blocks
            ],
            hf.transformer.ln_f,
        )
    blocks = list(hf.model.layers)
    return (
        blocks,
        [
            dict(
                ln1=b.input_layernorm,
                ln2=b.post_attention_layernorm,
                q=b.self_attn.q_proj,
                k=b.self_attn.k_proj,
                v=b.self_attn.v_proj,
                o=b.self_attn.o_proj,
                mlp=b.mlp,
            )
            for b in blocks
        ],
        hf.model.norm,
    )


def _head_write(part, z, h, d_head):
    o = part["o"]
    zs = z[..., h * d_head : (h + 1) * d_head]
    if "qkv" in part:  # Conv1D: x @ W, W [in, out]
        return zs @ o.weight[h * d_head : (h + 1) * d_head]
    return zs @ o.weight[:, h * d_head : (h + 1) * d_head].T


def writers(hf, tokens, d_head):
    """``{("embed",), ("head", l, h), ("mlp", l): [b, pos, d_model]}`` of one forward."""
    blocks, parts, _ = _parts(hf)
    got, handles = {}, []
    handles.append(
        blocks[0].register_forward_pre_hook(
            lambda m, a, k: got.__setitem__(("embed",), (a[0] if a else k["hidden_states"])),
            with_kwargs=True,
        )
    )
    for la, p in enumerate(parts):
        handles.append(
            p["o"].register_forward_pre_hook(lambda m, a, la=la: got.__setitem__(("z", la), a[0]))
        )
        handles.append(
            p["mlp"].register_forward_hook(lambda m, a, o, la=la: got.__setitem__(("mlp", la), o))
        )
    try:
        with torch.no_grad():
            hf(input_ids=tokens)
    finally:
        for h in handles:
            h.remove()
    n_heads = got[("z", 0)].shape[-1] // d_head
    for la, p in enumerate(parts):
        z = got.pop(("z", la))
        for h in range(n_heads):
            got[("head", la, h)] = _head_write(p, z, h, d_head)
    return got


def patched_metric(hf, tokens, answer, wrong, writer, reader, delta, d_head):
    """The metric of ``tokens`` with ``reader`` (``("q"|"k"|"v", layer, head)``, ``("mlp",
    layer)`` or ``("logits",)``) reading its input minus ``delta`` ``[b, pos, d_model]``."""
    blocks, parts, final = _parts(hf)
    handles = []
    if reader[0] == "logits":
        handles.append(final.register_forward_pre_hook(lambda m, a: (a[0] - delta, *a[1:])))
    elif reader[0] == "mlp":
        p = parts[reader[1]]
        handles.append(p["ln2"].register_forward_pre_hook(lambda m, a: (a[0] - delta, *a[1:])))
    else:
        kind, la, h = reader
        p = parts[la]
        seen = {}
        handles.append(p["ln1"].register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0])))
        if "qkv" in p:
            d = p["qkv"].weight.shape[0]
            off = {"q": 0, "k": d, "v": 2 * d}[kind] + h * d_head
            proj = p["qkv"]
        else:
            off = h * d_head
            proj = p[kind]

        def swap(m, a, out):
            with torch.no_grad():
                # the modules' own forwards: their hooks (this one among them) stay out of it
                x = type(p["ln1"]).forward(p["ln1"], seen["x"] - delta)
                y = type(proj).forward(proj, x)
            out = out.clone()
            out[..., off : off + d_head] = y[..., off : off + d_head]
            return out

        handles.append(proj.register_forward_hook(swap))
    try:
        with torch.no_grad():
            logits = hf(input_ids=tokens).logits[:, -1]
    finally:
        for hd in handles:
            hd.remove()
    rows = torch.arange(len(tokens))
    return (logits[rows, answer] - logits[rows, wrong]).double()


def edge_effects(hf, clean, corrupt, answer, wrong, edges, d_head):
    """Noising, per edge ``(writer, reader)``: the metric of ``clean`` with the edge reading the
    corrupt writer, minus the clean metric (``[row]`` each)."""
    wc = writers(hf, clean, d_head)
    wr = writers(hf, corrupt, d_head)
    zero = torch.zeros_like(wc[("embed",)])
    base = patched_metric(hf, clean, answer, wrong, None, ("logits",), zero, d_head)
    return [
        patched_metric(hf, clean, answer, wrong, w, r, wc[w] - wr[w], d_head) - base
        for w, r in edges
    ]
