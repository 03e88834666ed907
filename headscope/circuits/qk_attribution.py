"""QK attribution: why a head's query matched a key (docs/qk.md).

Head ``h`` of layer ``l``, query position ``i``, key position ``j``: the attention logit

    s_ij = scale * q_i . k_j

is bilinear in the residual streams entering layer ``l`` once the norms on the way are frozen at
their values in the run: the layer's input norm (its scale per token; a layer norm's centring is
linear), and Gemma 3's or Qwen 3's per-head query and key norms (their scale per token and head).
Rotary embeddings are linear at a fixed position. Each stream is a sum of components, the writers
of the edge graph (:mod:`headscope.circuits.edge_graph`: the embedding, every earlier head's output,
every earlier MLP's output) plus ``bias``: what the stream holds besides them (the attention
output biases of GPT-2, exactly 0 in Llama-like models), the norm's own bias and the projection's
bias. So

    s_ij = sum over (a, b) of c_ab,    c_ab = scale * Q_a(i) . K_b(j)

with ``Q_a(i)`` the part of the query (after the frozen norms and the rotary) that component
``a`` at ``i`` makes, and ``K_b(j)`` likewise for the key. Every run checks that the parts add up
to the model's own query and key (as its attention receives them) and the table to the logit.

Through the softmax, a component is *knocked out* exactly: removed from the query's stream at
``i`` (or the key's at ``j``), the norms recomputed, the row's softmax renormalised; beside it the
first-order split (the frozen-norm change of the logit, ``-sum_b c_ab`` on the query side, and the
probability change it implies to first order), each labelled as what it is.

The model's own attention scores are the pre-soft-cap logits where a model caps them (Gemma 2):
the table sums to the logit before the cap.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from headscope.circuits.edge_graph import Anatomy, EdgeGraph, anatomy, graph_of
from headscope.circuits.edge_runs import EdgeForward, head_weights
from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall

#: relative error allowed between the parts' sum and the model's own query, key and logit
#: (float32 models; the check is a guard against a family's attention read wrongly)
CHECK_RTOL = 1e-3


@dataclass
class QKRecord:
    """One forward of ``ids`` (``[rows, pos]``, no padding) with everything a decomposition reads:
    every writer (``[rows, pos, writer, d_model]``), each layer's stream entering it, its
    attention call as the model made it (queries after rotary, keys, mask, scale) and its rotary
    tables."""

    model: object
    an: Anatomy
    graph: EdgeGraph
    ids: Int[Tensor, "row pos"]
    writers: Float[Tensor, "row pos writer d_model"]
    streams: dict[int, Tensor] = field(default_factory=dict)
    calls: dict[int, AttentionCall] = field(default_factory=dict)
    rope: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)
    #: one head's logits and pattern, kept while that head is worked on
    _head: dict = field(default_factory=dict, repr=False)
    #: the parts already computed for one layer (:func:`side_parts`)
    _stores: dict = field(default_factory=dict, repr=False)

    def components(self, layer: int) -> list[str]:
        """The names of layer ``layer``'s components, the table's rows and columns."""
        n = self.graph.writers_before_attn(layer)
        return [self.graph.writer_name(w) for w in range(n)] + ["bias"]

    def pattern(self, layer: int) -> Float[Tensor, "row head query key"]:
        """The layer's attention pattern from its recorded call (float64)."""
        cap = self.calls[layer].extras.get("softcap")
        return attend(self.logits(layer), self.visible(layer), cap)

    def logits(self, layer: int) -> Float[Tensor, "row head query key"]:
        call = self.calls[layer]
        k = call.key.double().repeat_interleave(call.group, 1)
        return call.scale * call.query.double() @ k.transpose(-1, -2)

    def head_logits(self, layer: int, head: int) -> Float[Tensor, "row query key"]:
        """One head's logits (float64), kept until another head's are asked for."""
        return self._of_head(layer, head)[0]

    def head_pattern(self, layer: int, head: int) -> Float[Tensor, "row query key"]:
        """One head's pattern (float64), kept until another head's is asked for."""
        return self._of_head(layer, head)[1]

    def _of_head(self, layer: int, head: int) -> tuple[Tensor, Tensor]:
        if self._head.get("at") != (layer, head):
            call = self.calls[layer]
            q = call.query[:, head].double().cpu()
            k = call.key[:, head // call.group].double().cpu()
            logits = call.scale * q @ k.transpose(-1, -2)
            vis = self.visible(layer)
            pat = attend(
                logits, vis[:, 0 if vis.shape[1] == 1 else head], call.extras.get("softcap")
            )
            self._head.clear()
            self._head.update(at=(layer, head), logits=logits, pattern=pat)
        return self._head["logits"], self._head["pattern"]

    def visible(self, layer: int) -> Tensor:
        """``[rows, 1 or head, query, key]`` booleans: the keys each query may attend to."""
        call = self.calls[layer]
        n = self.ids.shape[1]
        mask = call.mask
        if mask is None:
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            return (causal if call.causal else torch.ones(n, n, dtype=torch.bool))[None, None]
        if mask.dtype != torch.bool:
            mask = mask > torch.finfo(mask.dtype).min / 2
        return mask.cpu()


def attend(logits: Tensor, visible: Tensor, cap: float | None = None) -> Tensor:
    """The softmax over keys of ``logits`` where ``visible``, through a soft cap
    (``cap * tanh(logits / cap)``) where the model has one."""
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return torch.softmax(logits.masked_fill(~visible, -torch.inf), -1)


@dataclass
class Instances:
    """The ``(row, query, key)`` triples a head is decomposed at, and each one's null key: the
    visible key nearest the chosen one that the head neither was given nor attends to most
    (ties drawn at random, seeded)."""

    rows: Tensor
    query: Tensor
    key: Tensor
    null: Tensor

    def __len__(self) -> int:
        return len(self.rows)


def check_family(model) -> None:
    """One line for a model whose query and key this decomposition cannot read."""
    an = anatomy(model)  # the edge graph's families: one line otherwise
    cfg = model.hf.config
    if getattr(cfg, "clip_qkv", None) is not None:
        raise HeadscopeError(
            f"{model.name} clips its queries and keys (clip_qkv={cfg.clip_qkv}): the logit is not "
            "bilinear in the stream; QK attribution needs a model without clipping."
        )
    del an


def record(model, ids: Int[Tensor, "row pos"]) -> QKRecord:
    """One forward of ``ids`` (equal lengths, no padding) recording what the decomposition reads."""
    check_family(model)
    an, graph = anatomy(model), graph_of(model)
    rec = QKRecord(model, an, graph, ids, None)  # type: ignore[arg-type]
    handles = []

    def stream(module, args, la):
        rec.streams[la] = args[0].detach()

    def rope(module, args, kwargs, la):
        pe = kwargs.get("position_embeddings")
        if pe is not None:
            rec.rope[la] = (pe[0].detach(), pe[1].detach())

    def watch(call: AttentionCall) -> Tensor:
        rec.calls[call.layer] = AttentionCall(
            call.layer,
            call.query.detach(),
            call.key.detach(),
            call.value[:, :, :0],
            None if call.mask is None else call.mask.detach(),
            call.scale,
            call.causal,
            dict(call.extras),
        )
        return call.output()

    ef = EdgeForward(model, an, graph, record=True)
    try:
        for la in range(graph.n_layers):
            handles.append(
                an.ln1[la].register_forward_pre_hook(lambda m, a, la=la: stream(m, a, la))
            )
            handles.append(
                an.attn[la].register_forward_pre_hook(
                    lambda m, a, k, la=la: rope(m, a, k, la), with_kwargs=True
                )
            )
        with ef():
            model.run(ids, handler=watch, output="hidden")
    finally:
        for h in handles:
            h.remove()
    rec.writers = ef.writers
    return rec


def _norm_scale(norm, x: Tensor) -> tuple[Tensor, str]:
    """A norm's frozen scale at its input ``x`` (``[..., dim]`` -> ``[..., 1]``, float64) and its
    kind (``rms`` or ``layer``), computed as the model computes it."""
    name = type(norm).__name__
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    if eps is None:
        raise HeadscopeError(f"The norm {name} has no epsilon to read; QK attribution needs one.")
    x = x.float()
    if name.endswith("LayerNorm"):
        var = x.var(-1, keepdim=True, unbiased=False)
        return torch.rsqrt(var + eps).double(), "layer"
    if "RMSNorm" not in name:
        raise HeadscopeError(f"QK attribution does not know the norm {name}.")
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps).double(), "rms"


