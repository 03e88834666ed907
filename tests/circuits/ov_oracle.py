"""An independent reading of a head's direct logits: plain Hugging Face modules, no headscope code.

For Llama, Gemma 3 and GPT-2 checkpoints: the residual stream entering block ``l`` (HF's own
``output_hidden_states``), the layer's input norm and value projection, the head's slice of the
output projection (Gemma: times its post-attention norm's gain ``1 + w``), the final norm's gain
(centring first for GPT-2's LayerNorm) and the LM head.
"""

import torch


def arch(hf) -> str:
    name = type(hf).__name__
    return "gpt2" if "GPT2" in name else "gemma" if "Gemma" in name else "llama"


def hidden(hf, tokens, index):
    """HF's hidden_states[index] (the input of block ``index``) for ``tokens`` ``[batch, pos]``."""
    with torch.no_grad():
        return hf(input_ids=tokens, output_hidden_states=True).hidden_states[index].float()


def head_logits(hf, x, layer, head):
    """``x`` ``[n, d_model]`` entering block ``layer``: head ``head``'s direct logits ``[n,
    vocab]``."""
    cfg = hf.config
    with torch.no_grad():
        if arch(hf) == "gpt2":
            blk = hf.transformer.h[layer]
            d = cfg.n_embd
            dh = d // cfg.n_head
            v = blk.attn.c_attn(blk.ln_1(x))[:, 2 * d :]  # [n, d] (Conv1D, bias included)
            z = v[:, head * dh : (head + 1) * dh]
            out = z @ blk.attn.c_proj.weight[head * dh : (head + 1) * dh, :]  # Conv1D: x @ W
            out = out - out.mean(-1, keepdim=True)
            return (out * hf.transformer.ln_f.weight) @ hf.lm_head.weight.T
        blk = hf.model.layers[layer]
        dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        g = cfg.num_attention_heads // cfg.num_key_value_heads
        v = blk.self_attn.v_proj(blk.input_layernorm(x))  # [n, kv * dh]
        z = v[:, (head // g) * dh : (head // g + 1) * dh]
        out = z @ blk.self_attn.o_proj.weight[:, head * dh : (head + 1) * dh].T  # [n, d_model]
        if arch(hf) == "gemma":
            out = out * (1 + blk.post_attention_layernorm.weight)
            return (out * (1 + hf.model.norm.weight)) @ hf.lm_head.weight.T
        return (out * hf.model.norm.weight) @ hf.lm_head.weight.T


def load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    ).eval()
