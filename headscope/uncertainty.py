"""How sure is a score? A seeded bootstrap over sequences: intervals, and how stable each label is;
and the other intervals headscope reports (:func:`wilson` for a share, :func:`paired_loss_ci` for
a paired difference), all of them here.

A score pools every (sequence, qualifying query) pair of a probe: ``sum(total_s) / sum(count_s)``
over sequences ``s``. Sequences are the unit that was sampled (a different seed, another corpus
draw), so the bootstrap resamples *sequences* with replacement, ``resamples`` times, and recomputes
the pooled score from their kept per-sequence sums and counts (no model needed):

* ``ci_low``/``ci_high``: the percentile interval at ``level`` (95% by default) of the resampled
  scores;
* ``stability``: the share of resamples in which the head passes its label's threshold; a label
  whose stability is under 0.9 depends on which sequences happened to be drawn.

The generator is seeded, so the same per-sequence sums and settings give the same intervals.
When every sequence gives the same score the interval is that point.

>>> import torch
>>> # [sequence, layer, head]; every sequence scores 0.5
>>> seq_total = torch.tensor([[[1.0]], [[1.0]], [[1.0]]], dtype=torch.float64)
>>> seq_count = torch.tensor([2.0, 2.0, 2.0], dtype=torch.float64)
>>> b = bootstrap(seq_total, seq_count, lambda s: s >= 0.4)
>>> b.ci_low.item(), b.ci_high.item(), b.stability.item()
(0.5, 0.5, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headscope.errors import HeadscopeError, setting

# pragma: no cover - torch is imported where a bootstrap runs, so reading a run needs none
if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

RESAMPLES = 1000
LEVEL = 0.95
#: A label whose stability is under this depends on which sequences were drawn (marked in reports).
STABLE = 0.9


@dataclass(frozen=True)
class Bootstrap:
    """One score's interval and label stability, ``[layer, head]`` each."""

    ci_low: Float[Tensor, "layer head"]
    ci_high: Float[Tensor, "layer head"]
    stability: Float[Tensor, "layer head"] | None  # None for scores without a label


def check(resamples: int, level: float) -> None:
    """Refuse settings that make no interval (one line)."""
    if resamples < 0:
        raise HeadscopeError(f"{setting('bootstrap')} must be 0 (off) or more, got {resamples}.")
    if not 0 < level < 1:
        raise HeadscopeError(
            f"{setting('ci')} is a coverage level between 0 and 1 (e.g. 0.95), got {level}."
        )


def bootstrap(
    seq_total: Float[Tensor, "sequence layer head"],
    seq_count: Float[Tensor, " sequence"],
    passes: Callable[[Tensor], Tensor] | None = None,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Bootstrap:
    """Percentile interval of the pooled score, and label stability, by resampling sequences.

    ``passes(scores) -> bool tensor`` says which scores earn the label (None: no stability).
    Sequences whose count is NaN (a head that was not measured on them) are kept out.
    """
    import torch

    check(resamples, level)
    n = seq_total.shape[0]
    flat = seq_total.reshape(n, -1).double()  # [sequence, layer * head]
    weights = draw_weights(n, resamples, seed)  # [resample, sequence]: times drawn
    totals = weights @ torch.nan_to_num(flat)  # [resample, layer * head]
    counts = weights @ seq_count.double()  # [resample]
    scores = totals / counts[:, None]  # NaN where a resample has no qualifying query
    nan_heads = torch.isnan(flat).all(0)  # [layer * head]: never measured
    scores[:, nan_heads] = torch.nan
    alpha = (1 - level) / 2
    q = torch.tensor([alpha, 1 - alpha], dtype=torch.float64)
    lo, hi = torch.nanquantile(scores, q, dim=0)  # [layer * head] each
    shape = seq_total.shape[1:]
    stability = None
    if passes is not None:
        ok = passes(scores) & ~torch.isnan(scores)  # [resample, layer * head]
        stability = ok.double().mean(0).reshape(shape)
        stability[nan_heads.reshape(shape)] = torch.nan
    return Bootstrap(lo.reshape(shape), hi.reshape(shape), stability)


def passes_fn(info, threshold: float | None = None) -> Callable[[Tensor], Tensor] | None:
    """``passes(scores)`` for a score's label (``info``: a Metric or ScoreInfo), or None if
    unlabelled."""
    if info is None or not getattr(info, "label", ""):
        return None
    t = info.threshold if threshold is None else threshold
    return (lambda s: s <= t) if info.below else (lambda s: s >= t)


# ------------------------------------------------------------------------------ other intervals


def draw_weights(n: int, resamples: int, seed: int) -> Float[Tensor, "resample unit"]:
    """How often each of ``n`` units (sequences, pairs) is drawn in each resample: the draws of
    :func:`bootstrap`, for any statistic that is a weighted mean over units."""
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    draws = torch.randint(n, (resamples, n), generator=gen)  # [resample, unit]: indices drawn
    return torch.zeros(resamples, n, dtype=torch.float64).scatter_add_(
        1, draws, torch.ones(resamples, n, dtype=torch.float64)
    )


def wilson(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a share ``hits / n`` (95% for the default ``z``):
    ``(p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)``.

    >>> tuple(round(v, 4) for v in wilson(0, 10))
    (0.0, 0.2775)
    """
    if n <= 0:
        return math.nan, math.nan
    p = hits / n
    z2 = z * z
    mid = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def paired_loss_ci(
    sums: Sequence[float],
    base_sums: Sequence[float],
    counts: Sequence[int],
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of ``sum(s) / sum(n) - sum(s_base) / sum(n)`` over texts resampled with
    replacement, the same draw for both conditions (paired: one set of texts, two conditions).
    ``(nan, nan)`` with no resamples."""
    import torch

    if resamples <= 0 or not len(counts):
        return math.nan, math.nan
    s = torch.tensor(list(sums), dtype=torch.float64)
    b = torch.tensor(list(base_sums), dtype=torch.float64)
    n = torch.tensor(list(counts), dtype=torch.float64)
    gen = torch.Generator().manual_seed(int(seed))
    draws = torch.randint(len(n), (resamples, len(n)), generator=gen)  # [resample, text]
    delta = (s[draws].sum(1) - b[draws].sum(1)) / n[draws].sum(1)  # [resample]
    alpha = (1 - level) / 2
    lo, hi = torch.quantile(delta, torch.tensor([alpha, 1 - alpha], dtype=torch.float64))
    return float(lo), float(hi)
