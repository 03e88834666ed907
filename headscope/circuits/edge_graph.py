"""The edge graph of a pre-norm decoder: who writes into the residual stream, who reads it, which
writer feeds which reader (docs/discover.md), and the modules of the model each node lives in.

Writers (what a component adds to the residual stream), in order, index ``w``:

* ``embed`` (``w = 0``): block 0's input, the token (and any position) embedding as the model
  scales it;
* ``L{l}H{h}``: head ``h``'s output ``z_h W_O[h]`` (its slice of the output projection, bias not
  included: a constant of every run). Where the model normalises the attention output before the
  residual add (Gemma 2 and 3), the norm's scale is the one of that forward: ``z_h W_O[h]`` times
  the norm's gain over the RMS of the layer's whole attention output, so the heads' writes add up
  to what the layer adds in that forward, exactly;
* ``MLP{l}``: the MLP's output as it joins the stream (after any norm on it).

Readers (each with its own copy of the residual stream, before the norm in front of it), index
``r``, per layer: ``L{l}H{h}.q`` for each query head, ``L{l}KV{g}.k`` and ``L{l}KV{g}.v`` for each
key-value head, ``MLP{l}.in``; then ``logits`` (the final norm's input).

An edge ``w -> r`` exists when ``w`` is written before ``r`` reads: a head of layer ``l`` reads
the embedding and every head and MLP of layers ``< l``; an MLP also reads its own layer's heads;
``logits`` reads every writer. Positions are pooled: an edge is the writer feeding the reader at
every position (each position's writer into the same position's reader; attention moves
information between positions inside a head, not along an edge).

Keys and values are read per key-value head by default (``kv_mode="group"``): with grouped-query
attention a key or value vector is computed once per KV head and read by every query head of its
group, so an edge into ``L{l}KV{g}.k`` is an edge of the computation the model runs, and cutting
it is an intervention on the model. ``kv_mode="head"`` asks path patching's finer, counterfactual
question: ``L{l}H{h}.k`` is the key query head ``h`` alone reads (the edge forward gives each query
head its own copy of its KV head's projection). For multi-head models the two coincide.

The writers before a reader are a prefix of the writer order, so the edges are the cells of a
``[writer, reader]`` matrix below a staircase (:attr:`EdgeGraph.valid`), and a circuit is a
boolean matrix inside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from jaxtyping import Bool
from torch import Tensor

from headscope.errors import HeadscopeError

#: the families whose blocks the edge forward knows (a pre-norm block: ``x + attn(norm(x))`` then
#: ``x + mlp(norm(x))``, with the norms and projections named as transformers names them)
FAMILIES = (
    "gpt2",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo",
)


#: how keys and values are read: once per KV head (the model's computation) or per query head
KV_MODES = ("group", "head")


@dataclass(frozen=True)
class EdgeGraph:
    """The writers, readers and edges of a model with ``n_layers`` layers of ``n_heads`` query
    heads; ``n_kv`` key and value readers per layer: the model's KV heads (``kv_mode="group"``),
    or one per query head (``"head"``: ``L{l}H{h}.k`` is the key head ``h`` reads, ``group``
    query heads sharing each of the model's KV heads)."""

    n_layers: int
    n_heads: int
    n_kv: int
    kv_mode: str = "group"
    group: int = 1

    @property
    def n_writers(self) -> int:
        return 1 + self.n_layers * (self.n_heads + 1)

    @property
    def attn_readers(self) -> int:
        """Readers of one layer's attention: a query per head, a key and a value per KV head."""
        return self.n_heads + 2 * self.n_kv

    @property
    def n_readers(self) -> int:
        return self.n_layers * (self.attn_readers + 1) + 1

    # ---------------------------------------------------------------------- indices

    def head_writer(self, layer: int, head: int) -> int:
        return 1 + layer * (self.n_heads + 1) + head

    def mlp_writer(self, layer: int) -> int:
        return 1 + layer * (self.n_heads + 1) + self.n_heads

    def attn_reader(self, layer: int, slot: int) -> int:
        """Reader ``slot`` of layer ``layer``'s attention: ``0..H-1`` queries, then ``H..H+KV-1``
        keys, then values."""
        return layer * (self.attn_readers + 1) + slot

    def mlp_reader(self, layer: int) -> int:
        return layer * (self.attn_readers + 1) + self.attn_readers

    @property
    def logits_reader(self) -> int:
        return self.n_readers - 1

    def attn_slice(self, layer: int) -> slice:
        """The readers of layer ``layer``'s attention, as a slice of the reader axis."""
        start = self.attn_reader(layer, 0)
        return slice(start, start + self.attn_readers)

    def writers_before_attn(self, layer: int) -> int:
        """How many writers layer ``layer``'s attention reads (a prefix of the writer order)."""
        return 1 + layer * (self.n_heads + 1)

    def writers_before_mlp(self, layer: int) -> int:
        return self.writers_before_attn(layer) + self.n_heads

    def writers_before(self) -> Tensor:
        """``[reader]``: how many writers each reader reads (int64)."""
        out = torch.empty(self.n_readers, dtype=torch.long)
        for la in range(self.n_layers):
            out[self.attn_slice(la)] = self.writers_before_attn(la)
            out[self.mlp_reader(la)] = self.writers_before_mlp(la)
        out[self.logits_reader] = self.n_writers
        return out

    @property
    def valid(self) -> Bool[Tensor, "writer reader"]:
        """Which (writer, reader) cells are edges."""
        return torch.arange(self.n_writers)[:, None] < self.writers_before()[None, :]

    @property
    def n_edges(self) -> int:
        return int(self.writers_before().sum())

    def edges(self) -> tuple[Tensor, Tensor]:
        """Every edge as ``(writer [edge], reader [edge])``, reader by reader."""
        r, w = self.valid.T.nonzero(as_tuple=True)
        return w, r

    # ---------------------------------------------------------------------- names

    def writer_name(self, w: int) -> str:
        if w == 0:
            return "embed"
        la, h = divmod(w - 1, self.n_heads + 1)
        return f"MLP{la}" if h == self.n_heads else f"L{la}H{h}"

    def reader_name(self, r: int) -> str:
        if r == self.logits_reader:
            return "logits"
        la, slot = divmod(r, self.attn_readers + 1)
        if slot == self.attn_readers:
            return f"MLP{la}.in"
        if slot < self.n_heads:
            return f"L{la}H{slot}.q"
        g = slot - self.n_heads
        kind = "k" if g < self.n_kv else "v"
        return f"L{la}{'H' if self.kv_mode == 'head' else 'KV'}{g % self.n_kv}.{kind}"

    def writer_layer(self, w: int) -> int:
        """The layer a writer belongs to (-1 for the embedding)."""
        return -1 if w == 0 else (w - 1) // (self.n_heads + 1)

    def reader_layer(self, r: int) -> int:
        """The layer a reader belongs to (``n_layers`` for the logits)."""
        return self.n_layers if r == self.logits_reader else r // (self.attn_readers + 1)

    def writer_index(self, name: str) -> int:
        """The writer called ``name`` (``embed``, ``L3H1``, ``MLP3``); one line if there is none."""
        m = re.fullmatch(r"L(\d+)H(\d+)|MLP(\d+)|embed", name.strip())
        w = None
        if m and m[0] == "embed":
            w = 0
        elif m and m[1] is not None and int(m[1]) < self.n_layers and int(m[2]) < self.n_heads:
            w = self.head_writer(int(m[1]), int(m[2]))
        elif m and m[3] is not None and int(m[3]) < self.n_layers:
            w = self.mlp_writer(int(m[3]))
        if w is None:
            raise HeadscopeError(
                f"No writer '{name}'; writers are embed, L0H0..L{self.n_layers - 1}H"
                f"{self.n_heads - 1} and MLP0..MLP{self.n_layers - 1}."
            )
        return w

    def reader_index(self, name: str) -> int:
        """The reader called ``name`` (``L3H1.q``, ``L3KV0.k``, ``MLP3.in``, ``logits``)."""
        name = name.strip()
        L, H, KV = self.n_layers, self.n_heads, self.n_kv
        kv = "H" if self.kv_mode == "head" else "KV"
        r = None
        if name == "logits":
            r = self.logits_reader
        elif m := re.fullmatch(r"L(\d+)H(\d+)\.q", name):
            if int(m[1]) < L and int(m[2]) < H:
                r = self.attn_reader(int(m[1]), int(m[2]))
        elif m := re.fullmatch(rf"L(\d+){kv}(\d+)\.([kv])", name):
            if int(m[1]) < L and int(m[2]) < KV:
                r = self.attn_reader(int(m[1]), H + int(m[2]) + (KV if m[3] == "v" else 0))
        elif m := re.fullmatch(r"MLP(\d+)\.in", name):
            if int(m[1]) < L:
                r = self.mlp_reader(int(m[1]))
        if r is None:
            raise HeadscopeError(
                f"No reader '{name}'; readers are L<l>H<h>.q (h < {H}), L<l>{kv}<g>.k and .v "
                f"(g < {KV}, kv_mode {self.kv_mode}), MLP<l>.in (l < {L}) and logits."
            )
        return r

    def edge_index(self, name: str) -> tuple[int, int]:
        """``(writer, reader)`` of an edge named ``writer->reader`` (``L0H1->L2H3.q``); one line
        when it is malformed or the reader is not after the writer."""
        parts = name.split("->")
        if len(parts) != 2:
            raise HeadscopeError(
                f"An edge is named writer->reader (e.g. embed->L0H1.q, L0H1->MLP1.in); got "
                f"'{name}'."
            )
        w, r = self.writer_index(parts[0]), self.reader_index(parts[1])
        if w >= int(self.writers_before()[r]):
            raise HeadscopeError(
                f"{parts[1].strip()} does not read {parts[0].strip()}: a reader reads only what "
                "is written before it (a head, the layers below its own; an MLP, its own layer's "
                "heads too)."
            )
        return w, r

    def edge_name(self, w: int, r: int) -> str:
        return f"{self.writer_name(w)}->{self.reader_name(r)}"


@dataclass
class Anatomy:
    """The modules of each block that the edge forward hooks (found by :func:`anatomy`)."""

    ln1: list  # the norm in front of the attention
    ln2: list  # the norm in front of the MLP
    q_proj: list  # per layer: the query projection (or the fused q/k/v projection)
    k_proj: list
    v_proj: list
    fused: bool  # GPT-2's c_attn: one Conv1D making q, k and v
    o_proj: list
    post_attn: list | None  # Gemma 2/3: the norm on the attention output before the residual add
    mlp_out: list  # the module whose output joins the stream (the MLP, or the norm after it)
    final_norm: object
    gain_offset: float  # 1.0 where the RMS norms multiply by 1 + w (Gemma)
    extra: dict = field(default_factory=dict)
    attn: list = field(default_factory=list)  # per layer: the attention module


def _first(module, names: tuple[str, ...]):
    for n in names:
        m = getattr(module, n, None)
        if isinstance(m, torch.nn.Module):
            return m
    return None


def anatomy(model) -> Anatomy:
    """The hooked modules of ``model``; one line when its family is not one the edge forward knows
    (an encoder, parallel attention and MLP, a norm after the residual add)."""
    mt = getattr(model.hf.config, "model_type", "?")
    if not model.causal or mt not in FAMILIES:
        raise HeadscopeError(
            f"{model.name} ({mt}) is not a family the edge graph knows: it needs a pre-norm "
            f"decoder whose attention and MLP run one after the other ({', '.join(FAMILIES)}); "
            "e.g. smollm2-135m, gemma3-270m or gpt2-small."
        )
    blocks = model.blocks()
    sandwich = all(hasattr(b, "pre_feedforward_layernorm") for b in blocks)
    ln1, ln2, q, k, v, o, post, mlp_out, attns = [], [], [], [], [], [], [], [], []
    fused = mt == "gpt2"
    for la, blk in enumerate(blocks):
        attn = _first(blk, ("self_attn", "attn", "attention"))
        attns.append(attn)
        ln1.append(_first(blk, ("input_layernorm", "ln_1")))
        if sandwich:
            ln2.append(blk.pre_feedforward_layernorm)
            post.append(blk.post_attention_layernorm)
            mlp_out.append(blk.post_feedforward_layernorm)
        else:
            ln2.append(_first(blk, ("post_attention_layernorm", "ln_2")))
            mlp_out.append(model.mlp(la))
        if fused:
            q.append(attn.c_attn)
            k.append(attn.c_attn)
            v.append(attn.c_attn)
            o.append(attn.c_proj)
        else:
            q.append(attn.q_proj)
            k.append(attn.k_proj)
            v.append(attn.v_proj)
            o.append(attn.o_proj)
    final = model._final_norm()
    if any(m is None for m in (*ln1, *ln2, final)):
        raise HeadscopeError(f"{model.name}: cannot find the norms in front of each block's parts.")
    return Anatomy(
        ln1=ln1,
        ln2=ln2,
        q_proj=q,
        k_proj=k,
        v_proj=v,
        fused=fused,
        o_proj=o,
        post_attn=post if sandwich else None,
        mlp_out=mlp_out,
        final_norm=final,
        gain_offset=model._gain_offset(),
        attn=attns,
    )


def graph_of(model, kv_mode: str = "group") -> EdgeGraph:
    """``model``'s edge graph, its keys and values read per KV head (``group``) or per query head
    (``head``)."""
    if kv_mode not in KV_MODES:
        raise HeadscopeError(f"Unknown kv_mode '{kv_mode}'; use {' or '.join(KV_MODES)}.")
    group = model.n_heads // model.n_kv_heads
    if kv_mode == "head":
        return EdgeGraph(model.n_layers, model.n_heads, model.n_heads, "head", group)
    return EdgeGraph(model.n_layers, model.n_heads, model.n_kv_heads, "group", group)
