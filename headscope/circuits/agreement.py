"""Do two rankings of the same senders agree? E.g. a receiver's senders by composition z (from the
weights) and by |path-patching effect| (from the model run): one row of numbers per receiver.

For two scores ``a``, ``b`` of the same ``n`` senders (higher = ranked first):

* **Spearman's rho**: the Pearson correlation of their average ranks (tied values share the mean
  of the ranks they span). ``rho_low``/``rho_high``: the percentile interval at ``level`` of rho
  over ``n_boot`` bootstrap resamples of the senders (pairs kept together, re-ranked in each);
  ``rho_p``: the two-sided permutation p-value, ``(1 + #{|rho_perm| >= |rho|}) / (1 + n_perm)``
  over ``n_perm`` random pairings. Both seeded (``numpy.random.default_rng(seed)``).
* **top-k overlap**: how many of ``a``'s ``k`` highest senders are among ``b``'s ``k`` highest
  (``overlap``; ``overlap_share = overlap / k``). A tie across the ``k``-th place is broken by the
  senders' order as given (first wins), so the sets always hold ``k`` senders. Under a random
  ranking the overlap is hypergeometric: ``overlap_chance = k^2 / n`` is its mean and
  ``overlap_p = P(overlap >= observed)`` its exact tail, the limit of a permutation test (no
  sampling).

>>> row = rank_agreement([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], k=2, n_boot=0, n_perm=0)
>>> row["rho"], row["overlap"], row["overlap_chance"]
(1.0, 2, 0.6666666666666666)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from headscope.errors import HeadscopeError

LEVEL = 0.95
N_BOOT = 2000
N_PERM = 2000
TOP_K = 5  # the default k, capped at the number of senders


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks along the last axis, ties given the mean of the ranks they span.

    >>> average_ranks(np.array([10.0, 20.0, 20.0, 5.0])).tolist()
    [2.0, 3.5, 3.5, 1.0]
    """
    x = np.asarray(x, dtype=np.float64)
    s = np.sort(x, axis=-1)
    flat_s = s.reshape(-1, s.shape[-1])
    flat_x = x.reshape(-1, x.shape[-1])
    # rank = #below + (#equal + 1) / 2 = (#below + #at-or-below + 1) / 2, row by row
    rows = zip(flat_s, flat_x, strict=True)
    both = [(np.searchsorted(r, v, "left"), np.searchsorted(r, v, "right")) for r, v in rows]
    below, upto = (np.stack(side) for side in zip(*both, strict=True))
    return ((below + upto + 1) / 2.0).reshape(x.shape)


