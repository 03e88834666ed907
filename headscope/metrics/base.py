"""What every head metric shares: the batch context, a few selectors, and the registry.

A metric is one pure function ``(pattern, batch) -> Pooled(total, count)``:

* ``pattern``: post-softmax attention, ``[batch, head, query, key]``: a tensor or any
  :class:`~headscope.metrics.rows.Rows` (per-row statistics from the fused kernel, a block of query
  rows). A block starts at ``batch.q_start`` (the absolute position of its first row); causal
  blocks stop at their last query's key. A metric that reads the pattern only through the
  selectors below (:func:`at_key`, :func:`at_offset`, :func:`key_set_mass`, :func:`row_entropy`)
  runs on every engine and sets ``Metric.fused = True``.
* ``total[b, h]``: the sum of f(A, q) over this sequence's qualifying queries in the block;
  ``count[b]``: how many queries qualified. A score pools over (sequence, query) pairs:
  ``sum(total) / sum(count)`` over all sequences and blocks.

Metrics never write into the pattern. Padding never counts: query rows and key columns at or past
``batch.lengths[b]`` are excluded by the selectors below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.errors import HeadscopeError, did_you_mean
from headscope.metrics.context import PatternBatch
from headscope.metrics.rows import Rows, as_rows


class Pooled(NamedTuple):
    """Per-sequence, per-head sums of f over qualifying queries, and their per-sequence count."""

    total: Float[Tensor, "batch head"]
    count: Float[Tensor, " batch"]

    def score(self) -> Float[Tensor, "batch head"]:
        """Per-sequence scores (NaN where a sequence has no qualifying query)."""
        return self.total / self.count[:, None]


MetricFn = Callable[[Tensor | Rows, PatternBatch], Pooled]


# ----------------------------------------------------------------------------- selectors


def query_positions(pattern: Tensor, batch: PatternBatch) -> Int[Tensor, " query"]:
    """Absolute positions of the pattern's query rows."""
    return torch.arange(batch.q_start, batch.q_start + pattern.shape[-2], device=pattern.device)


def query_range(
    pattern: Tensor, batch: PatternBatch, lo: int | Tensor, hi: int | Tensor
) -> Bool[Tensor, "batch query"]:
    """Rows with ``lo <= q <= hi`` and ``q`` a real token; ``lo``/``hi`` may be per-sequence."""
    q = query_positions(pattern, batch)[None, :]  # [1, query]
    lengths = batch.lengths.to(pattern.device)[:, None]  # [batch, 1]
    lo_t = torch.as_tensor(lo, device=pattern.device).reshape(-1, 1)
    hi_t = torch.as_tensor(hi, device=pattern.device).reshape(-1, 1)
    return (q >= lo_t) & (q <= hi_t) & (q < lengths)  # [batch, query]


def visible_keys(pattern: Tensor, batch: PatternBatch) -> Bool[Tensor, "batch query key"]:
    """Keys a query can see: real keys, for causal models only ``k <= q``, and in a sliding-window
    layer (``batch.reach``) only ``|q - k| <= reach``."""
    k = torch.arange(pattern.shape[-1], device=pattern.device)
    real = k[None, :] < batch.lengths.to(pattern.device)[:, None]  # [batch, key]
    vis = real[:, None, :]  # [batch, 1, key]
    q = query_positions(pattern, batch)
    if batch.causal:
        vis = vis & (k[None, :] <= q[:, None])[None]  # [batch, query, key]
    if batch.reach is not None:
        vis = vis & ((q[:, None] - k[None, :]).abs() <= batch.reach)[None]  # [batch, query, key]
    return vis.expand(pattern.shape[0], pattern.shape[-2], pattern.shape[-1])


def at_offset(
    pattern: Tensor | Rows, batch: PatternBatch, offset: int
) -> Float[Tensor, "batch head query"]:
    """``A[q, q + offset]`` for every row (0 where that key is outside the sequence)."""
    rows = as_rows(pattern)
    return rows.at(query_positions(rows, batch) + offset, batch)  # [batch, head, query]


def at_key(
    pattern: Tensor | Rows, batch: PatternBatch, key: int
) -> Float[Tensor, "batch head query"]:
    """``A[q, key]`` for every row, for one fixed key position (0 if the sequence is shorter)."""
    rows = as_rows(pattern)
    keys = torch.full((rows.shape[-2],), key, dtype=torch.long, device=rows.device)  # [query]
    return rows.at(keys, batch)  # [batch, head, query]


def row_entropy(pattern: Tensor | Rows, batch: PatternBatch) -> Float[Tensor, "batch head query"]:
    """``-sum_k A[q, k] ln A[q, k]`` for every row (0 ln 0 = 0; padding keys never count)."""
    return as_rows(pattern).row_entropy(batch)


def key_set_flags(
    batch: PatternBatch, name: str | None, nk: int, device=None, from_key: int = 1
) -> Bool[Tensor, "batch key"]:
    """Real keys at ``k >= from_key`` in the flag set ``name`` (a PatternBatch field; None =
    all)."""
    k = torch.arange(nk, device=device)
    # [batch, key]
    keys = (k[None, :] < batch.lengths.to(device)[:, None]) & (k[None, :] >= from_key)
    if name is not None:
        flags = getattr(batch, name)
        if flags is None:
            raise HeadscopeError(f"This metric needs key flags '{name}' in its PatternBatch.")
        keys = keys & flags.to(device)[:, :nk]
    return keys