def _gain(norm, offset: float) -> Tensor:
    w = getattr(norm, "weight", None)
    return torch.ones(()) if w is None else w.detach().double() + offset


class Side:
    """The linear map from the stream at given positions to one head's query or key vector,
    the norms frozen at the run's values there (``every``: every head's of that side at once,
    one product for the layer's query heads).

    ``parts(rows, pos)``: ``[n, components, d_head]``, each component's part (the last: bias);
    ``every_parts``: the same for each head of the side, ``[n, components, heads, d_head]``;
    ``full(x, rows, pos)``: the query or key the real pipeline makes from streams ``x`` (``[n,
    d_model]``, norms recomputed: what a knock-out reads)."""

    def __init__(self, rec: QKRecord, layer: int, head: int, side: str, every: bool = False):
        self.rec, self.layer, self.side = rec, layer, side
        an, graph = rec.an, rec.graph
        w = head_weights(an, layer, graph)
        self.slot = head if side == "q" else head // graph.group
        self.slots = list(range(w[side].shape[0])) if every else [self.slot]
        ws = w[side][self.slots].detach().double()  # [heads, d_head, d_model]
        self.d_head = ws.shape[1]
        self.w = ws.reshape(-1, ws.shape[2])  # [heads * d_head, d_model]
        b = w[f"b{side}"]
        self.b = None if b is None else b[self.slots].detach().double()  # [heads, d_head]
        self.norm = an.ln1[layer]
        self.offset = an.gain_offset
        attn = an.attn[layer]
        self.qk_norm = getattr(attn, "q_norm" if side == "q" else "k_norm", None)
        self.n = graph.writers_before_attn(layer)
        mod = sys.modules.get(type(attn).__module__)
        self.rotary = getattr(mod, "apply_rotary_pos_emb", None) if layer in rec.rope else None
        if layer in rec.rope and self.rotary is None:
            raise HeadscopeError(
                f"{rec.model.name}: its attention's rotary embedding is not one QK attribution "
                "knows."
            )

    def _pre(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The frozen norm's scale at streams ``x`` (``[n, d]``) and the projection before any
        query/key norm, for the whole stream (real pipeline; ``[n, heads, d_head]``)."""
        s, kind = _norm_scale(self.norm, x)
        g = _gain(self.norm, self.offset)
        xd = x.double()
        if kind == "layer":
            xd = xd - xd.mean(-1, keepdim=True)
        y = xd * s * g
        beta = getattr(self.norm, "bias", None)
        if beta is not None:
            y = y + beta.detach().double()
        out = (y @ self.w.T).view(len(x), -1, self.d_head)
        if self.b is not None:
            out = out + self.b
        return s, out

    def _rotate(self, v: Tensor, rows: Tensor, pos: Tensor) -> Tensor:
        """``v`` ``[n, m, heads, d_head]`` rotated at each row's position (identity without
        rotary)."""
        if self.rotary is None:
            return v
        cos, sin = self.rec.rope[self.layer]
        c = cos[rows.to(cos.device) if cos.shape[0] > 1 else 0, pos].double()  # [n, d_head]
        s = sin[rows.to(sin.device) if sin.shape[0] > 1 else 0, pos].double()
        n, m, h, d = v.shape
        vv = v.reshape(
            n, m * h, 1, d
        )  # [n, m * heads, 1, d_head]: m * heads as heads, one position
        out, _ = self.rotary(vv, vv[:1, :1], c[:, None], s[:, None])  # the key slot: a dummy
        return out.view(n, m, h, d)

    def _qk_scale(self, pre: Tensor) -> Tensor:
        """The query/key norm's frozen scale times its gain (``[n, heads, d_head]``), or 1."""
        if self.qk_norm is None:
            return torch.ones(1, 1, 1, dtype=torch.float64)
        s, _ = _norm_scale(self.qk_norm, pre)
        return s * _gain(self.qk_norm, self.offset)

    def _linear(
        self, rows: Tensor, pos: Tensor, comp: Tensor, spare: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Components ``comp`` (``[n, m, d_model]`` at ``rows``/``pos``) through the frozen input
        norm and the projection (``[n, m + spare, heads, d_head]``, float64, the ``spare`` last
        columns left for the caller), and the whole stream's real projection there (``[n,
        heads, d_head]``)."""
        x = self.rec.streams[self.layer][rows, pos].double()  # [n, d]
        s, kind = _norm_scale(self.norm, x)
        w = self.w * _gain(self.norm, self.offset)  # [heads * d_head, d]
        if kind == "layer":
            w = w - w.mean(-1, keepdim=True)  # the centring folded in
        # the widest product in the model's float32 (float64 costs twice the time); the parts
        # still add up exactly to the whole stream's projection, taken in float64, since the bias
        # is what the whole holds beyond them
        dt = torch.float64 if comp.dtype == torch.float64 else torch.float32
        n, m = comp.shape[:2]
        out = torch.empty(n, m + spare, w.shape[0], dtype=torch.float64)
        torch.mul(comp.to(dt) @ w.T.to(dt), s[:, None], out=out[:, :m])  # widened as it is scaled
        return out.view(n, m + spare, -1, self.d_head), self._pre(x)[1]

    def every_parts(self, rows: Tensor, pos: Tensor) -> Float[Tensor, "n component head d_head"]:
        out, whole = self._linear(rows, pos, self.rec.writers[rows, pos, : self.n], spare=1)
        # the last column: the stream's constants, the norm's bias, the projection's
        torch.sub(whole, out[:, :-1].sum(1), out=out[:, -1])
        if self.qk_norm is not None:
            out *= self._qk_scale(whole)[:, None]
        return self._rotate(out, rows, pos)

    def parts(self, rows: Tensor, pos: Tensor) -> Float[Tensor, "n component d_head"]:
        return self.every_parts(rows, pos)[:, :, self.slots.index(self.slot)]

    def part(self, rows: Tensor, pos: Tensor, a: int) -> Float[Tensor, "n d_head"]:
        """Stream component ``a``'s part alone (what :meth:`parts` gives in its column ``a``)."""
        lin, whole = self._linear(rows, pos, self.rec.writers[rows, pos, a : a + 1])
        if self.qk_norm is not None:
            lin = lin * self._qk_scale(whole)[:, None]
        return self._rotate(lin, rows, pos)[:, 0, self.slots.index(self.slot)]

    def full(self, x: Tensor, rows: Tensor, pos: Tensor) -> Float[Tensor, "n d_head"]:
        _, pre = self._pre(x)
        if self.qk_norm is not None:
            pre = pre * self._qk_scale(pre)
        return self._rotate(pre[:, None], rows, pos)[:, 0, self.slots.index(self.slot)]

    def own(self, rows: Tensor, pos: Tensor) -> Float[Tensor, "n d_head"]:
        """The model's own query or key vector there, as its attention received it."""
        call = self.rec.calls[self.layer]
        t = call.query if self.side == "q" else call.key
        return t[rows.to(t.device), self.slot, pos.to(t.device)].double().cpu()


