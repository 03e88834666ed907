"""Why attention divides its scores by sqrt(d_k): the article's argument as seeded simulations.

The dot product of two random ``d_k``-vectors with unit-variance entries has variance ``d_k``, so
unscaled scores spread further apart as heads get wider, and a softmax of widely spread scores puts
nearly all its weight on one key, where its gradient is nearly zero. Dividing by ``sqrt(d_k)``
brings the spread back to 1 at every width. The article states this with numbers (51% of trials
peaked without the scale, none with it); these functions recompute them so the notebook can check
them rather than quote them:

* :func:`dot_product_stats`: the mean and variance of ``q . k`` against ``d_k``;
* :func:`peak_stats`: the article's softmax simulation, unscaled against scaled.

Randomness always comes from a seeded ``torch.Generator``, never the global RNG, so a table is the
same on every run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch

from lib.attention_math import softmax_slope


def dot_product_stats(
    d_ks: Sequence[int], n_pairs: int = 200_000, seed: int = 0, chunk: int = 20_000
) -> pd.DataFrame:
    """Mean, variance and std of ``q . k`` for standard-normal ``q, k`` at each ``d_k``.

    Theory: mean 0, variance ``d_k``, std ``sqrt(d_k)``; dividing by ``sqrt(d_k)`` brings the std
    back to 1. One ``torch.Generator`` seeded with ``seed`` draws every pair; work goes in chunks
    of ``chunk`` pairs so memory stays small at large ``d_k``.

    >>> t = dot_product_stats([4, 64], n_pairs=20_000)
    >>> (t["var"] / t["d_k"]).round(1).tolist(), t["std_scaled"].round(1).tolist()
    ([1.0, 1.0], [1.0, 1.0])
    """
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for d_k in d_ks:
        dots = []
        for start in range(0, n_pairs, chunk):
            m = min(chunk, n_pairs - start)
            q = torch.randn(m, d_k, generator=gen, dtype=torch.float64)  # [pair, d_k]
            k = torch.randn(m, d_k, generator=gen, dtype=torch.float64)  # [pair, d_k]
            dots.append((q * k).sum(-1))  # [pair]
        d = torch.cat(dots)  # [n_pairs]
        rows.append(
            {
                "d_k": d_k,
                "mean": d.mean().item(),
                "var": d.var().item(),
                "std": d.std().item(),
                "sqrt_d_k": math.sqrt(d_k),
                "std_scaled": (d / math.sqrt(d_k)).std().item(),
            }
        )
    return pd.DataFrame(rows)


def peak_stats(
    d_k: int = 128,
    n_keys: int = 8,
    n_trials: int = 20_000,
    seed: int = 0,
    threshold: float = 0.99,
    chunk: int = 5_000,
) -> pd.DataFrame:
    """The article's simulation: how often softmax puts > ``threshold`` of its weight on one key.

    Each trial draws one standard-normal query and ``n_keys`` keys of size ``d_k`` and takes the
    softmax of the ``n_keys`` dot products, unscaled and divided by ``sqrt(d_k)``. One row per
    variant: ``frac_peaked`` (share of trials whose top weight exceeds ``threshold``), its binomial
    standard error, ``mean_top`` (the average top weight) and the mean
    :func:`~lib.attention_math.softmax_slope`. The article (d_k = 128, 8 keys,
    20,000 trials) reports 51% peaked unscaled, 0% scaled, and a top weight of 36% on average when
    scaled.

    >>> t = peak_stats(n_trials=2_000).set_index("scores")
    >>> bool(0.45 < t.loc["unscaled", "frac_peaked"] < 0.60), float(t.loc["scaled", "frac_peaked"])
    (True, 0.0)
    """
    gen = torch.Generator().manual_seed(seed)
    tops: dict[str, list[torch.Tensor]] = {"unscaled": [], "scaled": []}
    slopes: dict[str, list[torch.Tensor]] = {"unscaled": [], "scaled": []}
    for start in range(0, n_trials, chunk):
        m = min(chunk, n_trials - start)
        q = torch.randn(m, 1, d_k, generator=gen, dtype=torch.float64)  # [trial, 1, d_k]
        k = torch.randn(m, n_keys, d_k, generator=gen, dtype=torch.float64)  # [trial, key, d_k]
        s = (q * k).sum(-1)  # [trial, key]
        for name, sc in (("unscaled", s), ("scaled", s / math.sqrt(d_k))):
            tops[name].append(sc.softmax(-1).amax(-1))  # [trial]
            slopes[name].append(softmax_slope(sc))  # [trial]
    rows = []
    for name in ("unscaled", "scaled"):
        top = torch.cat(tops[name])  # [n_trials]
        frac = (top > threshold).double().mean().item()
        rows.append(
            {
                "scores": name,
                "d_k": d_k,
                "n_keys": n_keys,
                "n_trials": n_trials,
                "frac_peaked": frac,
                "frac_peaked_se": math.sqrt(frac * (1 - frac) / n_trials),
                "mean_top": top.mean().item(),
                "mean_slope": torch.cat(slopes[name]).mean().item(),
            }
        )
    return pd.DataFrame(rows)
