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

    def components(self, layer: int) -> list[str]:
        """The names of layer ``layer``'s components, the table's rows and columns."""
        n = self.graph.writers_before_attn(layer)
        return [self.graph.writer_name(w) for w in range(n)] + ["bias"]

    def pattern(self, layer: int) -> Float[Tensor, "row head query key"]:
        """The layer's attention pattern from its recorded call (float64)."""
        call = self.calls[layer]
        logits = self.logits(layer)
        cap = call.extras.get("softcap")
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return torch.softmax(logits.masked_fill(~self.visible(layer), -torch.inf), -1)

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
            cap = call.extras.get("softcap")
            capped = torch.tanh(logits / cap) * cap if cap else logits
            vis = self.visible(layer)
            vis = vis[:, 0 if vis.shape[1] == 1 else head]
            pat = torch.softmax(capped.masked_fill(~vis, -torch.inf), -1)
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
    the norms frozen at the run's values there.

    ``parts(rows, pos)``: ``[n, components, d_head]``, each component's part (the last: bias);
    ``full(x, rows, pos)``: the query or key the real pipeline makes from streams ``x`` (``[n,
    d_model]``, norms recomputed: what a knock-out reads)."""

    def __init__(self, rec: QKRecord, layer: int, head: int, side: str):
        self.rec, self.layer, self.side = rec, layer, side
        an, graph = rec.an, rec.graph
        w = head_weights(an, layer, graph)
        self.slot = head if side == "q" else head // graph.group
        self.w = w[side][self.slot].detach().double()  # [d_head, d_model]
        b = w[f"b{side}"]
        self.b = None if b is None else b[self.slot].detach().double()
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
        query/key norm, for the whole stream (real pipeline)."""
        s, kind = _norm_scale(self.norm, x)
        g = _gain(self.norm, self.offset)
        xd = x.double()
        if kind == "layer":
            xd = xd - xd.mean(-1, keepdim=True)
        y = xd * s * g
        beta = getattr(self.norm, "bias", None)
        if beta is not None:
            y = y + beta.detach().double()
        out = y @ self.w.T
        if self.b is not None:
            out = out + self.b
        return s, out

    def _rotate(self, v: Tensor, rows: Tensor, pos: Tensor) -> Tensor:
        """``v`` ``[n, m, d_head]`` rotated at each row's position (identity without rotary)."""
        if self.rotary is None:
            return v
        cos, sin = self.rec.rope[self.layer]
        c = cos[rows.to(cos.device) if cos.shape[0] > 1 else 0, pos].double()  # [n, d_head]
        s = sin[rows.to(sin.device) if sin.shape[0] > 1 else 0, pos].double()
        vv = v[:, :, None]  # [n, m, 1, d_head]: m as heads, one position
        out, _ = self.rotary(vv, vv[:1, :1], c[:, None], s[:, None])  # the key slot: a dummy
        return out[:, :, 0]

    def _qk_scale(self, pre: Tensor) -> Tensor:
        """The query/key norm's frozen scale times its gain (``[n, d_head]``), or 1."""
        if self.qk_norm is None:
            return torch.ones(1, 1, dtype=torch.float64)
        s, _ = _norm_scale(self.qk_norm, pre)
        return s * _gain(self.qk_norm, self.offset)

    def parts(self, rows: Tensor, pos: Tensor) -> Float[Tensor, "n component d_head"]:
        rec = self.rec
        x = rec.streams[self.layer][rows, pos].double()  # [n, d]
        comp = rec.writers[rows, pos, : self.n]  # [n, A, d], the model's dtype
        s, kind = _norm_scale(self.norm, x)
        w = self.w * _gain(self.norm, self.offset)  # [d_head, d]
        if kind == "layer":
            w = w - w.mean(-1, keepdim=True)  # the centring folded in
        # the widest product in the model's float32 (float64 costs twice the time); the parts
        # still add up exactly to the whole stream's projection, taken in float64, since the bias
        # is what the whole holds beyond them
        dt = torch.float64 if comp.dtype == torch.float64 else torch.float32
        lin = (comp.to(dt) @ w.T.to(dt)).double() * s[:, None]  # [n, A, d_head]
        _, whole = self._pre(x)  # the real projection of the whole stream
        bias = whole - lin.sum(1)  # the stream's constants, the norm's bias, the projection's
        out = torch.cat([lin, bias[:, None]], 1)
        out = out * self._qk_scale(whole)[:, None]
        return self._rotate(out, rows, pos)

    def part(self, rows: Tensor, pos: Tensor, a: int) -> Float[Tensor, "n d_head"]:
        """Stream component ``a``'s part alone (what :meth:`parts` gives in its column ``a``)."""
        rec = self.rec
        x = rec.streams[self.layer][rows, pos].double()
        s, kind = _norm_scale(self.norm, x)
        w = self.w * _gain(self.norm, self.offset)
        if kind == "layer":
            w = w - w.mean(-1, keepdim=True)
        lin = rec.writers[rows, pos, a].double() @ w.T * s  # [n, d_head]
        _, whole = self._pre(x)
        return self._rotate((lin * self._qk_scale(whole))[:, None], rows, pos)[:, 0]

    def full(self, x: Tensor, rows: Tensor, pos: Tensor) -> Float[Tensor, "n d_head"]:
        _, pre = self._pre(x)
        if self.qk_norm is not None:
            pre = pre * self._qk_scale(pre)
        return self._rotate(pre[:, None], rows, pos)[:, 0]

    def own(self, rows: Tensor, pos: Tensor) -> Float[Tensor, "n d_head"]:
        """The model's own query or key vector there, as its attention received it."""
        call = self.rec.calls[self.layer]
        t = call.query if self.side == "q" else call.key
        return t[rows.to(t.device), self.slot, pos.to(t.device)].double().cpu()


