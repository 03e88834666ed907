"""Q-, K- and V-composition of an earlier head into a later one, read from the weights (Elhage et
al. 2021, "A Mathematical Framework for Transformer Circuits"), with a null of random senders.

Conventions (column vectors, one head ``h`` of layer ``l``; ``x`` the residual stream)::

    W_OV^h = W_O^h W_V^h          [d_model, d_model], rank d_head  (what h adds: W_OV^h x)
    W_QK^h = W_Q^h^T W_K^h        [d_model, d_model], rank d_head  (score = x_q^T W_QK^h x_k)

    Q-composition(s -> r) = ||W_QK^r^T W_OV^s||_F / (||W_QK^r||_F ||W_OV^s||_F)
    K-composition(s -> r) = ||W_QK^r   W_OV^s||_F / (||W_QK^r||_F ||W_OV^s||_F)
    V-composition(s -> r) = ||W_OV^r   W_OV^s||_F / (||W_OV^r||_F ||W_OV^s||_F)

for a sender ``s`` in an earlier layer than the receiver ``r``. Query head ``h`` reads KV head
``h // (n_heads / n_kv_heads)`` (grouped-query attention). Each score lies in [0, 1] and does not
change when either matrix is scaled.

What is folded into the weights (each head is read as it sits in its model):

* **a head's pre-attention norm** into its own ``W_Q``, ``W_K``, ``W_V`` (for a receiver and for a
  sender alike, since a sender's ``W_V`` reads its own normed input): the gain ``g`` as
  ``W diag(g)``, read from the norm module itself (Gemma's RMSNorm multiplies by ``1 + w``: that
  is the gain used); a LayerNorm also centres its input, so ``W diag(g) (I - 1 1^T / d_model)``;
* **a post-attention norm** (Gemma 2/3's sandwich norm, between the attention output and the
  residual add) into the sender's ``W_O``: ``diag(g_post) W_O``;
* **q_norm / k_norm** (Gemma 3, Qwen3: an RMSNorm over each head's query or key after the
  projection) into ``W_Q`` / ``W_K``: ``diag(g_q) W_Q``;
* dropped: every norm's division by the RMS (or standard deviation) of its input, one positive
  factor per position (per head for q_norm/k_norm) that the ratios above do not see; biases
  (they do not depend on the input); the softmax scale (one positive factor);
* **rotary embeddings are ignored**: they rotate the query and key by position-dependent angles,
  so the ``W_QK`` here is the one of two tokens at the same position (relative offset 0). For a
  rotary model, Q- and K-composition are scores of that one offset only.

How it is computed. The squared numerator is an inner product of two Gram matrices,
``||M N||_F^2 = <M^T M, N N^T>_F``, and each Gram is built from the low-rank factors (``d_head``
columns), e.g. ``W_QK^T W_QK = W_K^T (W_Q W_Q^T) W_K``, ``W_OV W_OV^T = W_O (W_V W_V^T) W_O^T``;
the denominators are their traces. So every (receiver, sender) pair of one kind is one entry of a
matrix product ``[receivers, d_model^2] @ [d_model^2, senders]``, in float64: ``2 d_model^2``
flops a pair instead of ``2 d_head^2 d_model`` for ``||L_r (E_r^T C_s) R_s^T||_F`` with
Cholesky/QR factors.

The null (:func:`composition`). For each sender layer, ``n_null`` random senders: ``W_V`` and
``W_O`` replaced by standard Gaussian matrices of the same shapes (so ``W_OV`` keeps rank
``d_head``), scaled to the layer's Frobenius norms (the score is scale invariant anyway), with the
layer's norms folded in as for a real sender (so the null keeps what every head of that layer
shares: its input norm's gain and its post-attention gain, and tests what is specific to the
head). Every sender of one layer is held against the same draws; they are drawn from
``numpy.random.default_rng([seed, layer])``, so a score's null does not depend on which pairs,
kinds or chunk sizes were asked for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from headscope.errors import HeadscopeError, did_you_mean

KINDS = ("q", "k", "v")
COLUMNS = [
    "sender",
    "sender_layer",
    "sender_head",
    "receiver",
    "receiver_layer",
    "receiver_head",
    "kind",
    "score",
    "null_mean",
    "null_sd",
    "z",
    "percentile",
    "n_null",
]
#: Receivers' Gram matrices held at once (bytes; SmolLM2's, every kind: 1.1 GB); more are taken
#: in chunks (each chunk recomputes the senders' Gram matrices).
MAX_BYTES = 2 << 30


# ------------------------------------------------------------------------------ the weights


@dataclass(frozen=True)
class HeadWeights:
    """Every head's projections as the model holds them (float64, CPU, biases dropped), and the
    norms folded into them (see the module docstring). Column-vector convention: ``W_Q[l, h] x``
    is head ``h``'s query of the residual stream ``x``."""

    W_Q: Float[Tensor, "layer head d_head d_model"]
    W_K: Float[Tensor, "layer kv_head d_head d_model"]
    W_V: Float[Tensor, "layer kv_head d_head d_model"]
    W_O: Float[Tensor, "layer head d_model d_head"]
    ln: Float[Tensor, "layer d_model"]  # each layer's pre-attention norm gain
    centre: bool  # LayerNorm (centre, then scale) rather than RMSNorm
    post: Float[Tensor, "layer d_model"] | None  # post-attention norm gain (Gemma 2/3), or None
    q_gain: Float[Tensor, "layer d_head"] | None  # q_norm gain (Gemma 3, Qwen3), or None
    k_gain: Float[Tensor, "layer d_head"] | None  # k_norm gain, or None

    @property
    def n_layers(self) -> int:
        return self.W_Q.shape[0]

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[1]

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.W_Q.shape[1] // self.W_K.shape[1]

    def read(self, W: Tensor, layer: int) -> Tensor:
        """``W diag(g) (I - 1 1^T / d)``: a projection ``[..., d_head, d_model]`` reading layer
        ``layer``'s normed input (no centring for an RMSNorm)."""
        W = W * self.ln[layer]
        return W - W.mean(-1, keepdim=True) if self.centre else W

    def write(self, W_O: Tensor, layer: int) -> Tensor:
        """``diag(g_post) W_O``: an output projection ``[..., d_model, d_head]`` as it reaches the
        residual stream."""
        return W_O if self.post is None else W_O * self.post[layer][:, None]

    def folded(self, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Layer ``layer``'s ``(W_Q, W_K, W_V, W_O)`` with every fold applied, per query head
        (KV heads repeated over their group): ``[head, d_head, d_model]`` x 3, ``[head, d_model,
        d_head]``."""
        q = self.read(self.W_Q[layer], layer)
        k = self.read(self.W_K[layer], layer).repeat_interleave(self.group, 0)
        v = self.read(self.W_V[layer], layer).repeat_interleave(self.group, 0)
        if self.q_gain is not None:
            q = q * self.q_gain[layer][:, None]
        if self.k_gain is not None:
            k = k * self.k_gain[layer][:, None]
        return q, k, v, self.write(self.W_O[layer], layer)


def _gain(norm, size: int) -> Tensor:
    """What an RMS-type norm multiplies by, read by applying it to a vector of ones (its output
    there is ``gain / sqrt(1 + eps)``: the positive factor is dropped like every RMS scale). This
    is ``w`` or ``1 + w`` (Gemma) without knowing which the norm computes."""
    p = next(norm.parameters())
    with torch.no_grad():
        return norm(torch.ones(1, size, dtype=p.dtype, device=p.device))[0].double().cpu()


def _linear(mod) -> Tensor:
    """A projection's weight as ``[out, in]`` (transformers' GPT-2 ``Conv1D`` holds ``[in,
    out]``)."""
    w = mod.weight.detach().double().cpu()
    return w.T if type(mod).__name__ == "Conv1D" else w


def head_weights(model) -> HeadWeights:
    """Read every head's ``W_Q``, ``W_K``, ``W_V``, ``W_O`` and the norms to fold from the Hugging
    Face modules (``model.hf``) of a pre-norm decoder: GPT-2 (fused ``c_attn``, LayerNorm),
    GPT-NeoX (``query_key_value`` fused head by head, LayerNorm; with its parallel residual the
    attention still reads ``input_layernorm`` and writes the residual stream directly), and the
    ``q_proj/k_proj/v_proj/o_proj`` families (Llama, SmolLM2, Mistral, Qwen2/3, Gemma 1-3).
    Anything else is refused in one line."""
    if not model.causal:
        raise HeadscopeError(
            f"{model.name} is an encoder (post-norm, bidirectional); composition scores are read "
            "here for pre-norm decoders (GPT-2, Llama, Gemma 3), e.g. smollm2-135m."
        )
    H, KV, dh = model.n_heads, model.n_kv_heads, model.d_head
    Qs, Ks, Vs, Os, ln, post, qg, kg = [], [], [], [], [], [], [], []
    centre = None
    for blk in model.blocks():
        attn = (
            getattr(blk, "self_attn", None)
            or getattr(blk, "attn", None)
            or getattr(blk, "attention", None)  # GPT-NeoX
        )
        norm = getattr(blk, "input_layernorm", None) or getattr(blk, "ln_1", None)
        if attn is None or norm is None:
            raise _layout(model, blk)
        if all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            q, k, v, o = (
                _linear(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj", "o_proj")
            )
        elif hasattr(attn, "c_attn") and hasattr(attn, "c_proj") and not attn.is_cross_attention:
            q, k, v = _linear(attn.c_attn).split(H * dh, dim=0)  # [H dh, d_model] each
            o = _linear(attn.c_proj)
        elif hasattr(attn, "query_key_value") and hasattr(attn, "dense"):
            # GPT-NeoX fuses q, k, v head by head: rows [head, (q | k | v), d_head]
            qkv = _linear(attn.query_key_value).view(H, 3, dh, -1)
            q, k, v = (qkv[:, i].reshape(H * dh, -1) for i in range(3))
            o = _linear(attn.dense)
        else:
            raise _layout(model, blk)
        if q.shape[0] != H * dh or k.shape[0] != KV * dh or o.shape[1] != H * dh:
            raise _layout(model, blk)
        Qs.append(q.view(H, dh, -1))  # [head, d_head, d_model]
        Ks.append(k.view(KV, dh, -1))
        Vs.append(v.view(KV, dh, -1))
        Os.append(o.view(-1, H, dh).permute(1, 0, 2))  # [d_model, H dh] -> [head, d_model, d_head]
        is_ln = isinstance(norm, torch.nn.LayerNorm)
        if centre is not None and centre != is_ln:
            raise _layout(model, blk)
        centre = is_ln
        d_model = q.shape[1]
        ln.append(norm.weight.detach().double().cpu() if is_ln else _gain(norm, d_model))
        if hasattr(blk, "pre_feedforward_layernorm") and hasattr(blk, "post_attention_layernorm"):
            post.append(_gain(blk.post_attention_layernorm, d_model))  # Gemma 2/3 sandwich norm
        if getattr(attn, "q_norm", None) is not None:
            qg.append(_gain(attn.q_norm, dh))
        if getattr(attn, "k_norm", None) is not None:
            kg.append(_gain(attn.k_norm, dh))
    n = model.n_layers
    for name, got in (("post-attention norm", post), ("q_norm", qg), ("k_norm", kg)):
        if got and len(got) != n:
            raise HeadscopeError(
                f"{model.name}: a {name} on {len(got)} of {n} layers; composition is read for "
                "models whose blocks share one layout."
            )
    return HeadWeights(
        W_Q=torch.stack(Qs),
        W_K=torch.stack(Ks),
        W_V=torch.stack(Vs),
        W_O=torch.stack(Os),
        ln=torch.stack(ln),
        centre=bool(centre),
        post=torch.stack(post) if post else None,
        q_gain=torch.stack(qg) if qg else None,
        k_gain=torch.stack(kg) if kg else None,
    )


def _layout(model, blk) -> HeadscopeError:
    return HeadscopeError(
        f"{model.name}: unknown attention layout in {type(blk).__name__} (composition reads "
        "q_proj/k_proj/v_proj/o_proj, GPT-2's c_attn/c_proj or GPT-NeoX's query_key_value/dense, "
        "after an input_layernorm or ln_1); supported: GPT-2, GPT-NeoX, Llama (SmolLM2), Mistral, "
        "Qwen2/3, Gemma 1-3."
    )


# ------------------------------------------------------------------------------ Gram matrices


def _ov_gram(W_V: Tensor, W_O: Tensor) -> Float[Tensor, "n d_model d_model"]:
    """``W_OV W_OV^T = W_O (W_V W_V^T) W_O^T`` for ``W_V [n, d_head, d_model]``, ``W_O [n,
    d_model, d_head]``."""
    return W_O @ (W_V @ W_V.transpose(-1, -2)) @ W_O.transpose(-1, -2)


def _receiver_gram(w: HeadWeights, layer: int, kind: str) -> Float[Tensor, "head d_model d_model"]:
    """``M^T M`` for the receiver's matrix ``M`` that multiplies the sender's ``W_OV``: ``W_QK^T
    W_QK`` (K), ``W_QK W_QK^T`` (Q), ``W_OV^T W_OV`` (V); its trace is ``||M||_F^2``."""
    q, k, v, o = w.folded(layer)
    if kind == "k":  # W_QK^T W_QK = W_K^T (W_Q W_Q^T) W_K
        return k.transpose(-1, -2) @ (q @ q.transpose(-1, -2)) @ k
    if kind == "q":  # W_QK W_QK^T = W_Q^T (W_K W_K^T) W_Q
        return q.transpose(-1, -2) @ (k @ k.transpose(-1, -2)) @ q
    return v.transpose(-1, -2) @ (o.transpose(-1, -2) @ o) @ v  # W_V^T (W_O^T W_O) W_V


def _packed(G: Tensor, out: Tensor, double: bool) -> Tensor:
    """Gram matrices ``[n, d_model, d_model]`` divided by their traces (``||M||_F^2``), as their
    upper triangles (diagonal first) written into ``out`` ``[n, d_model (d_model + 1) / 2]``:
    ``<A, B>_F = sum_i A_ii B_ii + 2 sum_{i<j} A_ij B_ij`` for symmetric ``A``, ``B``, so with
    ``double`` (one side of the product) the off-diagonal entries are doubled."""
    dm = G.shape[-1]
    upper = torch.triu_indices(dm, dm, offset=1)
    diag = torch.arange(dm)
    flat = torch.cat([diag * (dm + 1), upper[0] * dm + upper[1]])  # indices into d_model^2
    torch.index_select(G.flatten(1), 1, flat, out=out)
    tr = out[:, :dm].sum(1, keepdim=True)  # [n, 1]
    out.div_(tr)
    if double:
        out[:, dm:].mul_(2.0)
    return out


def _null_senders(w: HeadWeights, layer: int, n_null: int, seed: int) -> tuple[Tensor, Tensor]:
    """``n_null`` random senders for layer ``layer``: Gaussian ``W_V``, ``W_O`` (same shapes, the
    layer's mean Frobenius norms), folded like a real sender of that layer."""
    rng = np.random.default_rng([seed, layer])
    dh, dm = w.W_V.shape[-2:]
    v = torch.from_numpy(rng.standard_normal((n_null, dh, dm)))  # [draw, d_head, d_model]
    o = torch.from_numpy(rng.standard_normal((n_null, dm, dh)))  # [draw, d_model, d_head]
    v = v * (w.W_V[layer].flatten(1).norm(dim=1).mean() / v.flatten(1).norm(dim=1))[:, None, None]
    o = o * (w.W_O[layer].flatten(1).norm(dim=1).mean() / o.flatten(1).norm(dim=1))[:, None, None]
    return w.read(v, layer), w.write(o, layer)


def _scores(
    w: HeadWeights,
    kinds: Sequence[str],
    receiver_layers: Sequence[int],
    n_null: int,
    seed: int,
    max_bytes: int = MAX_BYTES,
) -> tuple[Tensor, Tensor | None]:
    """``(score, null)``: ``score[kind, layer_r, head_r, layer_s, head_s]`` (NaN where ``layer_s
    >= layer_r`` or ``layer_r`` was not asked for) and ``null[kind, layer_r, head_r, layer_s,
    draw]`` (None when ``n_null == 0``)."""
    L, H = w.n_layers, w.n_heads
    dm = w.W_Q.shape[-1]
    score = torch.full((len(kinds), L, H, L, H), float("nan"), dtype=torch.float64)
    null = (
        torch.full((len(kinds), L, H, L, n_null), float("nan"), dtype=torch.float64)
        if n_null
        else None
    )
    receiver_layers = sorted(set(receiver_layers) - {0})
    # one unit = the H receivers of one (layer, kind), sorted by layer: the receivers later than a
    # sender layer are then a tail; units taken in chunks whose packed Grams fit in max_bytes
    units = [(lr, ki) for lr in receiver_layers for ki in range(len(kinds))]
    packed = dm * (dm + 1) // 2
    size = max(1, max_bytes // (H * packed * 8))
    for c in range(0, len(units), size):
        chunk = units[c : c + size]
        G = torch.empty(len(chunk) * H, packed, dtype=torch.float64)  # [unit * head, packed]
        for i, (lr, ki) in enumerate(chunk):
            _packed(_receiver_gram(w, lr, kinds[ki]), G[i * H : (i + 1) * H], double=True)
        S = torch.empty(H + n_null, packed, dtype=torch.float64)  # [sender + null, packed]
        for ls in range(chunk[-1][0]):
            first = next(i for i, (lr, _) in enumerate(chunk) if lr > ls)
            _, _, v, o = w.folded(ls)
            _packed(_ov_gram(v, o), S[:H], double=False)
            if n_null:
                _packed(_ov_gram(*_null_senders(w, ls, n_null, seed)), S[H:], double=False)
            # squared score = <G_r / tr G_r, G_s / tr G_s>; rounding can take a 0 below 0
            sq = (G[first * H :] @ S.T).clamp_min(0).sqrt()  # [unit * head, sender + null]
            sq = sq.view(len(chunk) - first, H, H + n_null)
            lrs = [lr for lr, _ in chunk[first:]]
            kis = [ki for _, ki in chunk[first:]]
            score[kis, lrs, :, ls] = sq[..., :H]
            if n_null:
                null[kis, lrs, :, ls] = sq[..., H:]
    return score, null


# ------------------------------------------------------------------------------ public functions


def _check_kinds(kinds: Iterable[str] | str) -> tuple[str, ...]:
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    for k in kinds:
        if k not in KINDS:
            raise HeadscopeError(
                f"Unknown composition kind '{k}'; use q, k or v.{did_you_mean(str(k), KINDS)}"
            )
    if not kinds:
        raise HeadscopeError("No composition kind asked for; use q, k or v.")
    return kinds


def composition_scores(
    model, kinds: Iterable[str] | str = KINDS
) -> Float[Tensor, "kind layer_r head_r layer_s head_s"]:
    """Every composition score of ``model`` (float64): ``out[i, lr, hr, ls, hs]`` is the
    ``kinds[i]``-composition of sender ``L{ls}H{hs}`` into receiver ``L{lr}H{hr}``; NaN where
    ``ls >= lr``. No null (see :func:`composition`)."""
    kinds = _check_kinds(kinds)
    w = head_weights(model)
    with torch.no_grad():
        score, _ = _scores(w, kinds, range(w.n_layers), 0, 0)
    return score


_NAME = re.compile(r"^L(\d+)H(\d+)$")


def _head(spec, n_layers: int, n_heads: int) -> tuple[int, int]:
    """``"L3H1"`` or ``(3, 1)`` -> ``(3, 1)``, checked against the model's shape."""
    if isinstance(spec, str):
        m = _NAME.match(spec.strip().upper())
        if m is None:
            raise HeadscopeError(
                f"Bad head name '{spec}'; name a head as L{{layer}}H{{head}}, e.g. L3H1."
            )
        layer, head = int(m[1]), int(m[2])
    else:
        try:
            layer, head = (int(x) for x in spec)
        except (TypeError, ValueError):
            raise HeadscopeError(
                f"Bad head {spec!r}; name a head as 'L{{layer}}H{{head}}' or (layer, head)."
            ) from None
    if not (0 <= layer < n_layers and 0 <= head < n_heads):
        raise HeadscopeError(
            f"No head L{layer}H{head}: layers 0-{n_layers - 1}, heads 0-{n_heads - 1}."
        )
    return layer, head


def _pairs(pairs, n_layers: int, n_heads: int) -> list[tuple[int, int, int, int]]:
    """Named (sender, receiver) pairs -> ``(ls, hs, lr, hr)``, each receiver after its sender."""
    out = []
    for pair in pairs:
        try:
            s, r = pair
        except (TypeError, ValueError):
            raise HeadscopeError(
                f"Bad pair {pair!r}; give (sender, receiver), e.g. ('L2H0', 'L5H3')."
            ) from None
        ls, hs = _head(s, n_layers, n_heads)
        lr, hr = _head(r, n_layers, n_heads)
        if lr <= ls:
            ok = (
                "none: the sender is in the last layer"
                if ls + 1 == n_layers
                else f"layer {ls + 1}"
                if ls + 2 == n_layers
                else f"layers {ls + 1}-{n_layers - 1}"
            )
            raise HeadscopeError(
                f"Receiver L{lr}H{hr} is not after sender L{ls}H{hs}; a receiver must sit in a "
                f"later layer than its sender (here: {ok})."
            )
        out.append((ls, hs, lr, hr))
    return out


def composition(
    model,
    kinds: Iterable[str] | str = KINDS,
    n_null: int = 32,
    seed: int = 0,
    pairs: Iterable | None = None,
    max_bytes: int = MAX_BYTES,
) -> pd.DataFrame:
    """Composition scores of every (sender, receiver) pair of heads with ``sender_layer <
    receiver_layer`` (or of the named ``pairs``, each ``(sender, receiver)`` as ``"L{l}H{h}"`` or
    ``(layer, head)``), held against a null of ``n_null`` random senders (module docstring).

    One row per (sender, receiver, kind), columns :data:`COLUMNS`: ``score``; ``null_mean`` and
    ``null_sd`` (sample sd, ``ddof=1``) of the null scores; ``z = (score - null_mean) /
    null_sd``; ``percentile``, the share of null draws strictly below the score; ``n_null``.
    """
    kinds = _check_kinds(kinds)
    if isinstance(n_null, bool) or not isinstance(n_null, int) or n_null < 2:
        raise HeadscopeError(
            f"n_null must be an integer of at least 2 (a null sd), got {n_null!r}."
        )
    w = head_weights(model)
    L, H = w.n_layers, w.n_heads
    picked = None if pairs is None else _pairs(pairs, L, H)
    layers = range(L) if picked is None else {p[2] for p in picked}
    with torch.no_grad():
        score, null = _scores(w, kinds, layers, n_null, seed, max_bytes)
    mean = null.mean(-1)  # [kind, lr, hr, ls]
    sd = null.std(-1, correction=1)
    # [kind, lr, hr, ls, hs]: the null is one per sender layer
    below = (null[..., None, :] < score[..., None]).sum(-1) / n_null
    z = (score - mean[..., None]) / sd[..., None]
    if picked is None:
        idx = torch.tensor(
            [
                (lr, hr, ls, hs)
                for lr in range(L)
                for hr in range(H)
                for ls in range(lr)
                for hs in range(H)
            ],
            dtype=torch.long,
        ).view(-1, 4)
    else:
        idx = [(lr, hr, ls, hs) for ls, hs, lr, hr in picked]
        idx = torch.tensor(idx, dtype=torch.long).view(-1, 4)
    lr, hr, ls, hs = idx.unbind(1)
    frames = []
    for ki, kind in enumerate(kinds):
        frames.append(
            pd.DataFrame(
                {
                    "sender": [f"L{a}H{b}" for a, b in zip(ls.tolist(), hs.tolist(), strict=True)],
                    "sender_layer": ls.numpy(),
                    "sender_head": hs.numpy(),
                    "receiver": [
                        f"L{a}H{b}" for a, b in zip(lr.tolist(), hr.tolist(), strict=True)
                    ],
                    "receiver_layer": lr.numpy(),
                    "receiver_head": hr.numpy(),
                    "kind": kind,
                    "score": score[ki, lr, hr, ls, hs].numpy(),
                    "null_mean": mean[ki, lr, hr, ls].numpy(),
                    "null_sd": sd[ki, lr, hr, ls].numpy(),
                    "z": z[ki, lr, hr, ls, hs].numpy(),
                    "percentile": below[ki, lr, hr, ls, hs].numpy(),
                    "n_null": n_null,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)[COLUMNS]
