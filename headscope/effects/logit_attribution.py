"""Direct logit attribution (DLA) of every head at the last position (docs/patching.md).

Head h of layer l writes ``c = z_h W_O^h`` into the residual stream (its output through its slice of
the output projection; the projection's bias belongs to no head). Its direct logit attribution is
that vector carried to the logits as if nothing after it reacted:

    dla = N_frozen(c) . (W_U[answer] - W_U[wrong])

where ``N_frozen`` is each norm on the way with its scale *frozen at its value in the same run*,
which makes it linear (the choice TransformerLens makes for ``cache.apply_ln_to_stack``):

* the final norm: RMSNorm ``x -> x * g / s``, with ``s`` the run's root-mean-square of the final
  residual at the last position and ``g`` the norm's effective gain, read by applying the module to
  a constant vector, so Llama's ``weight`` and Gemma's ``1 + weight`` are both what the module does;
  LayerNorm ``x -> (x - mean(x)) * w / sigma`` (centring is linear; the bias belongs to no head);
* Gemma 2/3's norm on the attention output (``post_attention_layernorm``, in blocks that also have
  ``pre_feedforward_layernorm``), frozen the same way at that layer's attention output.

Each frozen scale is read off the module's own input and output (``s = |x g|^2 / <x g, y>``), so no
epsilon has to be copied. A final logit soft-cap (Gemma 2) is not applied: DLA is in the units of
the logits before the cap (gemma3-270m and smollm2-135m have none). The frozen maps are linear, so
contributions add: a layer's heads sum to the DLA of its whole attention output (plus the output
projection's bias where it has one; ``tests/effects/test_logit_attribution.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.effects.patching import Batch
from headscope.effects.stages import explicit_handler
from headscope.errors import HeadscopeError

_OUT_PROJ = ("o_proj", "c_proj", "out_proj", "dense")
_FINAL_NORM = ("norm", "ln_f", "final_layernorm", "norm_f", "final_layer_norm")


def output_projection(model, layer: int):
    """The module that reads the concatenated head outputs of ``layer``'s attention."""
    blk = model.blocks()[layer]
    for mod in blk.modules():
        if getattr(mod, "layer_idx", None) == layer and "Attention" in type(mod).__name__:
            for name in _OUT_PROJ:
                if isinstance(getattr(mod, name, None), torch.nn.Module):
                    return getattr(mod, name)
    raise HeadscopeError(
        f"{model.name}: no output projection ({', '.join(_OUT_PROJ)}) found in layer {layer}'s "
        "attention; direct logit attribution cannot read its heads."
    )


def final_norm(model):
    base = model.hf.base_model
    for name in _FINAL_NORM:
        mod = getattr(base, name, None)
        if isinstance(mod, torch.nn.Module):
            return mod
    raise HeadscopeError(
        f"{model.name}: no final norm ({', '.join(_FINAL_NORM)}) found on the base model."
    )


def post_attention_norm(model, layer: int):
    """Gemma 2/3's norm on the attention output, or None (Llama's ``post_attention_layernorm`` is
    the pre-MLP norm: a block with that name *and* ``pre_feedforward_layernorm`` is Gemma-style)."""
    blk = model.blocks()[layer]
    if hasattr(blk, "pre_feedforward_layernorm") and hasattr(blk, "post_attention_layernorm"):
        return blk.post_attention_layernorm
    return None


def _rms_gain(norm, d: int, like: Tensor) -> Tensor:
    c = 1e3  # N(c 1) = c g / sqrt(c^2 + eps): g to ~1e-12
    return norm(torch.full((1, d), c, dtype=like.dtype, device=like.device))[0].double() / c


def _freeze(norm, x: Tensor, y: Tensor):
    """The linear map ``v -> N_frozen(v)`` of a norm at input ``x`` / output ``y`` (``[b, d]``)."""
    if isinstance(norm, torch.nn.LayerNorm):
        xc = x.double() - x.double().mean(-1, keepdim=True)
        sigma = (xc.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()  # [b, 1]
        w = norm.weight.double() if norm.weight is not None else 1.0
        return lambda v: (v - v.mean(-1, keepdim=True)) * w / sigma[:, None]
    if "RMSNorm" not in type(norm).__name__:
        raise HeadscopeError(
            f"Direct logit attribution knows RMSNorm and LayerNorm, not {type(norm).__name__}."
        )
    g = _rms_gain(norm, x.shape[-1], x)  # [d_model]
    xg = x.double() * g
    s = (xg * xg).sum(-1, keepdim=True) / (xg * y.double()).sum(-1, keepdim=True)  # [b, 1]
    return lambda v: v * g / s[:, None]


def direct_logit_attribution(
    model, batches: Sequence[Batch], n_pairs: int, prompt: str = "clean"
) -> Float[Tensor, "pair layer head"]:
    """Per pair, every head's DLA at the last position of the ``prompt`` side, float64."""
    out = torch.full((n_pairs, model.n_layers, model.n_heads), torch.nan, dtype=torch.float64)
    W_U = model.hf.get_output_embeddings().weight  # [vocab, d_model]
    H, d = model.n_heads, model.d_head
    for batch in batches:
        b = len(batch.index)
        last = batch.lengths - 1
        rows = torch.arange(b)
        acts: dict = {}
        blocks: dict = {}
        post_io: dict = {}
        handles = []
        for layer in range(model.n_layers):
            norm = post_attention_norm(model, layer)
            if norm is not None:

                def hook(mod, args, y, layer=layer, post_io=post_io, rows=rows, last=last):
                    post_io[layer] = (
                        args[0][rows, last].detach(),
                        y[rows, last].detach(),
                    )  # [b, d_model] each

                handles.append(norm.register_forward_hook(hook))
        try:
            hidden = model.run(
                batch.tokens(prompt),
                batch.mask,
                handler=explicit_handler(acts, ("z",)),
                output="hidden",
                keep_blocks=blocks,
            )
        finally:
            for h in handles:
                h.remove()
        with torch.no_grad():
            final = _freeze(
                final_norm(model), blocks[model.n_layers - 1][rows, last], hidden[rows, last]
            )
            direction = (W_U[batch.answer] - W_U[batch.wrong]).double()  # [b, d_model]
            for layer in range(model.n_layers):
                z = acts[layer]["z"][rows, last]  # [b, head, d_head]
                eye = torch.eye(H, dtype=z.dtype, device=z.device)
                alone = (z[:, None, :, :] * eye[None, :, :, None]).reshape(
                    b * H, H * d
                )  # row (i, h): head h only
                proj = output_projection(model, layer)
                c = (
                    (proj(alone) - proj(torch.zeros_like(alone[:1]))).double().view(b, H, -1)
                )  # [b, head, d_model]
                if layer in post_io:
                    post = _freeze(post_attention_norm(model, layer), *post_io[layer])
                    c = post(c)
                out[batch.index, layer] = (
                    (final(c) * direction[:, None, :]).sum(-1).cpu()
                )  # [b, head]
    return out