# ------------------------------------------------------------------------------ which (i, j)

#: key rules besides a named or numbered position
KEY_RULES = ("argmax", "sink", "induction")
#: query rules besides a named or numbered position
QUERY_RULES = ("last", "all")


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


def _position(spec, rows: int, n: int, positions: dict | None, what: str) -> Tensor:
    """A named (``positions[name]``, one per row) or numbered position (negative: from the end)
    as ``[rows]`` indices."""
    if positions and spec in positions:
        return torch.as_tensor(positions[spec], dtype=torch.long)
    try:
        p = int(spec)
    except (TypeError, ValueError):
        names = ", ".join(sorted(positions)) if positions else "none (not a task)"
        raise HeadscopeError(
            f"Unknown {what} position '{spec}'; use a number, a rule, or one of the task's "
            f"positions: {names}."
        ) from None
    if not -n <= p < n:
        raise HeadscopeError(f"The {what} position {p} is outside prompts of {n} tokens.")
    return torch.full((rows,), p % n, dtype=torch.long)


def instances(
    rec: QKRecord,
    layer: int,
    head: int,
    query="last",
    key="argmax",
    positions: dict | None = None,
    seed: int = 0,
) -> Instances:
    """Where head ``(layer, head)`` is decomposed, per row of ``rec``: the query positions
    (``last``, ``all`` from position 1, a number, or a task's named position) and each one's key
    (``argmax``: the key it attends to most; ``sink``: position 0; ``induction``: the token after
    the query token's previous occurrence, queries without one left out; a number or a named
    position, which must not come after its query: with ``all``, the queries before it are left
    out)."""
    ids = rec.ids
    rows_n, n = ids.shape
    pat = rec.head_pattern(layer, head)  # [row, query, key]
    vis = rec.visible(layer)
    vis = vis[:, 0 if vis.shape[1] == 1 else head].expand(rows_n, n, n)
    if query == "all":
        r, i = torch.meshgrid(torch.arange(rows_n), torch.arange(1, n), indexing="ij")
        r, i = r.reshape(-1), i.reshape(-1)
    else:
        spec = n - 1 if query == "last" else query
        i = _position(spec, rows_n, n, positions, "query")
        r = torch.arange(rows_n)
    if key == "argmax":
        j = pat[r, i].argmax(-1)
    elif key == "sink":
        j = torch.zeros_like(i)
    elif key == "induction":
        j = torch.full_like(i, -1)
        for t, (row, q) in enumerate(zip(r.tolist(), i.tolist(), strict=True)):
            seq = ids[row, :q].tolist()
            prev = [p for p, tok in enumerate(seq) if tok == int(ids[row, q])]
            if prev and prev[-1] + 1 < q:
                j[t] = prev[-1] + 1
        keep = j >= 0
        if not keep.any():
            raise HeadscopeError(
                "No query has an earlier occurrence of its token, so no induction target; "
                "use a repeated probe (--probe repeat) or another key rule."
            )
        r, i, j = r[keep], i[keep], j[keep]
    else:
        j = _position(key, rows_n, n, positions, "key")[r]
        if query == "all":  # every query that can see it: from the key's position on
            keep = i >= j
            r, i, j = r[keep], i[keep], j[keep]
        if (j > i).any():
            bad = int((j > i).nonzero()[0, 0])
            raise HeadscopeError(
                f"The key position {int(j[bad])} comes after its query {int(i[bad])} in row "
                f"{int(r[bad])}; a decoder's query sees only earlier keys."
            )
    ok = vis[r, i, j]
    if not ok.all():
        bad = int((~ok).nonzero()[0, 0])
        raise HeadscopeError(
            f"Query {int(i[bad])} cannot see key {int(j[bad])} in row {int(r[bad])} (the model's "
            "mask: causal, or a sliding window); choose a visible key."
        )
    gen = torch.Generator().manual_seed(seed)
    top = pat[r, i].argmax(-1)
    null = torch.empty_like(j)
    for t in range(len(r)):
        cand = vis[r[t], i[t]].nonzero()[:, 0]
        cand = cand[(cand != j[t]) & (cand != top[t])]
        if not len(cand):
            null[t] = -1
            continue
        dist = (cand - j[t]).abs()
        near = cand[dist == dist.min()]
        null[t] = near[torch.randint(len(near), (1,), generator=gen)]
    return Instances(r, i, j, null)


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
    q = qs.parts(rows, query)
    _check(q.sum(1), qs.own(rows, query), rec, layer, head, "query")
    scale = rec.calls[layer].scale
    logits = rec.head_logits(layer, head)
    n = len(rows)
    many = torch.cat(keys)
    k_all = ks.parts(rows.repeat(len(keys)), many)  # every key side in one pass
    _check(k_all.sum(1), ks.own(rows.repeat(len(keys)), many), rec, layer, head, "key")
    out = []
    for t, key in enumerate(keys):
        c = scale * q @ k_all[t * n : (t + 1) * n].transpose(1, 2)
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
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return torch.softmax(logits.masked_fill(~vis, -torch.inf), -1)

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


