"""Path patching (Wang et al. 2022) recomputed with plain transformers: an oracle for headscope's.

Shares no code with headscope: it imports nothing from headscope and reads the Hugging Face causal
LM (``model.hf``) directly, one prompt at a time, no padding, metrics in float64.

Signature::

    path_patched_metric(hf, n_heads, base_ids, source_ids, sender, receiver, metric, answer,
                        wrong, freeze_mlps=False, sender_positions=None,
                        receiver_positions=None) -> float

* ``hf``: a GPT-2, Llama (grouped-query attention too) or Gemma 3 causal LM; ``n_heads``: its
  query heads per layer;
* ``base_ids`` / ``source_ids``: one prompt each (lists of token ids, the same length). The
  direction is which one is base: noising = base clean, source corrupt; denoising = base corrupt,
  source clean;
* ``sender = (ls, hs)``; ``receiver = ("logits",)`` or ``(kind, lr, hr)`` with ``kind`` in
  ``"q"``, ``"k"``, ``"v"`` and ``lr > ls``;
* ``metric``: ``"logit_diff"`` (``logit[answer] - logit[wrong]``), ``"prob"`` or ``"loss"`` (of
  the answer) at the last position;
* ``sender_positions`` / ``receiver_positions``: ``None`` (every position) or token indices.

The three steps, "head output" of head h being its slice ``[pos, h*d:(h+1)*d]`` of the input to
the attention output projection (``o_proj`` / ``c_proj``):

1. run base and source alone (HF eager attention); keep every layer's o_proj input and, if
   ``freeze_mlps``, every block's MLP output (``block.mlp``);
2. run base with the o_proj input of EVERY layer ``>= ls`` replaced by base's (every head frozen
   at its base value) except the sender's slice at layer ``ls`` at ``sender_positions``, taken from
   the source; with ``freeze_mlps`` every ``block.mlp`` output at layers ``>= ls`` is base's too.
   Keep the receiver's input at layer ``lr``: its query after the projection, any ``q_norm`` and
   rotary (kind ``q``), or the key (after ``k_norm``/rotary) / value of the KV head that query head
   ``hr`` reads, ``hr // (n_heads / n_kv_heads)`` (kinds ``k``, ``v``). For ``("logits",)`` the
   result is the metric of this run's logits;
3. run base, nothing frozen, except that at layer ``lr`` query head ``hr``'s q (rows at the
   receiver positions), or the k / v that head ``hr`` reads (key positions = the receiver
   positions), is step 2's. With grouped-query attention only head ``hr`` sees the new key /
   value, not the other query heads of its group. The result is this run's metric.

Mechanics: head outputs and MLP outputs are read and overwritten by forward (pre-)hooks on the
model's own modules, which otherwise run HF's eager attention. The receiver's q / k / v exist only
inside the attention, so at layer ``lr`` alone (steps 2 and 3) the attention module's forward is
replaced by the hand-written one of this file (:class:`ReceiverAttention`: projections, the
model's ``q_norm``/``k_norm`` modules, rotary from the ``position_embeddings`` the model passes,
causal and sliding-window mask, soft-capping, softmax in float32 as HF's eager does);
:func:`hand_logits` runs it at every layer to check it reproduces the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

KINDS = ("q", "k", "v")


# ------------------------------------------------------------------------------ the model's parts


def _is_gpt2(hf) -> bool:
    return type(hf).__name__.startswith("GPT2")


def blocks(hf):
    """The decoder blocks, in order."""
    return hf.transformer.h if _is_gpt2(hf) else hf.model.layers


def attention(hf, layer: int):
    block = blocks(hf)[layer]
    return block.attn if _is_gpt2(hf) else block.self_attn


def out_proj(hf, layer: int):
    """The attention output projection: its input is ``[batch, pos, head * d]``."""
    attn = attention(hf, layer)
    return attn.c_proj if _is_gpt2(hf) else attn.o_proj


def mlp(hf, layer: int):
    return blocks(hf)[layer].mlp


def metric_value(logits_last: torch.Tensor, metric: str, answer: int, wrong: int) -> float:
    """``logit_diff`` = ``logit[answer] - logit[wrong]``; ``prob`` = softmax's answer entry;
    ``loss`` = ``-log prob``; all in float64."""
    x = logits_last.double()
    if metric == "logit_diff":
        return float(x[answer] - x[wrong])
    logp = torch.log_softmax(x, -1)[answer]
    if metric == "prob":
        return float(logp.exp())
    if metric == "loss":
        return float(-logp)
    raise ValueError(f"metric {metric!r}: use logit_diff, prob or loss")


@contextlib.contextmanager
def _eager(hf):
    old = hf.config._attn_implementation
    hf.set_attn_implementation("eager")
    try:
        yield
    finally:
        hf.set_attn_implementation(old)


@contextlib.contextmanager
def _hooks(handles):
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _last_logits(hf, ids) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([[int(t) for t in ids]]), use_cache=False).logits[0, -1]


# ------------------------------------------------------------------ the hand-written attention


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class ReceiverAttention:
    """Replaces the attention forward of ``layers`` by a hand-written one inside a ``with`` block.

    ``record[layer]``: ``{"q": [head, pos, d], "k": [kv_head, pos, d], "v": [kv_head, pos, d]}``
    of the last run (q and k after any q_norm / k_norm and rotary). ``patch``: ``None`` or
    ``(layer, kind, head, positions, tensor [pos, d])``: query head ``head``'s q rows at
    ``positions``, or only the copy of the k / v that query head ``head`` reads, at key positions
    ``positions``, are replaced by ``tensor``'s rows.
    """

    def __init__(self, hf, layers: Sequence[int]):
        self.hf = hf
        self.layers = list(layers)
        self.record: dict[int, dict[str, torch.Tensor]] = {}
        self.patch = None

    def __enter__(self):
        for i in self.layers:
            mod = attention(self.hf, i)
            mod.forward = self._forward_of(i, mod)
        return self

    def __exit__(self, *exc):
        for i in self.layers:
            del attention(self.hf, i).forward

    def _forward_of(self, layer: int, mod):
        gpt2 = hasattr(mod, "c_attn")
        if gpt2 and getattr(mod, "reorder_and_upcast_attn", False):
            raise ValueError("GPT-2 with reorder_and_upcast_attn is not reproduced")

        def forward(hidden_states, *args, position_embeddings=None, **kwargs):
            b, n, _ = hidden_states.shape
            d = mod.head_dim
            if gpt2:
                q, k, v = mod.c_attn(hidden_states).split(mod.split_size, dim=2)
            else:
                q, k, v = (
                    mod.q_proj(hidden_states),
                    mod.k_proj(hidden_states),
                    mod.v_proj(hidden_states),
                )
            q, k, v = (t.view(b, n, -1, d).transpose(1, 2) for t in (q, k, v))  # [b, h, pos, d]
            if getattr(mod, "q_norm", None) is not None:
                q, k = mod.q_norm(q), mod.k_norm(k)
            if position_embeddings is not None:  # rotary: x cos + rotate_half(x) sin
                cos, sin = (t.unsqueeze(1) for t in position_embeddings)
                q = q * cos + _rotate_half(q) * sin
                k = k * cos + _rotate_half(k) * sin
            n_q, n_kv = q.shape[1], k.shape[1]
            group = n_q // n_kv
            self.record[layer] = {
                "q": q[0].detach().clone(),
                "k": k[0].detach().clone(),
                "v": v[0].detach().clone(),
            }
            k_h = k.repeat_interleave(group, dim=1)  # [b, head, pos, d]: head h reads h // group
            v_h = v.repeat_interleave(group, dim=1)
            p = self.patch if self.patch is not None and self.patch[0] == layer else None
            if p is not None:
                _, kind, head, positions, new = p
                t = {"q": q, "k": k_h, "v": v_h}[kind].clone()
                t[0, head, positions] = new[positions].to(t.dtype)
                if kind == "q":
                    q = t
                elif kind == "k":
                    k_h = t
                else:
                    v_h = t
            scores = torch.matmul(q, k_h.transpose(2, 3)) * mod.scaling  # [b, head, q, k]
            cap = getattr(mod, "attn_logit_softcapping", None)
            if cap is not None:
                scores = torch.tanh(scores / cap) * cap
            i = torch.arange(n)[:, None]
            j = torch.arange(n)[None, :]
            visible = j <= i
            window = getattr(mod, "sliding_window", None)
            if window is not None:
                visible = visible & (i - j < window)
            scores = scores.masked_fill(~visible, float("-inf"))
            pattern = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            z = torch.matmul(pattern, v_h).transpose(1, 2).reshape(b, n, -1)  # [b, pos, h * d]
            if gpt2:
                return mod.resid_dropout(mod.c_proj(z)), None
            return mod.o_proj(z), None

        return forward


def hand_logits(hf, ids) -> torch.Tensor:
    """The last position's logits with the hand-written attention at every layer (it must match
    the model's own)."""
    with _eager(hf), ReceiverAttention(hf, range(hf.config.num_hidden_layers)):
        return _last_logits(hf, ids)


