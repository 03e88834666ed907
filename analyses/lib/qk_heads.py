"""Notebook 12's helpers (QK attribution): pattern scores that choose the heads, on prompts other
than the ones the heads are then decomposed on, and the comparisons the notebook draws.

* :func:`pattern_scores`: every head's previous-token, induction, sink and duplicate-token
  attention on ``BOS + R + R`` sequences (one recorded forward; mean attention weights over
  prompts).
* :func:`attention_at`: every head's mean attention from one named position to another (IOI's
  END -> IO) on a task's clean prompts.
* :func:`side_total`: what a set of components carries of a head's logit on one side (query or
  key), in logit units, from ``headscope.apps.qk.qk``'s per-prompt side totals, with a bootstrap
  interval over prompts (at the chosen keys, or at the null keys).
* :func:`rank_agreement`: Spearman's rho between two scores of the same senders, and the share of
  random relabellings (many draws) that reach it.
* :func:`random_total`: the same for many random sets of components of the same size (the base
  rate a chosen set is held against).

>>> rho, p = rank_agreement([1, 2, 3, 4, 5], [2, 1, 4, 3, 5], draws=999)
>>> round(rho, 2), p < 0.2
(0.8, True)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from headscope.circuits import qk_attribution as qa


def pattern_scores(model, prompts: Sequence[Sequence[int]], repeat_len: int) -> pd.DataFrame:
    """Per head (``layer``, ``head``, ``name``): ``previous_token`` (attention from each query
    ``i >= 2`` to ``i - 1``), ``induction`` (from each second-copy query to the token after its
    first occurrence, ``i - L + 1``), ``duplicate`` (to the first occurrence itself, ``i - L``)
    and ``sink`` (from each query ``i >= 1`` to position 0), each the mean over queries and
    prompts. ``prompts``: ``BOS + R + R`` with ``|R| = repeat_len``."""
    ids = torch.tensor([list(p) for p in prompts])
    rec = qa.record(model, ids)
    n = ids.shape[1]
    L = repeat_len
    second = torch.arange(L + 1, n)  # queries in the second copy
    rows = []
    for la in range(model.n_layers):
        pat = rec.pattern(la)  # [row, head, query, key]
        for h in range(model.n_heads):
            p = pat[:, h]
            q = torch.arange(2, n)
            rows.append(
                {
                    "layer": la,
                    "head": h,
                    "name": f"L{la}H{h}",
                    "previous_token": float(p[:, q, q - 1].mean()),
                    "induction": float(p[:, second, second - L + 1].mean()),
                    "duplicate": float(p[:, second, second - L].mean()),
                    "sink": float(p[:, 1:, 0].mean()),
                }
            )
    return pd.DataFrame(rows)


def attention_at(model, prompts, positions: dict, query: str, key: str) -> pd.DataFrame:
    """Per head, the mean attention from ``positions[query]`` to ``positions[key]`` over the
    prompts (grouped by length, one recorded forward per length)."""
    by_len: dict[int, list[int]] = {}
    for p, ids in enumerate(prompts):
        by_len.setdefault(len(ids), []).append(p)
    total = torch.zeros(model.n_layers, model.n_heads, dtype=torch.float64)
    for _, members in sorted(by_len.items()):
        ids = torch.tensor([list(prompts[p]) for p in members])
        rec = qa.record(model, ids)
        r = torch.arange(len(members))
        i = torch.tensor([positions[query][p] for p in members])
        j = torch.tensor([positions[key][p] for p in members])
        for la in range(model.n_layers):
            total[la] += rec.pattern(la)[r, :, i, j].sum(0).cpu()
    total /= len(prompts)
    return pd.DataFrame(
        [
            {"layer": la, "head": h, "name": f"L{la}H{h}", f"{query}_to_{key}": float(total[la, h])}
            for la in range(model.n_layers)
            for h in range(model.n_heads)
        ]
    )


def side_total(res: dict, head: str, side: str, members: Sequence[str], resamples: int = 1000,
               seed: int = 0, null: bool = False) -> tuple[float, float, float]:  # fmt: skip
    """What the components ``members`` carry of ``head``'s logit on ``side`` (``query`` or
    ``key``), in logit units: the mean over prompts of their summed side totals, with a
    percentile bootstrap interval over prompts (``res``: what ``headscope.apps.qk.qk`` returns);
    ``null``: the same at the null keys."""
    from headscope.uncertainty import draw_weights

    q, k, qn, kn = res["side_prompts"][head]
    x = ((qn if null else q) if side == "query" else (kn if null else k)).double()
    x = x[~torch.isnan(x).any(1)]  # prompts without a null key
    names = res["components"][head]
    idx = [names.index(m) for m in members if m in names]
    part = x[:, idx].sum(1)  # per prompt
    w = draw_weights(len(part), resamples, seed) / len(part)
    lo, hi = torch.quantile(w @ part, torch.tensor([0.025, 0.975], dtype=torch.float64))
    return float(part.mean()), float(lo), float(hi)


def rank_agreement(a: Sequence[float], b: Sequence[float], draws: int = 10_000, seed: int = 0):
    """``(rho, p)``: Spearman's rho of ``a`` and ``b`` (the same senders in the same order) and the
    share of ``draws`` random relabellings of ``b`` whose rho is at least as large (one-sided)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()
    rho = float(np.corrcoef(ra, rb)[0, 1])
    rng = np.random.default_rng(seed)
    null = np.array([np.corrcoef(ra, rng.permutation(rb))[0, 1] for _ in range(draws)])
    return rho, float((np.sum(null >= rho) + 1) / (draws + 1))


def random_total(res: dict, head: str, side: str, k: int, candidates: Sequence[str],
                 draws: int = 10_000, seed: int = 0) -> np.ndarray:  # fmt: skip
    """What ``draws`` random sets of ``k`` of ``candidates`` carry of ``head``'s logit on
    ``side`` (mean over prompts, logit units): the base rate a chosen set is held against."""
    q, kk, _, _ = res["side_prompts"][head]
    v = (q if side == "query" else kk).double().mean(0).numpy()  # [component]
    names = res["components"][head]
    idx = np.array([names.index(c) for c in candidates if c in names])
    rng = np.random.default_rng(seed)
    return np.array([v[rng.choice(idx, size=k, replace=False)].sum() for _ in range(draws)])