#: bytes of parts one store keeps (:class:`_Store`); past it, parts are computed and not kept
STORE_BYTES = 256 * 2**20


class _Store:
    """Parts already computed for one layer, by ``(row, position)``: the query side of every
    query head at once (the heads of a layer are decomposed at the same queries), the key side
    per KV head (the heads of a group often pick the same keys). Grows by doubling up to
    :data:`STORE_BYTES`; past it, :meth:`get` answers None."""

    def __init__(self, n_flat: int, row_bytes: int):
        self.where = torch.full((n_flat,), -1, dtype=torch.long)
        self.room = max(1, STORE_BYTES // row_bytes)  # rows it may keep
        self.data: Tensor | None = None
        self.used = 0

    def get(self, flat: Tensor, compute, index=()) -> Tensor | None:
        """The parts at flat positions ``flat`` (``row * positions + position``), computing the
        missing ones with ``compute(missing_flat)``; ``index`` selects within a row."""
        uniq = flat.unique()
        miss = uniq[self.where[uniq] < 0]
        if len(miss):
            need = self.used + len(miss)
            if need > self.room:
                return None
            new = compute(miss)
            if self.data is None or need > len(self.data):
                cap = min(max(need, 2 * (0 if self.data is None else len(self.data))), self.room)
                grown = new.new_empty(cap, *new.shape[1:])
                if self.data is not None:
                    grown[: self.used] = self.data[: self.used]
                self.data = grown
            self.data[self.used : need] = new
            self.where[miss] = torch.arange(self.used, need)
            self.used = need
        return self.data[(self.where[flat], slice(None), *index)]


def side_parts(
    rec: QKRecord, layer: int, head: int, side: str, rows: Tensor, pos: Tensor
) -> Float[Tensor, "n component d_head"]:
    """Head ``(layer, head)``'s query (``side="q"``) or key parts at ``(rows, pos)``, as
    :meth:`Side.parts` gives them, kept in the record's store for the layer (one layer at a time)
    and shared with the layer's other heads."""
    n_pos = rec.ids.shape[1]
    if rec._stores.get("layer") != layer:
        rec._stores.clear()
        rec._stores["layer"] = layer
    flat = rows * n_pos + pos
    every = side == "q"
    slot = head if every else head // rec.graph.group
    key = side if every else (side, slot)
    if key not in rec._stores:
        heads = rec.graph.n_heads if every else 1
        d_head = rec.calls[layer].query.shape[-1]
        row = (rec.graph.writers_before_attn(layer) + 1) * heads * d_head * 8
        rec._stores[key] = _Store(rec.ids.numel(), row)

    def compute(f: Tensor) -> Tensor:
        out = Side(rec, layer, head, side, every=every).every_parts(f // n_pos, f % n_pos)
        return out if every else out[:, :, 0]

    got = rec._stores[key].get(flat, compute, (slot,) if every else ())
    if got is None:  # past the store's room: this head's alone, not kept
        return Side(rec, layer, head, side).parts(rows, pos)
    return got


# ------------------------------------------------------------------------------ the table


def table(
    rec: QKRecord, layer: int, head: int, rows: Tensor, query: Tensor, key: Tensor
) -> Float[Tensor, "n component component"]:
    """``c[n, a, b]``: the logit's part from query-side component ``a`` and key-side ``b`` at each
    ``(row, query, key)`` (float64; the last component of each side is ``bias``). Checked: the
    parts add up to the model's own query and key, and the table to its logit."""
    return tables(rec, layer, head, rows, query, [key])[0]


def tables(
    rec: QKRecord, layer: int, head: int, rows: Tensor, query: Tensor, keys: list[Tensor]
) -> list[Tensor]:
    """:func:`table` at each of several key positions for the same queries (``keys``: ``[n]``
    each), the query side's parts computed once."""
    qs, ks = Side(rec, layer, head, "q"), Side(rec, layer, head, "k")
    q = side_parts(rec, layer, head, "q", rows, query)
    _check(q.sum(1), qs.own(rows, query), rec, layer, head, "query")
    scale = rec.calls[layer].scale
    logits = rec.head_logits(layer, head)
    n = len(rows)
    many = torch.cat(keys)
    k_all = side_parts(rec, layer, head, "k", rows.repeat(len(keys)), many)  # in one pass
    _check(k_all.sum(1), ks.own(rows.repeat(len(keys)), many), rec, layer, head, "key")
    out = []
    qs_ = scale * q  # the scale on the smaller factor (exact when it is a power of two)
    for t, key in enumerate(keys):
        c = qs_ @ k_all[t * n : (t + 1) * n].transpose(1, 2)
        _check(c.sum((1, 2)), logits[rows, query, key], rec, layer, head, "logit")
        out.append(c)
    return out


def _check(got: Tensor, want: Tensor, rec: QKRecord, layer: int, head: int, what: str) -> None:
    err = (got - want.double()).abs().max()
    ref = want.double().abs().max().clamp(min=1.0)
    if not err <= CHECK_RTOL * ref:
        raise HeadscopeError(
            f"{rec.model.name} L{layer}H{head}: the components' {what} differs from the model's "
            f"own by {float(err):.3g}; this family's attention is not read right (a bug: please "
            "report it)."
        )


def knockouts(
    rec: QKRecord,
    layer: int,
    head: int,
    inst: Instances,
    q_comp: int,
    k_comp: int,
    c: Tensor,
) -> dict[str, Tensor]:
    """Per instance (``c``: the instances' tables, or their key-side totals ``[n, component]``):
    the attention on its key, and after knocking out query-side component
    ``q_comp`` at the query (``ko_q``) or key-side ``k_comp`` at the key (``ko_k``), exactly (the
    norms recomputed, the row's softmax renormalised); beside each, the first-order change of the
    probability from the frozen-norm change of the logits (``fo_q``, ``fo_k``; through a soft
    cap's slope where the model caps its logits). The ``bias``
    component is not a stream component: NaN."""
    call = rec.calls[layer]
    r, i, j = inst.rows, inst.query, inst.key
    pat = rec.head_pattern(layer, head)[r, i]  # [n, key]
    vis = rec.visible(layer)
    vis = vis[:, 0 if vis.shape[1] == 1 else head].expand(rec.ids.shape[0], -1, -1)[r, i]
    keys = call.key[:, head // rec.graph.group].double().cpu()[r]  # [n, key, d_head]
    q_own = call.query[:, head].double().cpu()[r, i]  # [n, d_head]
    cap = call.extras.get("softcap")
    scale = call.scale

    def probs(logits: Tensor) -> Tensor:
        return attend(logits, vis, cap)

    raw = scale * torch.einsum("nd,nkd->nk", q_own, keys)  # the logits before any cap
    slope = 1 - torch.tanh(raw / cap) ** 2 if cap else torch.ones_like(raw)  # d capped / d raw
    n_comp = rec.graph.writers_before_attn(layer)
    base = pat.gather(1, j[:, None])[:, 0]
    out = {"attn": base}
    nan = torch.full_like(base, torch.nan)
    qs = Side(rec, layer, head, "q")
    if q_comp < n_comp:
        x = rec.streams[layer][r, i].double() - rec.writers[r, i, q_comp].double()
        q_new = qs.full(x.float().to(rec.streams[layer].dtype), r, i)
        p = probs(scale * torch.einsum("nd,nkd->nk", q_new, keys))
        out["ko_q"] = p.gather(1, j[:, None])[:, 0] - base
        part = qs.part(r, i, q_comp)  # [n, d_head], frozen norm
        ds = -scale * torch.einsum("nd,nkd->nk", part, keys) * slope  # every key's logit moves
        out["fo_q"] = base * (ds.gather(1, j[:, None])[:, 0] - (pat * ds).sum(1))
    else:
        out["ko_q"] = out["fo_q"] = nan
    ks = Side(rec, layer, head, "k")
    if k_comp < n_comp:
        x = rec.streams[layer][r, j].double() - rec.writers[r, j, k_comp].double()
        k_new = ks.full(x.float().to(rec.streams[layer].dtype), r, j)
        logits = raw.scatter(1, j[:, None], scale * (q_own * k_new).sum(-1, keepdim=True))
        out["ko_k"] = probs(logits).gather(1, j[:, None])[:, 0] - base
        key_side = c.sum(1) if c.dim() == 3 else c  # [n, component]
        ds = -key_side[:, k_comp] * slope.gather(1, j[:, None])[:, 0]  # only the key's logit
        out["fo_k"] = base * (1 - base) * ds
    else:
        out["ko_k"] = out["fo_k"] = nan
    return out


# ------------------------------------------------------------------------------ subspaces


def subspaces(
    rec: QKRecord, layer: int, head: int, rows: Tensor, query: Tensor, key: Tensor
) -> tuple[list[str], Float[Tensor, "n subspace"]]:
    """The logit at each ``(row, query, key)`` split over subspaces of the head's space, exactly:

    * without rotary: the singular directions of ``W_QK = (W_Q G)^T (W_K G)`` (``G`` the input
      norm's gain): with ``W_Q G = R_q^T Q_q^T`` and ``W_K G = R_k^T Q_k^T`` (QR) and ``R_q R_k^T =
      P S W^T`` (SVD), ``q . k = sum_r s_r (q . a_r)(k . b_r)``, ``a_r = R_q^-1 p_r``, ``b_r =
      R_k^-1 w_r`` (``sv{r}``, largest singular value first; the identity holds for any query and
      key, biases included, when both projections have full rank);
    * with rotary: the rotation planes (dimensions ``e`` and ``e + d_head / 2``, ``plane{e}``,
      fastest first), which the rotary embedding leaves the dot product additive over.

    Returns the names and ``[n, subspace]`` parts (times the softmax scale)."""
    call = rec.calls[layer]
    q = call.query[:, head].double().cpu()[rows, query]  # [n, d_head]
    k = call.key[:, head // rec.graph.group].double().cpu()[rows, key]
    dh = q.shape[-1]
    if layer in rec.rope:
        half = dh // 2
        parts = q[:, :half] * k[:, :half] + q[:, half:] * k[:, half:]
        return [f"plane{e}" for e in range(half)], call.scale * parts
    w = head_weights(rec.an, layer, rec.graph)
    gain = _gain(rec.an.ln1[layer], rec.an.gain_offset)
    a = w["q"][head].detach().double() * gain  # [d_head, d]
    b = w["k"][head // rec.graph.group].detach().double() * gain
    qa_, ra = torch.linalg.qr(a.T)  # a^T = Q R: a = R^T Q^T
    qb_, rb = torch.linalg.qr(b.T)
    p, s, wt = torch.linalg.svd(ra @ rb.T)
    ar = torch.linalg.solve(ra, p)  # [d_head, r]: a_r as columns
    br = torch.linalg.solve(rb, wt.T)
    parts = s * (q @ ar) * (k @ br)
    return [f"sv{r}" for r in range(len(s))], call.scale * parts