# ------------------------------------------------------------------------------ the three steps


def _positions(positions, n: int) -> list[int]:
    if positions is None:
        return list(range(n))
    out = [int(p) for p in positions]
    if not out or any(not 0 <= p < n for p in out):
        raise ValueError(f"positions {positions!r}: give token indices in [0, {n})")
    return out


def record_run(hf, ids, with_mlps: bool):
    """Step 1: ``(o_proj inputs {layer: [pos, head * d]}, mlp outputs {layer: [pos, hidden]},
    last logits)`` of one plain eager run."""
    z, m = {}, {}
    handles = []
    for i in range(hf.config.num_hidden_layers):
        handles.append(
            out_proj(hf, i).register_forward_pre_hook(
                lambda mod, a, i=i: z.__setitem__(i, a[0][0].detach().clone())
            )
        )
        if with_mlps:
            handles.append(
                mlp(hf, i).register_forward_hook(
                    lambda mod, a, o, i=i: m.__setitem__(i, o[0].detach().clone())
                )
            )
    with _eager(hf), _hooks(handles):
        logits = _last_logits(hf, ids)
    return z, m, logits


def frozen_run(
    hf,
    n_heads: int,
    base_ids,
    source_ids,
    sender,
    receiver,
    freeze_mlps: bool = False,
    sender_positions=None,
):
    """Steps 1 and 2: ``(last logits of step 2, receiver input of step 2 or None)``; the receiver
    input is ``[pos, d]``: head hr's q, or the k / v of the KV head hr reads."""
    base_ids, source_ids = [int(t) for t in base_ids], [int(t) for t in source_ids]
    if len(base_ids) != len(source_ids):
        raise ValueError(f"prompts of {len(base_ids)} and {len(source_ids)} tokens: same length")
    n = len(base_ids)
    n_layers = hf.config.num_hidden_layers
    ls, hs = sender
    if not (0 <= ls < n_layers and 0 <= hs < n_heads):
        raise ValueError(f"sender {sender}: layer in [0, {n_layers}), head in [0, {n_heads})")
    if receiver[0] != "logits":
        kind, lr, hr = receiver
        if kind not in KINDS or not (ls < lr < n_layers) or not 0 <= hr < n_heads:
            raise ValueError(f"receiver {receiver}: kind q/k/v, layer in ({ls}, {n_layers})")
    s_pos = _positions(sender_positions, n)
    z_base, m_base, _ = record_run(hf, base_ids, freeze_mlps)
    z_src, _, _ = record_run(hf, source_ids, False)
    d = z_base[ls].shape[-1] // n_heads
    sender_z = z_base[ls].clone()
    cols = slice(hs * d, (hs + 1) * d)
    sender_z[s_pos, cols] = z_src[ls][s_pos, cols]
    frozen_z = {i: z_base[i] for i in range(ls, n_layers)}
    frozen_z[ls] = sender_z

    handles = []
    for i in range(ls, n_layers):
        handles.append(
            out_proj(hf, i).register_forward_pre_hook(
                lambda mod, a, i=i: (frozen_z[i][None].to(a[0].dtype),)
            )
        )
        if freeze_mlps:
            handles.append(
                mlp(hf, i).register_forward_hook(lambda mod, a, o, i=i: m_base[i][None].to(o.dtype))
            )
    layers = [] if receiver[0] == "logits" else [receiver[1]]
    with _eager(hf), _hooks(handles), ReceiverAttention(hf, layers) as hand:
        logits = _last_logits(hf, base_ids)
    if receiver[0] == "logits":
        return logits, None
    kind, lr, hr = receiver
    rec = hand.record[lr]
    group = rec["q"].shape[0] // rec["k"].shape[0]
    return logits, (rec["q"][hr] if kind == "q" else rec[kind][hr // group])


def receiver_patched_logits(hf, base_ids, receiver, new, receiver_positions=None):
    """Step 3: base's last logits with receiver ``(kind, lr, hr)``'s input at the receiver
    positions replaced by ``new`` ``[pos, d]`` (for k / v: only what query head hr reads)."""
    kind, lr, hr = receiver
    r_pos = _positions(receiver_positions, len(list(base_ids)))
    with _eager(hf), ReceiverAttention(hf, [lr]) as hand:
        hand.patch = (lr, kind, hr, r_pos, new)
        return _last_logits(hf, base_ids)


def path_patched_metric(
    hf,
    n_heads: int,
    base_ids,
    source_ids,
    sender,
    receiver,
    metric: str,
    answer: int,
    wrong: int,
    freeze_mlps: bool = False,
    sender_positions=None,
    receiver_positions=None,
) -> float:
    """Path patching of ``sender = (ls, hs)`` into ``receiver`` (``("logits",)`` or
    ``(kind, lr, hr)``, kind q/k/v): the metric of step 2 (logits) or step 3 (q/k/v); see the
    module docstring."""
    logits, new = frozen_run(
        hf, n_heads, base_ids, source_ids, sender, receiver, freeze_mlps, sender_positions
    )
    if receiver[0] == "logits":
        return metric_value(logits, metric, answer, wrong)
    logits = receiver_patched_logits(hf, base_ids, receiver, new, receiver_positions)
    return metric_value(logits, metric, answer, wrong)
