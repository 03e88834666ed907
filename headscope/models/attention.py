"""The attention seam: every attention call of a forward pass, as one plain object.

transformers runs each layer's attention through a function with a fixed signature (its
"attention interface"). :mod:`headscope.models.model` registers one such function; while a handler
is active it packs the call into an :class:`AttentionCall` and hands it over. Everything headscope
does inside a forward pass goes through here:

* an **engine** (:mod:`headscope.engines.registry`) reads the call's queries and keys, hands per-row
  statistics to the metrics, and returns the layer's output (``call.output()``, or its own);
* an **intervention** changes the call before the handler sees it (:meth:`Intervention.before`,
  e.g. mask some keys of some heads) or changes the per-head output after
  (:meth:`Intervention.after`, e.g. replace a head's output: mean- or zero-ablation).

Output layout: ``[batch, query, head, dim]``, the per-head results ``A v`` that the output
projection (``o_proj`` / ``c_proj`` / ``dense``) reads after flattening the last two axes, so head
``h``'s output is ``out[:, :, h]`` and an ablation never touches another head.

Grouped-query attention: ``key``/``value`` have ``kv_head`` heads and query head ``h`` reads KV
head ``h // (heads / kv_heads)`` (the ``repeat_kv`` layout); interventions act on query heads.

A handler is active only inside :func:`intercept` (a context manager, like transformer-lens'
``run_with_hooks``): nothing stays installed after the forward returns or raises.

>>> call = AttentionCall(layer=0, query=torch.zeros(1, 2, 3, 4), key=torch.zeros(1, 1, 3, 4),
...                      value=torch.ones(1, 1, 3, 4), mask=None, scale=0.5, causal=True)
>>> call.shape, call.group
((1, 2, 3, 3), 2)
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.errors import HeadscopeError


class StopForward(Exception):
    """Raised inside a forward pass once nothing after it is needed (the one way to stop one)."""


@dataclass
class AttentionCall:
    """One layer's attention call, with everything needed to compute or replace it."""

    layer: int
    query: Float[Tensor, "batch head query dim"]  # after any rotary embedding
    key: Float[Tensor, "batch kv_head key dim"]
    value: Float[Tensor, "batch kv_head key dim_v"]
    #: None (plain causal or full), boolean ``[batch or 1, 1 or head, query, key]`` (True = may
    #: attend; a sliding window is already in it) or an additive float mask of that shape.
    mask: Tensor | None
    scale: float  # the softmax scale (1/sqrt(dim) unless the model says otherwise)
    causal: bool
    #: Softmax changes the engines do not model (soft-capping, learned sinks, position biases):
    #: name -> value, as the model passed them.
    extras: dict = field(default_factory=dict)
    #: The model's own attention for this call: ``(call) -> [batch, query, head, dim_v]``.
    compute: Callable[[AttentionCall], Tensor] | None = field(default=None, repr=False)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(batch, head, query, key)``: the shape of this call's attention pattern."""
        b, h, n_q, _ = self.query.shape
        return b, h, n_q, self.key.shape[2]

    @property
    def group(self) -> int:
        """Query heads per KV head (1 without grouped-query attention)."""
        return self.query.shape[1] // self.key.shape[1]

    def output(self) -> Float[Tensor, "batch query head dim_v"]:
        """The model's own attention output for this call (its sdpa), before the output
        projection."""
        if self.compute is None:
            raise RuntimeError(
                "This AttentionCall was built without the model's attention function."
            )
        return self.compute(self)

    def with_mask(self, mask: Tensor | None) -> AttentionCall:
        """The same call with another mask (boolean, broadcastable to ``[batch, head, query,
        key]``)."""
        return replace(self, mask=mask)

    def full_mask(self) -> torch.Tensor:
        """The call's mask as booleans (True = may attend), broadcastable to ``[batch, head, query,
        key]``: ``[1, 1, query, key]`` built from ``causal`` when there is no mask, else the mask's
        own shape.
        Keys before the first query (a KV cache) are visible to every query (bottom-right
        alignment)."""
        b, _, n_q, n_k = self.shape
        if self.mask is None:
            if not self.causal:
                return torch.ones(1, 1, n_q, n_k, dtype=torch.bool, device=self.query.device)
            # keys before the first query (a KV cache) are visible to every row: bottom-right
            # alignment
            return torch.ones(n_q, n_k, dtype=torch.bool, device=self.query.device).tril(n_k - n_q)[
                None, None
            ]
        if self.mask.dtype == torch.bool:
            return self.mask
        return self.mask > torch.finfo(self.mask.dtype).min / 2  # additive: a masked key is ~-inf


Handler = Callable[[AttentionCall], Tensor]


class Intervention(Protocol):
    """A change to some attention calls: ``before`` edits the call, ``after`` edits its output."""

    def before(self, call: AttentionCall) -> AttentionCall: ...

    def after(
        self, call: AttentionCall, out: Float[Tensor, "batch query head dim_v"]
    ) -> Tensor: ...


