"""The forwards of the edge graph (:mod:`headscope.circuits.edge_graph`): one forward of the model's
own modules with each reader fed its own copy of the residual stream (docs/discover.md).

In any forward the residual stream entering a reader is the sum of the writers before it plus
constants (biases, the same in every run). So a reader whose incoming edges from writers ``W'``
are cut reads

    x_r  =  stream_r  -  sum over w in W' of (live_w - replacement_w)

where ``live_w`` is the writer's value in this same forward and ``replacement_w`` its value in
the run it is patched from (the other prompt, a mean, or zero). That one identity is every
intervention here:

* :class:`Cut` (a circuit: cut every edge outside it, one forward for the batch; a circuit with
  every edge is the unpatched run bit for bit, one with none reads only replacements);
* :class:`Single` (exact edge patching: each row of a repeated batch cuts one edge, whose writer
  is below its reader, so ``live_w`` is the base run's and the forward starts at the reader's
  layer from the base run's kept residual stream);
* gradients (``on_grad``, nothing cut): ``d metric / d x_r`` for every reader, what edge
  attribution patching (EAP) reads, from one unmodified forward and backward. An MLP's or the
  logits' reader is its norm's whole input, so a copy of the stream in front of that norm carries
  its gradient. A head's query, key or value reader is one slice of a projection after the layer's
  shared norm: its gradient is the gradient at that slice of the projection's output, taken back
  through the slice's weights (``g_r W_r``, unsummed over heads) and through the norm's
  vector-Jacobian product at the run's own input (:func:`norm_vjp`, every reader at once). That
  is the chain rule of the copies a cut makes, without running the norm and the backward once
  per reader.

How a layer's readers get their copies without running the layer once per reader: the copies go
through the layer's own input norm (a norm acts on the last axis, whatever is in front), then each
copy through its own head's slice of the query, key or value projection (as many multiply-adds as
the projection itself), and the projections' outputs are handed to the model's attention module,
which applies everything after them (query/key norms, rotary embeddings, the attention, the output
projection) as it always does. Layers with nothing to cut run untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.circuits.edge_graph import Anatomy, EdgeGraph

GradHook = Callable[[slice | int, Tensor], None]


@dataclass
class Cut:
    """Cut the edges where ``cut[w, r]`` is True (a ``[writer, reader]`` mask, the same for every
    row), each writer replaced by ``replacement[:, :, w]`` (``[rows, pos, writer, d_model]``, or
    already writer-major: ``[writer, rows * pos * d_model]``, see :func:`writer_major`)."""

    cut: Bool[Tensor, "writer reader"]
    replacement: Float[Tensor, "row pos writer d_model"]
    #: memory for the writers' differences (``[writer + 1, rows * pos * d_model]``), reused from
    #: one circuit's forward to the next (a fresh buffer costs its page faults every time)
    workspace: Tensor | None = None


@dataclass
class Single:
    """Row ``i`` reads ``reader[i]``'s input minus ``delta[i]`` (``[rows, pos, d_model]``): one
    edge cut per row, ``delta = base_w - source_w`` of its writer (times a dose ``t``)."""

    reader: Int[Tensor, " row"]
    delta: Float[Tensor, "row pos d_model"]


def head_weights(an: Anatomy, layer: int, graph: EdgeGraph) -> dict[str, Tensor]:
    """Layer ``layer``'s projections per head: ``q`` ``[head, d_head, d_model]``, ``k``/``v``
    ``[kv_head, d_head, d_model]`` (biases ``bq``, ``bk``, ``bv`` or None) and ``o`` ``[head,
    d_head, d_model]`` (what head ``h``'s output ``z_h`` is multiplied by)."""
    H, KV = graph.n_heads, graph.n_heads // graph.group  # the model's KV heads
    out: dict[str, Tensor | None] = {}
    if an.fused:  # GPT-2's Conv1D: x @ W + b, W [d_model, 3 * d_model]
        w, b = an.q_proj[layer].weight, an.q_proj[layer].bias
        d = w.shape[0]
        for i, name in enumerate("qkv"):
            out[name] = w[:, i * d : (i + 1) * d].T.reshape(H, -1, d)
            out[f"b{name}"] = None if b is None else b[i * d : (i + 1) * d].reshape(H, -1)
        out["o"] = an.o_proj[layer].weight.reshape(H, -1, d)  # [H * d_head, d_model]
        return out
    for name, mod, n in (
        ("q", an.q_proj[layer], H),
        ("k", an.k_proj[layer], KV),
        ("v", an.v_proj[layer], KV),
    ):
        out[name] = mod.weight.reshape(n, -1, mod.weight.shape[1])  # [out, in] -> [n, d_head, in]
        out[f"b{name}"] = None if mod.bias is None else mod.bias.reshape(n, -1)
        if name != "q" and graph.kv_mode == "head" and graph.group > 1:  # per query head
            out[name] = out[name].repeat_interleave(graph.group, 0)
            if out[f"b{name}"] is not None:
                out[f"b{name}"] = out[f"b{name}"].repeat_interleave(graph.group, 0)
    w = an.o_proj[layer].weight  # [d_model, H * d_head]
    out["o"] = w.T.reshape(H, -1, w.shape[0])
    return out


def _project(y: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """``[n, rows, pos, d_model]`` copies through their own heads' ``[n, d_head, d_model]``
    weights: ``[rows, pos, n * d_head]``."""
    out = torch.einsum("nbpd,ned->bpne", y, w)
    if b is not None:
        out = out + b
    return out.reshape(*out.shape[:2], -1)


def writer_major(x: Tensor) -> Tensor:
    """``[rows, pos, writer, d_model]`` as ``[writer, rows * pos * d_model]`` (a Cut's layout)."""
    return x.permute(2, 0, 1, 3).reshape(x.shape[2], -1)


def _corrections(cut: Tensor, diff: Tensor) -> Tensor:
    """``[n, cols]``: for each reader (a column of ``cut``, ``[w, n]``), the sum of the rows of
    ``diff`` it cuts (``diff``: ``[more than w, cols]``, its last row the sum of the first
    ``w``). A dense product multiplies every cell of ``cut``; a sparse one (compressed rows) adds
    a row of ``diff`` per term, each reader summing the smaller of its cut edges and its kept ones
    (``total - kept``). A term reads its row from memory where a cell is one multiply-add of a
    cached row, about 8 cells' time on a CPU (measured on SmolLM2's rows, 276k floats), so the
    sparse way is taken when it makes fewer terms than an eighth of the cells."""
    w, n = cut.shape
    flip = cut.sum(0) * 2 > w  # more cut than kept
    marks = torch.where(flip, ~cut, cut)
    terms = int(marks.sum()) + int(flip.sum())
    if 8 * terms >= w * n:
        return cut.T.to(diff.dtype) @ diff[:w]
    col, row = marks.T.nonzero().T
    sign = torch.where(flip[col], -1.0, 1.0)
    total = flip.nonzero()[:, 0]
    idx = torch.stack([torch.cat([col, total]), torch.cat([row, torch.full_like(total, -1)])])
    idx[1] %= diff.shape[0]  # -1: the last row, the total
    vals = torch.cat([sign, torch.ones(len(total))]).to(diff.dtype)
    m = torch.sparse_coo_tensor(idx, vals, (n, diff.shape[0]), check_invariants=False)
    return m.coalesce().to_sparse_csr() @ diff


def norm_vjp(norm, x: Tensor, gain_offset: float = 0.0) -> tuple[Callable, bool]:
    """The vector-Jacobian product of the norm module ``norm`` at its input ``x`` (``[rows, pos,
    d_model]``), for many cotangents at once, and whether it applies the norm's gain itself.

    ``vjp(u)``: ``u`` ``[n, rows, pos, d_model]``, gradients at the norm's output (already times
    the gain when the second value is False) to ``[n, rows, pos, d_model]`` at its input (``u``
    is overwritten). An RMS norm ``y = g x s``, ``s = (mean x^2 + eps)^-1/2``, gives ``s (g u - s^2
    x mean(x g u))``; a layer norm ``y = g x^ + b``, ``x^ = (x - mean x) s``, gives ``s (g u -
    mean(g u) - x^ mean(x^ g u))``. A norm of another kind (or without a readable epsilon):
    ``torch.func.vjp`` of its own forward, which applies its gain."""
    name = type(norm).__name__
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    kind = "layer" if name.endswith("LayerNorm") else "rms" if "RMSNorm" in name else None
    if kind is None or eps is None:
        _, fn = torch.func.vjp(norm.forward, x.detach())
        return (lambda u: torch.func.vmap(fn)(u)[0]), True
    dt = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    x = x.detach().to(dt)
    if kind == "layer":
        x = x - x.mean(-1, keepdim=True)
    s = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # [rows, pos, 1]
    xh = x * s if kind == "layer" else x  # what the projection of u is taken against
    k = s.pow(2) if kind == "rms" else torch.ones_like(s)  # xh k = x s^2 (rms), x^ (layer)
    d = x.shape[-1]

    def vjp(u: Tensor) -> Tensor:
        out_dtype, u = u.dtype, u.to(dt)
        c = torch.einsum("nbpd,bpd->nbp", u, xh)[..., None] * (k / d)  # [n, rows, pos, 1]
        if kind == "layer":
            u = u - u.mean(-1, keepdim=True)
        return u.addcmul_(c, xh, value=-1).mul_(s).to(out_dtype)

    return vjp, False


def _stream(args: tuple, kwargs: dict) -> Tensor:
    return args[0] if args else kwargs["hidden_states"]


class EdgeForward:
    """The hooks of one forward (a context manager around ``Model.run``).

    ``record``: fill ``self.writers`` (``[rows, pos, writer, d_model]``, detached) with every
    writer's value. ``cut`` / ``single``: the interventions above. ``on_grad(readers, g)``: split
    every reader and call it with each reader's gradient during the backward (``readers``: a slice
    of the reader axis and ``g`` ``[n, rows, pos, d_model]``, or one reader and ``[rows, pos,
    d_model]``). ``embed``: block 0's input replaced (integrated gradients' interpolation).
    """

    def __init__(
        self,
        model,
        an: Anatomy,
        graph: EdgeGraph,
        *,
        record: bool = False,
        cut: Cut | None = None,
        single: Single | None = None,
        on_grad: GradHook | None = None,
        embed: Tensor | None = None,
    ):
        self.model, self.an, self.graph = model, an, graph
        self.record = record or cut is not None
        self.cut, self.single, self.on_grad, self.embed = cut, single, on_grad, embed
        self.writers: Tensor | None = None
        self.cut_only = cut is not None and not record  # no [rows, pos, writer, d] copy kept
        if on_grad is not None and (cut is not None or single is not None):
            raise ValueError("on_grad reads an unpatched forward's gradients: no cut, no single.")
        self.tap = on_grad is not None
        self._vjp: dict[int, tuple[Callable, bool]] = {}
        self._tap_w: dict[tuple, Tensor] = {}
        self._diff: Tensor | None = None
        self._prefix: dict[int, Tensor] = {}  # an MLP reader's correction over the layer's inputs
        self._total: Tensor | None = None
        if cut is not None:  # [writer, rows * pos * d_model]
            r = cut.replacement
            self._repl = r if r.dim() == 2 else r.permute(2, 0, 1, 3).reshape(r.shape[2], -1)
            # a writer no reader cuts needs no difference: its row stays 0, out of the total too
            self._cut_any = cut.cut.any(1).tolist()
        self._stash: dict[tuple[int, str], Tensor] = {}
        self._weights = [head_weights(an, la, graph) for la in range(graph.n_layers)]
        if cut is not None:
            self._n_in = graph.writers_before()

    # -------------------------------------------------------------------------- writers

    def _keep(self, first: int, values: Tensor) -> None:
        """Writers ``first ..`` of every row get ``values`` (``[rows, pos, n, d_model]``)."""
        rows, pos, n, d = values.shape
        if self.record and not self.cut_only:
            if self.writers is None:
                self.writers = values.new_empty(rows, pos, self.graph.n_writers, d)
            self.writers[:, :, first : first + n] = values.detach()
        if (
            self.cut is not None
        ):  # live - replacement, writer-major; its running sum in the last row
            if self._diff is None:  # every writer's row is written (or zeroed) as it comes
                shape = (self.graph.n_writers + 1, rows * pos * d)
                ws = self.cut.workspace
                ok = ws is not None and ws.shape == shape and ws.dtype == values.dtype
                self._diff = ws if ok else values.new_empty(shape)
                self.cut.workspace = self._diff
                self._total = self._diff[-1]
                self._total.zero_()
            live = [i for i in range(n) if self._cut_any[first + i]]
            if not live:
                self._diff[first : first + n].zero_()
                return
            if live[0] > 0 or live[-1] < n - 1:
                self._diff[first : first + live[0]].zero_()
                self._diff[first + live[-1] + 1 : first + n].zero_()
            a, z = live[0], live[-1] + 1  # the cut ones' span (the others in it: exact zeros)
            got = self._diff[first + a : first + z]
            torch.sub(
                values.detach()[:, :, a:z].permute(2, 0, 1, 3),
                self._repl[first + a : first + z].view(z - a, rows, pos, d).to(values),
                out=got.view(z - a, rows, pos, d),
            )
            if len(live) < z - a:
                got[[i - a for i in range(a, z) if not self._cut_any[first + i]]] = 0.0
            self._total += got.sum(0)

    def head_writes(self, layer: int, z: Tensor, out: Tensor) -> Tensor:
        """``[rows, pos, head, d_model]``: each head's write from the output projection's input
        ``z`` (``[rows, pos, head * d_head]``) and output ``out`` (its RMS where a norm
        follows)."""
        w = self._weights[layer]["o"]
        rows, pos = z.shape[:2]
        heads = torch.einsum("bphe,hed->bphd", z.reshape(rows, pos, self.graph.n_heads, -1), w)
        if self.an.post_attn is not None:
            norm = self.an.post_attn[layer]
            eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6))
            scale = torch.rsqrt(out.float().pow(2).mean(-1, keepdim=True) + eps)  # [rows, pos, 1]
            gain = norm.weight.float() + self.an.gain_offset  # [d_model]
            heads = (heads.float() * scale[:, :, None] * gain).to(heads.dtype)
        return heads

    # -------------------------------------------------------------------------- readers

    def _cut(self, readers: slice | int, stream: Tensor):
        """A :class:`Cut`'s copies for ``readers``: ``(x [copies, rows, pos, d_model], inv [n])``,
        reader ``i`` reading copy ``inv[i]`` (readers with nothing cut share the stream itself,
        those with everything cut the replacements' stream; each other reader sums the smaller of
        its cut and its kept edges); None when nothing is cut here. One reader (an int): ``x`` is
        ``[rows, pos, d_model]`` and ``inv`` None."""
        one = isinstance(readers, int)
        n_in = int(self._n_in[readers if one else readers.start])
        k = self.cut.cut[:n_in, readers]  # [n_in] or [n_in, n]: True = cut
        k = k[:, None] if one else k
        per = k.sum(0)  # [n]: edges cut into each reader
        if not per.any():
            return None
        rows, pos, d = stream.shape[0], stream.shape[1], stream.shape[-1]

        def flat(t: Tensor) -> Tensor:  # [m, rows * pos * d] -> [m, rows, pos, d]
            return t.view(-1, rows, pos, d).to(stream.dtype)

        none, every = per == 0, per == n_in
        mixed = (~none & ~every).nonzero()[:, 0]
        u = int(none.any()) + int(every.any()) + len(mixed)
        x = stream.new_empty(u, *stream.shape)
        inv, at = torch.empty(k.shape[1], dtype=torch.long), 0
        if none.any():
            inv[none], at = at, at + 1
            x[0] = stream
        if every.any():
            inv[every], at = at, at + 1
            torch.sub(stream, flat(self._total[None])[0], out=x[at - 1])
        if len(mixed) and one and readers in self._prefix:  # an MLP: its heads added to it
            heads = k[self._n_in[readers] - self.graph.n_heads :, 0].to(self._diff.dtype)
            corr = self._prefix.pop(readers) + heads @ self._diff[n_in - len(heads) : n_in]
            torch.sub(stream, flat(corr[None])[0], out=x[at])
        elif len(mixed):
            inv[mixed] = at + torch.arange(len(mixed))
            cols, mlp = k[:, mixed], None
            if not one:  # the layer's MLP reader, if partly cut, rides along on its first rows
                mlp = readers.stop
                whole = self.cut.cut[: int(self._n_in[mlp]), mlp]
                if 0 < int(whole.sum()) < len(whole):
                    cols = torch.cat([cols, whole[:n_in, None]], 1)
                else:
                    mlp = None
            corr = _corrections(cols, self._diff)  # rows :n_in and the total
            if mlp is not None:
                self._prefix[mlp], corr = corr[-1], corr[:-1]
            torch.sub(stream[None], flat(corr), out=x[at:])
        return (x[0], None) if one else (x, inv)

    def _single(self, readers: slice | int, stream: Tensor) -> Tensor | None:
        """A :class:`Single`'s correction for ``readers`` (``[n, rows, pos, d_model]``, or ``[rows,
        pos, d_model]`` for one reader; None: nothing here)."""
        r = self.single.reader.to(stream.device)
        if isinstance(readers, int):
            hit = r == readers
            if not hit.any():
                return None
            return self.single.delta.to(stream) * hit[:, None, None]
        slot = r - readers.start
        hit = (slot >= 0) & (slot < readers.stop - readers.start)
        if not hit.any():
            return None
        corr = stream.new_zeros(readers.stop - readers.start, *stream.shape)
        idx = hit.nonzero()[:, 0]
        corr[slot[idx], idx] = self.single.delta.to(stream)[idx]
        return corr

    def _split(self, readers: slice | int, stream: Tensor):
        """The readers' own copies of ``stream``: ``(x, inv)`` as :meth:`_cut` gives them (``inv``
        None: one copy per reader), or None to leave the layer as it is."""
        if self.cut is not None:
            return self._cut(readers, stream)
        one = isinstance(readers, int)
        if self.single is not None:
            corr = self._single(readers, stream)
            if corr is None:
                return None
            return (stream - corr if one else stream[None] - corr), None
        if self.on_grad is not None and one:  # an MLP's or the logits' reader: a copy's gradient
            x = stream.clone()
            if x.requires_grad:
                x.register_hook(lambda g, readers=readers: self.on_grad(readers, g))
            return x, None
        return None

    def _tap(self, layer: int, kinds: tuple[str, ...], g: Tensor) -> None:
        """The gradient ``g`` at layer ``layer``'s projection output (``kinds``' slices side by
        side) as each reader's gradient at its copy of the stream in front of the norm (handed
        to ``on_grad`` reader-major, ``[n, rows, pos, d_model]``)."""
        graph = self.graph
        H, KV = graph.n_heads, graph.n_kv
        start = graph.attn_slice(layer).start
        at = {"q": (0, H), "k": (H, KV), "v": (H + KV, KV)}
        vjp, own_gain = self._vjp[layer]
        rows, pos = g.shape[:2]
        col = 0
        for kind in kinds:
            first, n = at[kind]
            w = self._taps(layer, kind, own_gain).to(g)  # [n, d_head, d_model]
            width = w.shape[0] * w.shape[1]
            gk = g[..., col : col + width].reshape(rows * pos, n, -1).transpose(0, 1)
            col += width
            u = torch.bmm(gk, w).view(n, rows, pos, -1)  # at the norm's output (times its gain)
            self.on_grad(slice(start + first, start + first + n), vjp(u))

    def _taps(self, layer: int, kind: str, own_gain: bool) -> Tensor:
        """The ``kind`` projection's per-head weights, times the norm's gain unless the norm's
        vector-Jacobian product applies it."""
        key = (layer, kind, own_gain)
        if key not in self._tap_w:
            w = self._weights[layer][kind]
            norm = self.an.ln1[layer]
            gain = getattr(norm, "weight", None)
            if not own_gain and gain is not None:
                w = w * (gain.detach() + self.an.gain_offset).to(w)
            self._tap_w[key] = w
        return self._tap_w[key]

    # -------------------------------------------------------------------------- hooks

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        an, g = self.an, self.graph
        H, KV = g.n_heads, g.n_kv
        handles = []
        patched = []
        groups: list = []  # (attention module, its num_key_value_groups) to restore

        def block0(module, args, kwargs):
            x = _stream(args, kwargs)
            replace = self.embed is not None or (self.on_grad is not None and not x.requires_grad)
            if self.embed is not None:
                x = self.embed.to(x)
            if self.on_grad is not None and not x.requires_grad:  # the first readers' gradients too
                x = x.detach().requires_grad_(True)
            if replace:
                args, kwargs = (
                    ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})
                )
            if self.record:
                self._keep(0, x[:, :, None])
            return (args, kwargs) if replace else None

        def ln1(module, args, la):
            if self.tap:  # the norm's vector-Jacobian product at this run's input, for _tap
                x = args[0]
                if x.requires_grad:
                    self._vjp[la] = norm_vjp(module, x, an.gain_offset)
                return None
            got = self._split(g.attn_slice(la), args[0])
            if got is None:
                return None
            x, inv = got
            if x.shape[0] == 1:  # every reader reads one copy (all cut): the model's own path
                return (x[0], *args[1:])
            y = module.forward(x)  # [copies, rows, pos, d_model]: the norm, copy by copy
            if inv is not None:
                y = y[inv.to(y.device)]  # [H + 2 KV, rows, pos, d_model]
            w = self._weights[la]
            self._stash[(la, "q")] = _project(y[:H], w["q"], w["bq"])
            self._stash[(la, "k")] = _project(y[H : H + KV], w["k"], w["bk"])
            self._stash[(la, "v")] = _project(y[H + KV :], w["v"], w["bv"])
            return None

        per_head = g.kv_mode == "head" and g.group > 1 and not an.fused

        def projection(mod, la, kinds):
            own = type(mod).forward
            expand = per_head and kinds[0] in ("k", "v")

            def forward(x, *a, **k):
                if (la, kinds[0]) not in self._stash:
                    out = own(mod, x, *a, **k)
                    if expand:  # [.., KV * d_head] -> [.., H * d_head]: query head h's own copy
                        shape = out.shape[:-1]
                        out = out.view(*shape, H // g.group, -1).repeat_interleave(g.group, -2)
                        out = out.reshape(*shape, -1)
                    return out
                got = [self._stash.pop((la, kind)) for kind in kinds]
                return got[0] if len(got) == 1 else torch.cat(got, -1)

            mod.forward = forward
            patched.append(mod)

        def tap(module, args, out, la, kinds):
            if out.requires_grad:
                out.register_hook(lambda grad: self._tap(la, kinds, grad))

        def o_proj(module, args, out, la):
            first = g.head_writer(la, 0)
            if self.cut_only and not any(self._cut_any[first : first + H]):
                self._diff[first : first + H].zero_()  # no head here is cut anywhere: no write
                return
            if self.record:
                self._keep(g.head_writer(la, 0), self.head_writes(la, args[0], out))

        def ln2(module, args, la):
            got = self._split(g.mlp_reader(la), args[0])
            return None if got is None else (got[0], *args[1:])

        def mlp(module, args, out, la):
            if self.record:
                self._keep(g.mlp_writer(la), out[:, :, None])

        def final(module, args):
            got = self._split(g.logits_reader, args[0])
            return None if got is None else (got[0], *args[1:])

        try:
            blocks = self.model.blocks()
            handles.append(blocks[0].register_forward_pre_hook(block0, with_kwargs=True))
            for la in range(g.n_layers):
                handles.append(
                    an.ln1[la].register_forward_pre_hook(lambda m, a, la=la: ln1(m, a, la))
                )
                mods = (
                    [(an.q_proj[la], ("q", "k", "v"))]
                    if an.fused
                    else [(an.q_proj[la], ("q",)), (an.k_proj[la], ("k",)), (an.v_proj[la], ("v",))]
                )
                for mod, kinds in mods:
                    if self.tap:
                        handles.append(
                            mod.register_forward_hook(
                                lambda m, a, o, la=la, kinds=kinds: tap(m, a, o, la, kinds)
                            )
                        )
                    if not self.tap or (per_head and kinds[0] != "q"):
                        projection(mod, la, kinds)
                if per_head:  # every query head reads its own key and value: no repeat inside
                    groups.append((an.attn[la], an.attn[la].num_key_value_groups))
                    an.attn[la].num_key_value_groups = 1
                handles.append(
                    an.o_proj[la].register_forward_hook(lambda m, a, o, la=la: o_proj(m, a, o, la))
                )
                handles.append(
                    an.ln2[la].register_forward_pre_hook(lambda m, a, la=la: ln2(m, a, la))
                )
                handles.append(
                    an.mlp_out[la].register_forward_hook(lambda m, a, o, la=la: mlp(m, a, o, la))
                )
            handles.append(an.final_norm.register_forward_pre_hook(final))
            yield
        finally:
            for h in handles:
                h.remove()
            for mod in patched:
                mod.__dict__.pop("forward", None)
            for attn, n in groups:
                attn.num_key_value_groups = n
            self._stash.clear()
            self._vjp.clear()
