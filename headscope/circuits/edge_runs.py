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
* gradients: every reader's copy is a separate tensor whose gradient is ``d metric / d x_r``,
  what edge attribution patching (EAP) reads.

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
    H, KV = graph.n_heads, graph.n_kv
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
    w = an.o_proj[layer].weight  # [d_model, H * d_head]
    out["o"] = w.T.reshape(H, -1, w.shape[0])
    return out


def _project(y: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """``[rows, pos, n, d_model]`` copies through their own heads' ``[n, d_head, d_model]`` weights:
    ``[rows, pos, n * d_head]``."""
    out = torch.einsum("bpnd,ned->bpne", y, w)
    if b is not None:
        out = out + b
    return out.reshape(*out.shape[:2], -1)


def writer_major(x: Tensor) -> Tensor:
    """``[rows, pos, writer, d_model]`` as ``[writer, rows * pos * d_model]`` (a Cut's layout)."""
    return x.permute(2, 0, 1, 3).reshape(x.shape[2], -1)


def _sum_rows(mask: Tensor, x: Tensor) -> Tensor:
    """``[n, cols]``: for each column ``c`` of ``mask`` (``[w, n]``), the sum of the rows ``w`` of
    ``x`` (``[w, cols]``) it marks; sparse when few are marked, one product otherwise."""
    w, n = mask.shape
    marked = int(mask.sum())
    if marked * 4 < w * n:
        idx = mask.T.nonzero().T  # [2, marked]: (column, row)
        m = torch.sparse_coo_tensor(
            idx, torch.ones(marked, dtype=x.dtype), (n, w), check_invariants=False
        )
        return torch.sparse.mm(m, x)
    return mask.T.to(x.dtype) @ x


def _stream(args: tuple, kwargs: dict) -> Tensor:
    return args[0] if args else kwargs["hidden_states"]


class EdgeForward:
    """The hooks of one forward (a context manager around ``Model.run``).

    ``record``: fill ``self.writers`` (``[rows, pos, writer, d_model]``, detached) with every
    writer's value. ``cut`` / ``single``: the interventions above. ``on_grad(readers, g)``: split
    every reader and call it with each reader's gradient during the backward (``readers``: a slice
    of the reader axis and ``g`` ``[rows, pos, n, d_model]``, or one reader and ``[rows, pos,
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
        self._diff: Tensor | None = None
        self._total: Tensor | None = None
        if cut is not None:  # [writer, rows * pos * d_model]
            r = cut.replacement
            self._repl = r if r.dim() == 2 else r.permute(2, 0, 1, 3).reshape(r.shape[2], -1)
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
        if self.cut is not None:  # live - replacement, writer-major, and its running sum
            if self._diff is None:
                self._diff = values.new_empty(self.graph.n_writers, rows * pos * d)
                self._total = values.new_zeros(rows * pos * d)
            got = values.detach().permute(2, 0, 1, 3).reshape(n, -1)
            got = got - self._repl[first : first + n].to(got)
            self._diff[first : first + n] = got
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
        """A :class:`Cut`'s copies for ``readers``: ``(x [rows, pos, u, d_model], inv [n])``, reader
        ``i`` reading copy ``inv[i]`` (readers with nothing cut share the stream itself, those with
        everything cut share the replacements' stream); None when nothing is cut here. One reader
        (an int): ``x`` is ``[rows, pos, d_model]`` and ``inv`` None."""
        one = isinstance(readers, int)
        n_in = int(self._n_in[readers if one else readers.start])
        k = self.cut.cut[:n_in, readers]  # [n_in] or [n_in, n]: True = cut
        k = k[:, None] if one else k
        per = k.sum(0)  # [n]: edges cut into each reader
        if not per.any():
            return None
        rows, pos, d = stream.shape[0], stream.shape[1], stream.shape[-1]

        def flat(t: Tensor) -> Tensor:  # [m, rows * pos * d] -> [rows, pos, m, d]
            return t.view(-1, rows, pos, d).permute(1, 2, 0, 3).to(stream.dtype)

        copies, inv = [], torch.empty(k.shape[1], dtype=torch.long)
        for which, value in (
            (per == 0, lambda: stream[:, :, None]),
            (per == n_in, lambda: stream[:, :, None] - flat(self._total[None])),
        ):
            if which.any():
                inv[which] = sum(c.shape[2] for c in copies)
                copies.append(value())
        mixed = ((per > 0) & (per < n_in)).nonzero()[:, 0]
        if len(mixed):
            km = k[:, mixed]
            n_cut = int(km.sum())
            if n_cut <= km.numel() - n_cut:  # sum the cut edges
                corr = _sum_rows(km, self._diff[:n_in])
            else:  # everything minus the kept edges
                corr = self._total[None] - _sum_rows(~km, self._diff[:n_in])
            inv[mixed] = sum(c.shape[2] for c in copies) + torch.arange(len(mixed))
            copies.append(stream[:, :, None] - flat(corr))
        x = torch.cat(copies, 2) if len(copies) > 1 else copies[0]
        return (x[:, :, 0], None) if one else (x, inv)

    def _single(self, readers: slice | int, stream: Tensor) -> Tensor | None:
        """A :class:`Single`'s correction for ``readers`` (None: nothing here)."""
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
        corr = stream.new_zeros(*stream.shape[:2], readers.stop - readers.start, stream.shape[-1])
        idx = hit.nonzero()[:, 0]
        corr[idx, :, slot[idx]] = self.single.delta.to(stream)[idx]
        return corr

    def _split(self, readers: slice | int, stream: Tensor):
        """The readers' own copies of ``stream``: ``(x, inv)`` as :meth:`_cut` gives them (``inv``
        None: one copy per reader), or None to leave the layer as it is."""
        if self.cut is not None:
            return self._cut(readers, stream)
        corr = self._single(readers, stream) if self.single is not None else None
        if corr is None and self.on_grad is None:
            return None
        if isinstance(readers, int):
            x = stream - corr if corr is not None else stream.clone()
        else:
            n = readers.stop - readers.start
            x = stream[:, :, None, :].expand(-1, -1, n, -1)
            x = x - corr if corr is not None else x
        if self.on_grad is not None and x.requires_grad:
            x.register_hook(lambda g, readers=readers: self.on_grad(readers, g))
        return x, None

    # -------------------------------------------------------------------------- hooks

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        an, g = self.an, self.graph
        H, KV = g.n_heads, g.n_kv
        handles = []
        patched = []

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
            got = self._split(g.attn_slice(la), args[0])
            if got is None:
                return None
            x, inv = got
            y = module.forward(x)  # [rows, pos, copies, d_model]: the norm, copy by copy
            if inv is not None:
                y = y[:, :, inv.to(y.device)]  # [rows, pos, H + 2 KV, d_model]
            w = self._weights[la]
            self._stash[(la, "q")] = _project(y[:, :, :H], w["q"], w["bq"])
            self._stash[(la, "k")] = _project(y[:, :, H : H + KV], w["k"], w["bk"])
            self._stash[(la, "v")] = _project(y[:, :, H + KV :], w["v"], w["bv"])
            return None

        def projection(mod, la, kinds):
            own = type(mod).forward

            def forward(x, *a, **k):
                if (la, kinds[0]) not in self._stash:
                    return own(mod, x, *a, **k)
                got = [self._stash.pop((la, kind)) for kind in kinds]
                return got[0] if len(got) == 1 else torch.cat(got, -1)

            mod.forward = forward
            patched.append(mod)

        def o_proj(module, args, out, la):
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
                if an.fused:
                    projection(an.q_proj[la], la, ("q", "k", "v"))
                else:
                    for kind, mod in (
                        ("q", an.q_proj[la]),
                        ("k", an.k_proj[la]),
                        ("v", an.v_proj[la]),
                    ):
                        projection(mod, la, (kind,))
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
            self._stash.clear()