@dataclass(frozen=True)
class ReplaceHeadOutput:
    """Replace head ``head`` of layer ``layer``'s output ``A v`` (before the output projection).

    ``value`` is broadcast to ``[batch, query, dim_v]``: a ``[dim_v]`` vector for mean-ablation,
    ``0.0`` for zero-ablation. Other heads, and the head's KV head, are untouched.
    """

    layer: int
    head: int
    value: Tensor | float = 0.0

    def before(self, call: AttentionCall) -> AttentionCall:
        return call

    def after(self, call: AttentionCall, out: Tensor) -> Tensor:
        if call.layer != self.layer:
            return out
        out = out.clone()  # [batch, query, head, dim_v]
        out[:, :, self.head] = torch.as_tensor(self.value, dtype=out.dtype, device=out.device)
        return out


@dataclass(frozen=True)
class Interpolate:
    """Move head ``head`` of layer ``layer`` a fraction ``t`` of the way to ``value``:
    ``out_h <- out_h + t (value - out_h)``. ``t = 1`` is :class:`ReplaceHeadOutput`; small ``t``
    traces the dose-response curve whose slope at 0 attribution patching estimates."""

    layer: int
    head: int
    value: Tensor | float
    t: float

    def before(self, call: AttentionCall) -> AttentionCall:
        return call

    def after(self, call: AttentionCall, out: Tensor) -> Tensor:
        if call.layer != self.layer:
            return out
        out = out.clone()  # [batch, query, head, dim_v]
        target = torch.as_tensor(self.value, dtype=out.dtype, device=out.device)
        out[:, :, self.head] += self.t * (target - out[:, :, self.head])
        return out


@dataclass(frozen=True)
class AblateHeads:
    """Replace one head per sequence of a batch: row ``b``'s head ``heads[b]`` of layer ``layer``
    (-1: none) gets ``values[heads[b]]`` at every position. Several heads of one layer are ablated
    in one forward by repeating the batch, one copy per head.

    ``values``: ``[head, dim_v]`` (mean-ablation) or a float (zero-ablation).
    """

    layer: int
    heads: Tensor  # [batch] long
    values: Tensor | float = 0.0

    def before(self, call: AttentionCall) -> AttentionCall:
        return call

    def after(self, call: AttentionCall, out: Tensor) -> Tensor:
        if call.layer != self.layer:
            return out
        heads = self.heads.to(out.device)
        rows = torch.nonzero(heads >= 0).squeeze(-1)  # [m]
        out = out.clone()  # [batch, query, head, dim_v]
        h = heads[rows]  # [m]
        if isinstance(self.values, Tensor):
            # [m, 1, dim_v]
            value = self.values.to(device=out.device, dtype=out.dtype)[h][:, None, :]
        else:
            value = torch.full(
                (len(rows), 1, out.shape[-1]),
                float(self.values),
                dtype=out.dtype,
                device=out.device,
            )
        out[rows, :, h] = value.expand(-1, out.shape[1], -1)  # [m, query, dim_v]
        return out


@dataclass(frozen=True)
class RestrictKeys:
    """Let heads ``heads`` of layer ``layer`` see only the keys ``keep`` allows (and the mask did).

    ``keep(call)`` returns booleans broadcastable to ``[batch, query, key]`` (True = may attend),
    e.g. a sink + window band. The other heads of the layer keep their mask. A query row of a
    restricted head left with no key at all is refused (its softmax would be NaN); keep at least
    the query's own position.
    """

    layer: int
    heads: Sequence[int]
    keep: Callable[[AttentionCall], Tensor]

    def before(self, call: AttentionCall) -> AttentionCall:
        if call.layer != self.layer:
            return call
        b, h, n_q, n_k = call.shape
        base = call.full_mask().expand(b, h, n_q, n_k)  # [batch, head, query, key]
        mask = base.clone()
        # [batch, query, key]
        keep = self.keep(call).to(device=mask.device, dtype=torch.bool).expand(b, n_q, n_k)
        mask[:, list(self.heads)] &= keep[:, None]  # [batch, 1, query, key] onto the chosen heads
        had = base[:, list(self.heads)].any(-1)  # [batch, heads, query]: rows that saw a key before
        if bool((had & ~mask[:, list(self.heads)].any(-1)).any()):
            raise HeadscopeError(
                f"RestrictKeys on layer {self.layer} leaves a query with no key "
                "to attend to; "
                "keep at least each query's own position."
            )
        return call.with_mask(mask)

    def after(self, call: AttentionCall, out: Tensor) -> Tensor:
        return out


# ------------------------------------------------------------------------------ activation

#: The handler of the forward pass in progress (None outside :func:`intercept`).
_ACTIVE: contextvars.ContextVar[Handler | None] = contextvars.ContextVar(
    "headscope_attention", default=None
)


def _default(call: AttentionCall) -> Tensor:
    return call.output()


@contextlib.contextmanager
def intercept(
    handler: Handler | None = None, interventions: Sequence[Intervention] = ()
) -> Iterator[None]:
    """Route the attention calls of forward passes run inside the ``with`` block through ``handler``
    (default: the model's own attention), with ``interventions`` applied around it.

    Every ``before`` runs in the order given, then the handler, then every ``after`` in the same
    order, each ``after`` seeing the call as all the ``before``s left it."""
    inner = handler or _default
    if interventions:

        def run(call: AttentionCall) -> Tensor:
            for iv in interventions:
                call = iv.before(call)
            out = inner(call)
            for iv in interventions:
                out = iv.after(call, out)
            return out
    else:
        run = inner
    token = _ACTIVE.set(run)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> Handler | None:
    """The handler of the forward pass in progress, or None (then attention is the model's own)."""
    return _ACTIVE.get()