def _pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation along the last axis (NaN where either side is constant)."""
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (a * b).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def _top(x: np.ndarray, k: int) -> set[int]:
    """Indices of the k highest values (ties: the earlier index first)."""
    return set(np.argsort(-x, kind="stable")[:k].tolist())


def _hypergeom_tail(n: int, k: int, x: int) -> float:
    """``P(X >= x)`` for the overlap ``X`` of two random k-subsets of n items."""
    total = math.comb(n, k)
    return sum(math.comb(k, j) * math.comb(n - k, k - j) for j in range(x, k + 1)) / total


def _values(x, name: str) -> pd.Series:
    if isinstance(x, pd.Series):
        return x.astype(np.float64)
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise HeadscopeError(f"{name} must be one score per sender (1-d), got shape {arr.shape}.")
    return pd.Series(arr)


def rank_agreement(
    a,
    b,
    k: int | None = None,
    n_boot: int = N_BOOT,
    n_perm: int = N_PERM,
    seed: int = 0,
    level: float = LEVEL,
) -> dict:
    """One row: how well rankings ``a`` and ``b`` of the same senders agree (module docstring).

    ``a``, ``b``: arrays of the same length (sender ``i`` at place ``i`` in both), or pandas
    Series over the same senders (aligned by index, in ``a``'s order). NaN scores are refused.
    ``k`` None: 5, or every sender when there are fewer.
    Returns ``n, rho, rho_low, rho_high, rho_p, k, overlap, overlap_share, overlap_chance,
    overlap_p, top_a, top_b`` (``top_*``: the top-k senders, labels where Series were given).
    """
    a, b = _values(a, "a"), _values(b, "b")
    if set(a.index) != set(b.index):
        missing = sorted(map(str, set(a.index) ^ set(b.index)))[:5]
        raise HeadscopeError(
            f"The two rankings must score the same senders; {len(set(a.index) ^ set(b.index))} "
            f"appear in only one (e.g. {', '.join(missing)})."
        )
    if not a.index.is_unique:
        raise HeadscopeError("Each sender must appear once in a ranking; the index has repeats.")
    b = b.loc[a.index]
    if a.isna().any() or b.isna().any():
        raise HeadscopeError("A ranking holds NaN scores; drop those senders from both first.")
    n = len(a)
    if n < 2:
        raise HeadscopeError(f"Two rankings need at least 2 senders to agree or not, got {n}.")
    if k is None:
        k = min(TOP_K, n)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise HeadscopeError(f"k (the top-k overlap) must be an integer in 1-{n}, got {k!r}.")
    if not 0 < level < 1:
        raise HeadscopeError(f"level is a coverage between 0 and 1 (e.g. 0.95), got {level}.")
    for name, v in (("n_boot", n_boot), ("n_perm", n_perm)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise HeadscopeError(f"{name} must be 0 (off) or a positive integer, got {v!r}.")
    x, y = a.to_numpy(), b.to_numpy()
    rx, ry = average_ranks(x), average_ranks(y)
    rho = float(_pearson(rx, ry))
    rng = np.random.default_rng(seed)
    low = high = p = float("nan")
    if n_boot:
        idx = rng.integers(0, n, size=(n_boot, n))  # [resample, sender]
        boot = _pearson(average_ranks(x[idx]), average_ranks(y[idx]))
        boot = boot[~np.isnan(boot)]  # a resample of one repeated sender has no rank order
        if len(boot):
            low, high = (float(v) for v in np.quantile(boot, [(1 - level) / 2, (1 + level) / 2]))
    if n_perm and not math.isnan(rho):
        perm = rng.permuted(np.broadcast_to(ry, (n_perm, n)), axis=1)  # [permutation, sender]
        null = _pearson(np.broadcast_to(rx, (n_perm, n)), perm)
        p = float((1 + np.sum(np.abs(null) >= abs(rho) - 1e-12)) / (1 + n_perm))
    ta, tb = _top(x, k), _top(y, k)
    overlap = len(ta & tb)
    labels = list(a.index)
    return {
        "n": n,
        "rho": rho,
        "rho_low": low,
        "rho_high": high,
        "rho_p": p,
        "k": k,
        "overlap": overlap,
        "overlap_share": overlap / k,
        "overlap_chance": k * k / n,
        "overlap_p": _hypergeom_tail(n, k, overlap),
        "top_a": [labels[i] for i in sorted(ta, key=lambda i: -x[i])],
        "top_b": [labels[i] for i in sorted(tb, key=lambda i: -y[i])],
    }


def agreement_table(
    a: pd.DataFrame | Mapping,
    b: pd.DataFrame | Mapping | None = None,
    *,
    receiver: str = "receiver",
    sender: str = "sender",
    a_col: str | None = None,
    b_col: str | None = None,
    k: int | None = None,
    n_boot: int = N_BOOT,
    n_perm: int = N_PERM,
    seed: int = 0,
    level: float = LEVEL,
) -> pd.DataFrame:
    """:func:`rank_agreement` for many receivers: one row per receiver (column ``receiver``
    first).

    Either two mappings ``{receiver: Series over senders}``, or two tidy DataFrames with columns
    ``receiver``, ``sender`` and the score (``a_col`` in ``a``, ``b_col`` in ``b``), or one
    DataFrame ``a`` holding both score columns (``b`` None). Receivers are those of ``a``; each
    must be in ``b`` too. Every receiver uses the same ``seed``.
    """
    if isinstance(a, pd.DataFrame):
        if b is None:
            b = a
        for frame, col, name in ((a, a_col, "a_col"), (b, b_col, "b_col")):
            if col is None or col not in frame.columns or receiver not in frame.columns:
                raise HeadscopeError(
                    f"{name} must name a score column of the table beside '{receiver}' and "
                    f"'{sender}'; its columns are: {', '.join(map(str, frame.columns))}."
                )
        sa = {r: g.set_index(sender)[a_col] for r, g in a.groupby(receiver, sort=False)}
        sb = {r: g.set_index(sender)[b_col] for r, g in b.groupby(receiver, sort=False)}
    else:
        if b is None:
            raise HeadscopeError("Give two rankings per receiver: b is missing.")
        sa, sb = dict(a), dict(b)
    rows = []
    for r, ranking in sa.items():
        if r not in sb:
            raise HeadscopeError(f"Receiver {r} is ranked in a but not in b.")
        row = rank_agreement(
            ranking, sb[r], k=k, n_boot=n_boot, n_perm=n_perm, seed=seed, level=level
        )
        rows.append({receiver: r, **row})
    return pd.DataFrame(rows)