# ------------------------------------------------------------------------------ over prompts


def over_prompts(
    x: Tensor, resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """``x`` ``[prompt, m]`` (NaN: missing) -> the mean over prompts and its percentile bootstrap
    interval (``[m]`` each; NaN intervals when ``resamples`` is 0)."""
    from headscope.uncertainty import draw_weights

    ok = ~torch.isnan(x)
    m = torch.nansum(x, 0) / ok.sum(0).clamp(min=1)
    if not resamples:
        nan = torch.full_like(m, torch.nan)
        return m, nan, nan
    w = draw_weights(x.shape[0], resamples, seed)
    hits = w @ ok.double()
    boot = (w @ torch.nan_to_num(x)) / hits.clamp(min=1e-12)
    boot[hits == 0] = torch.nan
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.nanquantile(boot, q, dim=0)
    return m, lo, hi


@dataclass
class HeadTables:
    """One head's tables summed per prompt: ``sums[p]`` the table summed over prompt ``p``'s
    instances (``counts[p]`` of them), ``null_sums``/``null_counts`` at their null keys; ``logit``
    and ``attn``: per prompt, the mean logit and attention on the chosen keys."""

    components: list[str]
    sums: Tensor
    counts: Tensor
    null_sums: Tensor
    null_counts: Tensor
    logit: Tensor
    attn: Tensor


def head_tables(
    rec: QKRecord, layer: int, head: int, inst: Instances, prompts: Tensor, n_prompts: int,
    chunk: int = 64,
) -> HeadTables:  # fmt: skip
    """Sum head ``(layer, head)``'s tables per prompt (``prompts[row]``: the prompt of each of
    ``rec``'s rows, ``n_prompts`` in all), in chunks of ``chunk`` instances."""
    a = rec.graph.writers_before_attn(layer) + 1
    sums = torch.zeros(n_prompts, a, a, dtype=torch.float64)
    null_sums = torch.zeros_like(sums)
    counts = torch.zeros(n_prompts, dtype=torch.float64)
    null_counts = torch.zeros_like(counts)
    logit = torch.zeros(n_prompts, dtype=torch.float64)
    attn = torch.zeros(n_prompts, dtype=torch.float64)
    pat = rec.head_pattern(layer, head)
    for s in range(0, len(inst), chunk):
        r, i = inst.rows[s : s + chunk], inst.query[s : s + chunk]
        j, nj = inst.key[s : s + chunk], inst.null[s : s + chunk]
        p = prompts[r]
        ok = nj >= 0
        c, cn = tables(rec, layer, head, r, i, [j, nj.clamp(min=0)])  # a missing null: dropped
        sums.index_add_(0, p, c)
        counts.index_add_(0, p, torch.ones(len(r), dtype=torch.float64))
        logit.index_add_(0, p, c.sum((1, 2)))
        attn.index_add_(0, p, pat[r, i, j])
        if ok.any():
            null_sums.index_add_(0, p[ok], cn[ok])
            null_counts.index_add_(0, p[ok], torch.ones(int(ok.sum()), dtype=torch.float64))
    return HeadTables(rec.components(layer), sums, counts, null_sums, null_counts, logit, attn)


def merge(tables: list[HeadTables]) -> HeadTables:
    """The tables of one head from several records (prompts of other lengths) added up."""
    first = tables[0]
    add = lambda name: sum(getattr(t, name) for t in tables)  # noqa: E731
    return HeadTables(
        first.components,
        *(add(n) for n in ("sums", "counts", "null_sums", "null_counts", "logit", "attn")),
    )


def summarise(
    t: HeadTables, top: int = 20, resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> dict:
    """One head's results over prompts: ``table`` (the mean table, ``[component, component]``),
    ``pairs`` (the ``top`` pairs by ``|contribution|``: each with its interval over prompts, its
    null at the null keys and the difference, each with an interval), ``query_side`` and
    ``key_side`` (each component's total on its side: a row or column sum; per prompt, and per
    prompt at the null keys, in ``per_prompt_sides``), ``logit`` and ``attn`` (each ``(mean,
    low, high)``), ``n_prompts``, ``n_instances``."""
    used = t.counts > 0
    n = int(used.sum())
    if not n:
        raise HeadscopeError("No prompt has an instance of this query and key rule.")
    per = t.sums[used] / t.counts[used, None, None]  # [prompt, a, b]: each prompt's mean
    has_null = t.null_counts[used] > 0
    null = torch.full_like(per, torch.nan)
    null[has_null] = t.null_sums[used][has_null] / t.null_counts[used][has_null, None, None]
    mean = per.mean(0)

    def stat(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return over_prompts(x, resamples, level, seed)

    order = mean.reshape(-1).abs().argsort(descending=True)[:top]
    a_idx, b_idx = order // mean.shape[1], order % mean.shape[1]
    flat = per.reshape(n, -1)[:, order]
    nflat = null.reshape(n, -1)[:, order]
    c, c_lo, c_hi = stat(flat)
    nu, nu_lo, nu_hi = stat(nflat)
    d, d_lo, d_hi = stat(flat - nflat)
    names = t.components
    pairs = [
        {
            "query_component": names[a],
            "key_component": names[b],
            "contribution": float(c[k]),
            "ci_low": float(c_lo[k]),
            "ci_high": float(c_hi[k]),
            "null": float(nu[k]),
            "null_low": float(nu_lo[k]),
            "null_high": float(nu_hi[k]),
            "above_null": float(d[k]),
            "above_null_low": float(d_lo[k]),
            "above_null_high": float(d_hi[k]),
        }
        for k, (a, b) in enumerate(zip(a_idx.tolist(), b_idx.tolist(), strict=True))
    ]
    sides = {}
    for side, dim in (("query_side", 2), ("key_side", 1)):
        tot, lo, hi = stat(per.sum(dim))
        sides[side] = [
            {"component": names[x], "total": float(tot[x]), "ci_low": float(lo[x]),
             "ci_high": float(hi[x])}
            for x in range(len(names))
        ]  # fmt: skip
    logit = stat((t.logit[used] / t.counts[used])[:, None])
    attn = stat((t.attn[used] / t.counts[used])[:, None])
    return {
        "table": mean,
        # [prompt, component]: query side, key side; then the same at the null keys
        "per_prompt_sides": (per.sum(2), per.sum(1), null.sum(2), null.sum(1)),
        "pairs": pairs,
        **sides,
        "logit": tuple(float(x[0]) for x in logit),
        "attn": tuple(float(x[0]) for x in attn),
        "n_prompts": n,
        "n_instances": int(t.counts.sum()),
    }


def knockout_summary(
    recs: list[tuple[QKRecord, Instances, Tensor]],
    layer: int,
    head: int,
    pairs: list[dict],
    n_prompts: int,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> list[dict]:
    """For each pair of ``pairs`` (names from :func:`summarise`): the exact knock-outs of its
    query-side and key-side component beside their first-order estimates, each the mean change
    of the attention on the chosen key over prompts with an interval."""
    from headscope.uncertainty import draw_weights

    out = []
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    cs = [  # each instance's key-side totals (what the first-order key-side change reads)
        torch.cat([table(rec, layer, head, inst.rows[s : s + 64], inst.query[s : s + 64],
                         inst.key[s : s + 64]).sum(1) for s in range(0, len(inst), 64)])
        for rec, inst, _ in recs
    ]  # fmt: skip
    for pair in pairs:
        sums = torch.zeros(n_prompts, 4, dtype=torch.float64)
        counts = torch.zeros(n_prompts, dtype=torch.float64)
        for (rec, inst, prompts), c in zip(recs, cs, strict=True):
            names = rec.components(layer)
            a, b = names.index(pair["query_component"]), names.index(pair["key_component"])
            ko = knockouts(rec, layer, head, inst, a, b, c)
            vals = torch.stack([ko[k] for k in ("ko_q", "fo_q", "ko_k", "fo_k")], 1)
            p = prompts[inst.rows]
            sums.index_add_(0, p, vals)
            counts.index_add_(0, p, torch.ones(len(p), dtype=torch.float64))
        used = counts > 0
        per = sums[used] / counts[used, None]
        row = {"query_component": pair["query_component"], "key_component": pair["key_component"]}
        m = per.mean(0)
        if resamples:
            w = draw_weights(int(used.sum()), resamples, seed) / int(used.sum())
            lo, hi = torch.quantile(w @ per, q, dim=0)
        else:
            lo = hi = torch.full_like(m, torch.nan)
        for k, name in enumerate(("knockout_query", "first_order_query", "knockout_key",
                                  "first_order_key")):  # fmt: skip
            row[name], row[f"{name}_low"], row[f"{name}_high"] = (
                float(m[k]),
                float(lo[k]),
                float(hi[k]),
            )
        out.append(row)
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


def subspace_summary(
    recs: list[tuple[QKRecord, Instances, Tensor]],
    layer: int,
    head: int,
    n_prompts: int,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> list[dict]:
    """Each subspace's part of the logit (:func:`subspaces`), the mean over prompts of each
    prompt's mean over its instances, with an interval; largest ``|part|`` first."""
    sums, counts, names = None, torch.zeros(n_prompts, dtype=torch.float64), None
    for rec, inst, prompts in recs:
        names, parts = subspaces(rec, layer, head, inst.rows, inst.query, inst.key)
        if sums is None:
            sums = torch.zeros(n_prompts, parts.shape[1], dtype=torch.float64)
        p = prompts[inst.rows]
        sums.index_add_(0, p, parts)
        counts.index_add_(0, p, torch.ones(len(p), dtype=torch.float64))
    used = counts > 0
    m, lo, hi = over_prompts(sums[used] / counts[used, None], resamples, level, seed)
    order = m.abs().argsort(descending=True).tolist()
    return [
        {"subspace": names[x], "contribution": float(m[x]), "ci_low": float(lo[x]),
         "ci_high": float(hi[x])}
        for x in order
    ]  # fmt: skip