def key_set_mass(pattern: Tensor | Rows, batch: PatternBatch, name: str) -> Pooled:
    """Attention mass on the keys flagged in ``batch.<name>`` at ``k >= 1`` that the query can see.

    Qualifying queries are real queries that can see at least one such key. Position 0 is never
    counted, so sink attention is not counted twice (GPT-2's BOS is also its EOS).
    """
    rows = as_rows(pattern)
    nq, nk = rows.shape[-2], rows.shape[-1]
    keys = key_set_flags(batch, name, nk, rows.device)  # [batch, key]
    mass = rows.mass(batch, name, keys)  # [batch, head, query]
    k = torch.arange(nk, device=rows.device)
    q = query_positions(rows, batch)  # [query]
    if batch.causal:
        first = torch.where(keys, k[None, :], nk).amin(-1)  # [batch]: first flagged key, or nk
        sees = q[None, :] >= first[:, None]  # [batch, query]
    else:
        sees = keys.any(-1, keepdim=True).expand(-1, nq)  # [batch, query]
    qualifies = sees & query_range(rows, batch, 0, batch.lengths - 1)  # [batch, query]
    return pool(mass, qualifies)


def pool(values: Float[Tensor, "batch head query"], mask: Bool[Tensor, "batch query"]) -> Pooled:
    """Sum ``values`` over the rows in ``mask`` (float64 sums: long contexts add many terms)."""
    m = mask.to(values.dtype)[:, None, :]  # [batch, 1, query]
    total = (values * m).sum(-1, dtype=torch.float64)  # [batch, head]
    return Pooled(total, mask.sum(-1).to(torch.float64))


def uniform_pattern(pattern_shape: tuple[int, ...], batch: PatternBatch, device=None) -> Tensor:
    """A head that spreads attention evenly over the keys it can see: ``[batch, 1, query, key]``.

    Any metric applied to it gives that metric's chance value.
    """
    b, _, nq, nk = pattern_shape
    probe = torch.empty(b, 1, nq, nk, device=device)
    vis = visible_keys(probe, batch).to(torch.float32)  # [batch, query, key]
    return (vis / vis.sum(-1, keepdim=True).clamp(min=1))[:, None]


# ------------------------------------------------------------------------------ registry


@dataclass(frozen=True)
class Metric:
    """A head behaviour: its pure function plus what the report needs to describe it."""

    name: str
    probe: str  # "text" or "repeat"
    fn: MetricFn
    definition: str  # one line: which queries count and what f is
    label: str  # given to a head whose score passes the threshold
    threshold: float
    below: bool = False  # True: label heads scoring at or below the threshold (entropy)
    nan_reason: str | None = None  # why the metric is NaN on some models
    fused: bool = False  # fn reads the pattern only through the selectors: it accepts HeadStats too
    #: Scanned when no metrics are named. Long-context metrics are not: they need long inputs.
    default: bool = True
    #: The chance value's function, where a uniform head is not what ``fn`` can read (an arg-max
    #: over equal weights): ``fn`` of a head choosing uniformly at random. None: ``fn`` itself.
    chance_fn: MetricFn | None = None
    #: What the engine must compute per row besides entries, masses and entropy ("band", "argmax").
    needs: tuple[str, ...] = ()
    unit: str = ""

    @classmethod
    def of(cls, name: str, fn: MetricFn, **implementation) -> Metric:
        """A built-in metric: what it means comes from :mod:`headscope.catalog` (one place), how
        it is computed from ``fn`` and ``implementation`` (``fused``, ``chance_fn``, ``needs``)."""
        from headscope.catalog import PATTERN

        info = PATTERN[name]
        return cls(
            name=info.name,
            probe=info.probe,
            fn=fn,
            definition=info.definition,
            label=info.label,
            threshold=info.threshold,
            below=info.below,
            nan_reason=info.nan_reason,
            default=info.default,
            unit=info.unit,
            **implementation,
        )

    def __call__(self, pattern: Tensor | Rows, batch: PatternBatch) -> Pooled:
        return self.fn(pattern, batch)

    def passes(self, score: float, threshold: float | None = None) -> bool:
        t = self.threshold if threshold is None else threshold
        if score != score:  # NaN
            return False
        return score <= t if self.below else score >= t


REGISTRY: dict[str, Metric] = {}
PROBES = ("text", "repeat", "needle")  # the probes a metric can read


def default_metrics() -> list[Metric]:
    """The metrics a scan runs when none are named (registry order)."""
    return [m for m in REGISTRY.values() if m.default]


def register(metric: Metric) -> Metric:
    """Add a metric; a second metric of the same name is refused."""
    if metric.name in REGISTRY:
        raise ValueError(f"A metric named '{metric.name}' is already registered.")
    if metric.probe not in PROBES:
        raise ValueError(
            f"Metric '{metric.name}': probe must be one of {', '.join(PROBES)}, not "
            f"{metric.probe!r}."
        )
    REGISTRY[metric.name] = metric
    return metric


def get_metric(name: str) -> Metric:
    """The registered metric called ``name``; an unknown name gets a did-you-mean."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise HeadscopeError(
            f"Unknown metric '{name}'.{did_you_mean(name, REGISTRY)} Known: {', '.join(REGISTRY)}."
        ) from None
