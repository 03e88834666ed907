"""One timer and one quadratic fit, shared by the analysis notebooks and ``benchmarks/``.

Attention's score grid costs ``n^2`` per head and layer; the weights cost ``n``. Whether the grid
matters at a given length is a measured question, and the notebooks and the benchmark ask it the
same way: time a call with :func:`best_time` (the best of a few runs: on a shared machine the
fastest run is the least disturbed one), then split the times into ``a + b n + c n^2`` with
:func:`fit_quadratic`. Keeping both here means a notebook's fit and a benchmark's fit are the same
arithmetic on the same kind of number.

A leaf module: it imports nothing from headscope but :mod:`headscope.errors`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from headscope.errors import HeadscopeError


def best_time(
    fn: Callable[[], object], repeats: int = 3, budget_s: float = math.inf, long_s: float = math.inf
) -> float:
    """The best wall time (seconds) of up to ``repeats`` calls of ``fn()``.

    Repeating stops early once the calls so far have used ``budget_s`` seconds in all, or once one
    call took longer than ``long_s`` (a run that long is steady enough on its own). So
    ``best_time(fn, 3, long_s=10)`` is "best of 3 when a run takes under 10 s", and
    ``best_time(fn, 3, budget_s=15)`` gives short calls every repeat and long ones fewer. ``fn`` is
    always called at least once.

    >>> calls = []
    >>> best_time(lambda: calls.append(1), repeats=3) >= 0, len(calls)
    (True, 3)
    >>> calls.clear()
    >>> _ = best_time(lambda: calls.append(1), repeats=3, long_s=0.0)  # every call is "long"
    >>> len(calls)
    1
    """
    if repeats < 1:
        raise HeadscopeError(f"best_time needs repeats >= 1; got {repeats}.")
    best, spent = math.inf, 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent >= budget_s or took > long_s:
            break
    return best


def fit_quadratic(n: Sequence[float], seconds: Sequence[float]) -> dict[str, float]:
    """Fit ``t = a + b n + c n^2`` with ``a, b, c >= 0``, least squares on relative error.

    Relative error (each row divided by ``t``) keeps the short, fast runs from being ignored next to
    the long ones. The three parts are costs, so none may be negative: every subset of the terms is
    fitted and the best fit with no negative coefficient wins (exact non-negative least squares for
    three unknowns). Returns ``a, b, c`` and ``n_cross = b / c``, the length beyond which the
    quadratic term is the larger (``inf`` when ``c = 0``).

    >>> f = fit_quadratic([1, 2, 3, 4], [1 + 2 * x + 3 * x * x for x in [1, 2, 3, 4]])
    >>> [round(f[k], 6) for k in "abc"], round(f["n_cross"], 6)
    ([1.0, 2.0, 3.0], 0.666667)
    >>> f = fit_quadratic([1, 2, 3, 4], [5 - 0.1 * x + x * x for x in [1, 2, 3, 4]])
    >>> f["b"]                                         # a negative slope is not a cost
    0.0
    """
    x = np.asarray(n, dtype=np.float64)  # [point]
    y = np.asarray(seconds, dtype=np.float64)  # [point]
    if x.ndim != 1 or x.shape != y.shape or not len(x):
        raise HeadscopeError(
            "fit_quadratic needs as many times as lengths, at least one; got "
            f"{x.shape} "
            f"lengths and {y.shape} times."
        )
    if not (np.isfinite(y).all() and (y > 0).all() and np.isfinite(x).all()):
        raise HeadscopeError(
            "fit_quadratic needs finite lengths and positive, finite times (it "
            "fits relative "
            "error, so a time of 0 cannot be used)."
        )
    design = np.stack([np.ones_like(x), x, x**2], axis=1) / y[:, None]  # [point, term]
    target = np.ones_like(y)  # [point]: a perfect fit predicts each time exactly, ratio 1
    best: tuple[float, np.ndarray] | None = None
    for mask in range(1, 8):  # every non-empty subset of {a, b, c}
        cols = [i for i in range(3) if mask >> i & 1]
        coef, *_ = np.linalg.lstsq(design[:, cols], target, rcond=None)  # [len(cols)]
        if (coef < 0).any():
            continue
        full = np.zeros(3)  # [term]
        full[cols] = coef
        err = float(np.sum((design @ full - target) ** 2))
        if best is None or err < best[0] - 1e-15:
            best = (err, full)
    assert best is not None  # a single term always fits with a positive coefficient
    a, b, c = (float(v) for v in best[1])
    return {"a": a, "b": b, "c": c, "n_cross": b / c if c > 0 else math.inf}
