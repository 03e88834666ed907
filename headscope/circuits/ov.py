"""What a head writes when it attends to one position, read through the unembedding.

Shared by the successor and copy-suppression scores. Everything a head reads is taken from the
model's own forward at the attention seam (:mod:`headscope.models.attention`), so every norm is the
model's own (Gemma's ``x (1 + w)`` RMSNorm included) and nothing is re-derived from weights:

* **values** ``v_h(x)``: the ``value`` tensor of the layer's :class:`AttentionCall` (after the
  layer's own input norm and projection, value bias included where the model has one); with a
  single key, a head's output is exactly its value there;
* **head output** in the residual stream: ``v_h W_O[h]`` (``W_O``:
  :meth:`~headscope.models.model.Model.output_weights`), times the gain of a post-attention norm
  where the block has one before the residual add (Gemma 2/3's sandwich norms, found by their
  ``pre_feedforward_layernorm``); that norm's division by the RMS is one positive factor per
  position and changes no rank, so it is dropped;
* **readout** ``U``: the unembedding with the final norm's gain folded in (``diag(g) W_U``; for a
  LayerNorm the head output is centred first); biases dropped (they do not depend on the input),
  the final norm's division dropped (a positive factor). ``readout="embeddings"`` reads through
  the input embedding matrix instead (``W_E^T``): the only readout an encoder without a trained
  LM head has, and not an unembedding (reports say so).

Gains are read by applying a norm module to a vector of ones (an RMS norm of ones is its gain).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall, StopForward

READOUTS = ("unembedding", "embeddings")


def _gain(norm, d_model: int) -> Tensor:
    with torch.no_grad():
        p = next(norm.parameters())
        return (
            norm(torch.ones(1, d_model, dtype=p.dtype, device=p.device)).float().cpu()[0]
        )  # [d_model]


def output_gains(model) -> Float[Tensor, "layer d_model"] | None:
    """Per layer, the gain of a post-attention norm applied before the residual add (None: none)."""
    blocks = model.blocks()
    if not all(
        hasattr(b, "pre_feedforward_layernorm") and hasattr(b, "post_attention_layernorm")
        for b in blocks
    ):
        return None
    return torch.stack([_gain(b.post_attention_layernorm, model.d_model) for b in blocks])


def readout(model, kind: str = "unembedding") -> tuple[Float[Tensor, "d_model vocab"], bool]:
    """``(U, centre)``: the readout matrix (float32, CPU) and whether head outputs are centred
    first."""
    if kind not in READOUTS:
        raise HeadscopeError(f"Unknown readout '{kind}'; use one of {', '.join(READOUTS)}.")
    hf = model.hf
    if kind == "embeddings":
        return hf.get_input_embeddings().weight.detach().float().cpu().T.contiguous(), False
    if not model.causal or hf.get_output_embeddings() is None:
        raise HeadscopeError(
            f"{model.name} has no trained unembedding to read a head's output through (an "
            "encoder's masked-LM head is missing or random); use readout='embeddings' to read "
            "through its input embeddings instead (not an unembedding)."
        )
    W_U = hf.get_output_embeddings().weight.detach().float().cpu().T  # [d_model, vocab]
    base = hf.base_model
    norm = next(
        (
            getattr(base, n)
            for n in ("norm", "ln_f", "final_layernorm", "final_layer_norm")
            if hasattr(base, n)
        ),
        None,
    )
    if norm is None:
        return W_U.contiguous(), False
    centre = isinstance(norm, torch.nn.LayerNorm)
    gain = norm.weight.detach().float().cpu() if centre else _gain(norm, model.d_model)
    return (gain[:, None] * W_U).contiguous(), centre


def values(
    model, tokens: Tensor, layers, resume: tuple[int, Tensor] | None = None
) -> dict[int, Tensor]:
    """``{layer: [batch, head, pos, d_head]}``: each query head's value at every position (GQA:
    query head ``h`` reads KV head ``h // g``), from one forward of ``tokens`` (``[batch, pos]``),
    or from block ``resume[0]`` on with ``resume[1]`` as its input residual stream."""
    wanted, last, got = set(layers), max(layers), {}

    def grab(call: AttentionCall) -> Tensor:
        if call.layer in wanted:
            v = call.value.detach().float().cpu()  # [batch, kv_head, pos, d_head]
            got[call.layer] = v.repeat_interleave(call.group, dim=1)  # [batch, head, pos, d_head]
            if call.layer == last:
                raise StopForward
        return call.output()

    model.run(tokens, handler=grab, resume=resume)
    return got


def effective_embeddings(model, ids: Tensor) -> tuple[Float[Tensor, "n d_model"], Tensor]:
    """``(e, v0)``: for each token id alone (a one-token sequence, no BOS), the residual stream
    after block 0 (embedding + layer-0 attention, which on one token attends to itself + MLP0),
    and layer 0's values ``[n, head, d_head]`` (what layer-0 heads read: the embedding itself)."""
    kept: dict[int, Tensor] = {}
    tokens = ids.view(-1, 1)  # [n, 1]
    got: dict[int, Tensor] = {}

    def grab(call: AttentionCall) -> Tensor:
        if call.layer == 0:
            got[0] = call.value.detach().float().cpu().repeat_interleave(call.group, dim=1)[:, :, 0]
        return call.output()

    model.run(tokens, handler=grab, keep_blocks=kept)
    return kept[0].float().cpu()[:, 0], got[0]  # [n, d_model], [n, head, d_head]


def head_logits(
    z: Float[Tensor, "n d_head"],
    W_O: Float[Tensor, "d_head d_model"],
    U: Float[Tensor, "d_model vocab"],
    gain: Tensor | None = None,
    centre: bool = False,
) -> Float[Tensor, "n vocab"]:
    """One head's direct logits ``(z W_O) * gain`` (centred for a LayerNorm) read through ``U``."""
    W = W_O if gain is None else W_O * gain[None, :]  # [d_head, d_model]
    if centre:
        W = W - W.mean(-1, keepdim=True)  # centring a sum is centring each term
    d_head, d_model = W.shape
    if d_head * d_model + len(z) * d_head < len(z) * d_model:  # many inputs: fold W into U once
        return z @ (W @ U)  # [n, d_head] @ [d_head, vocab]
    return (z @ W) @ U  # [n, vocab]
