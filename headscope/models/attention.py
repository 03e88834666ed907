"""The attention seam: every attention call of a forward pass, as one plain object.

transformers runs each layer's attention through a function with a fixed signature (its
"attention interface"). :mod:`headscope.models.model` registers one such function; while a handler
is active it packs the call into an :class:`AttentionCall` and hands it over. Everything headscope
does inside a forward pass goes through here:

* an **engine** (:mod:`headscope.engines.registry`) reads the call's queries and keys, hands per-row
  statistics to the metrics, and returns the layer's output (``call.output()``, or its own);
* an **intervention** changes the call before the handler sees it (:meth:`Intervention.before`)
  or changes the per-head output after (:meth:`Intervention.after`). The vocabulary is two classes,
  each acting on chosen heads per row of the batch: :class:`SetHeads` sets their output to a value
  or part of the way there (mean, zero or resample ablation, patching a head's output, keeping only
  a circuit), :class:`RestrictKeys` lets them see only some keys (the no-op test, a sink + window KV
  cache). ``ReplaceHeadOutput`` and ``Interpolate`` are :class:`SetHeads` spelled for one head.

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
from jaxtyping import Bool, Float
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
        """The call's mask as booleans (True = may attend), broadcastable to ``[batch, head,
        query, key]``: ``[1, 1, query, key]`` built from ``causal`` when there is no mask, else
        the mask's own shape. Keys before the first query (a KV cache) are visible to every query
        (bottom-right alignment)."""
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


def head_rows(
    heads: Sequence[int] | Tensor, rows: int, n_heads: int, device
) -> Bool[Tensor, "row head"]:
    """Which heads an intervention touches in each row of a batch, as booleans ``[row, head]``.

    ``heads`` is a sequence of head indices (the same heads in every row), a long tensor ``[row]``
    (one head per row, -1 for none: several heads of one layer in one forward, the batch repeated
    once per head) or booleans ``[row, head]`` (any heads per row).

    >>> head_rows([1], 2, 3, "cpu").tolist()
    [[False, True, False], [False, True, False]]
    >>> head_rows(torch.tensor([2, -1]), 2, 3, "cpu").tolist()
    [[False, False, True], [False, False, False]]
    """
    if isinstance(heads, Tensor) and heads.dtype == torch.bool:
        return heads.to(device).expand(rows, n_heads)
    if isinstance(heads, Tensor):  # one head per row, -1: none
        heads = heads.to(device)
        return torch.arange(n_heads, device=device)[None, :] == heads[:, None]
    which = torch.zeros(n_heads, dtype=torch.bool, device=device)
    which[list(heads)] = True
    return which.expand(rows, n_heads)


@dataclass(frozen=True)
class SetHeads:
    """Set some heads' output ``A v`` (before the output projection) in layer ``layer``, per row.

    ``heads``: which heads, as :func:`head_rows` reads it (the same heads in every row, one head
    per row, or booleans ``[row, head]``). ``value``: what their output becomes, broadcast to
    ``[batch, query, head, dim_v]``: ``0.0`` (zero ablation), a ``[head, dim_v]`` table of means
    (mean ablation: each head its own), a ``[dim_v]`` vector, or a ``[batch, query, head,
    dim_v]`` tensor (resample ablation: another sequence's output). ``t``: move a fraction ``t``
    of the way there, ``out_h <- out_h + t (value - out_h)`` (``t = 1``, the default, writes
    ``value`` exactly; small ``t`` traces the dose-response curve whose slope at 0 attribution
    patching estimates). Other heads, and every head's KV head, are untouched.
    """

    layer: int
    heads: Sequence[int] | Tensor
    value: Tensor | float = 0.0
    t: float = 1.0

    def before(self, call: AttentionCall) -> AttentionCall:
        return call

    def after(self, call: AttentionCall, out: Tensor) -> Tensor:
        if call.layer != self.layer:
            return out
        b, _, h, _ = out.shape  # [batch, query, head, dim_v]
        which = head_rows(self.heads, b, h, out.device)[:, None, :, None]  # [batch, 1, head, 1]
        value = torch.as_tensor(self.value, dtype=out.dtype, device=out.device)
        return torch.where(which, value if self.t == 1.0 else out + self.t * (value - out), out)


def _one_head(value: Tensor | float) -> Tensor | float:
    """One head's value (``[dim_v]``, ``[batch, query, dim_v]`` or a float) as :class:`SetHeads`
    broadcasts it over heads; a ``[batch, query, 1, dim_v]`` value (the ``value`` of one
    :func:`ReplaceHeadOutput`) is already that."""
    if isinstance(value, Tensor) and 2 <= value.dim() <= 3:
        return value.unsqueeze(-2)  # [batch, query, 1, dim_v]
    return value


def ReplaceHeadOutput(layer: int, head: int, value: Tensor | float = 0.0) -> SetHeads:
    """Head ``head`` of layer ``layer`` gets ``value`` (``[dim_v]``, ``[batch, query, dim_v]``
    or a float) at every position: :class:`SetHeads` for one head."""
    return SetHeads(layer, (head,), _one_head(value))


def Interpolate(layer: int, head: int, value: Tensor | float, t: float) -> SetHeads:
    """Head ``head`` of layer ``layer`` moved a fraction ``t`` of the way to ``value``:
    :class:`SetHeads` for one head, with ``t``."""
    return SetHeads(layer, (head,), _one_head(value), t)


@dataclass(frozen=True)
class RestrictKeys:
    """Let some heads of layer ``layer`` see only the keys ``keep`` allows (and the mask did).

    ``heads``: which heads, per row, as :func:`head_rows` reads it. ``keep``: booleans (True = may
    attend) broadcastable to ``[batch, query, key]`` (``[batch, 1, key]``: the same keys for every
    query), or a function of the call returning them (a sink + window band: :func:`band`). The
    other heads keep their mask; the softmax of a restricted head renormalises over what is left.
    A query row of a restricted head left with no key at all (its softmax would be NaN) is refused
    with one line (``empty="raise"``), or keeps the mask it had (``empty="keep"``: a decoder's
    query 0 whose only key, BOS, is removed).
    """

    layer: int
    heads: Sequence[int] | Tensor
    keep: Tensor | Callable[[AttentionCall], Tensor]
    empty: str = "raise"

    def before(self, call: AttentionCall) -> AttentionCall:
        if call.layer != self.layer:
            return call
        b, h, n_q, n_k = call.shape
        base = call.full_mask().expand(b, h, n_q, n_k)  # [batch, head, query, key]
        keep = self.keep(call) if callable(self.keep) else self.keep
        keep = keep.to(device=base.device, dtype=torch.bool)[..., :n_k].expand(b, n_q, n_k)
        which = head_rows(self.heads, b, h, base.device)[:, :, None, None]  # [batch, head, 1, 1]
        mask = base & (keep[:, None] | ~which)  # [batch, head, query, key]
        lost = base.any(-1) & ~mask.any(-1)  # [batch, head, query]: rows left with no key
        if bool(lost.any()):
            if self.empty != "keep":
                raise HeadscopeError(
                    f"RestrictKeys on layer {self.layer} leaves a query with no key to attend "
                    "to; keep at least each query's own position."
                )
            mask = torch.where(lost[..., None], base, mask)
        return call.with_mask(mask)

    def after(self, call: AttentionCall, out: Tensor) -> Tensor:
        return out


def band(sinks: int, window: int) -> Callable[[AttentionCall], Bool[Tensor, "1 query key"]]:
    """The keys a sink + window KV cache keeps, as a ``keep`` for :class:`RestrictKeys`: ``k <
    sinks`` and ``q - window < k <= q`` (keys before the first query, a KV cache, count as earlier
    positions).

    >>> call = AttentionCall(0, torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2),
    ...                      torch.zeros(1, 1, 5, 2), None, 1.0, True)
    >>> band(1, 2)(call)[0].int().tolist()[4]
    [1, 0, 0, 1, 1]
    """

    def keep(call: AttentionCall) -> Tensor:
        _, _, n_q, n_k = call.shape
        pos = torch.arange(n_q, device=call.query.device) + (n_k - n_q)  # [query]
        k = torch.arange(n_k, device=call.query.device)  # [key]
        return ((k[None, :] < sinks) | (pos[:, None] - k[None, :] < window))[None]

    return keep


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
