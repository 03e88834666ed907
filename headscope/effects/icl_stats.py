"""Statistics of the in-context learning run (:mod:`headscope.apps.icl`; docs/icl.md): means over
tasks of means over prompts with two-level bootstrap intervals (tasks drawn, then each drawn task's
prompts), rank correlation and top-k overlap of two head rankings with a chance level, and the
ablations' accuracies beside random head sets."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from headscope.uncertainty import draw_weights


def task_draws(per_task: list[Tensor], resamples: int, seed: int) -> Tensor:
    """Bootstrap draws of the mean over tasks of each task's mean over its prompts
    (``per_task[t]``: ``[prompt, ...]``): tasks drawn with replacement, then prompts within each
    task (``[resample, ...]``)."""
    t_w = draw_weights(len(per_task), resamples, seed)  # [R, T]
    means = []
    for t, x in enumerate(per_task):
        w = draw_weights(x.shape[0], resamples, seed + 1 + t)  # [R, n_t]
        flat = x.double().reshape(x.shape[0], -1)
        means.append((w @ flat) / x.shape[0])  # [R, cells]
    stacked = torch.stack(means, 1)  # [R, T, cells]
    out = (t_w[:, :, None] * stacked).sum(1) / t_w.sum(1, keepdim=True)
    return out.reshape(resamples, *per_task[0].shape[1:])


def over_tasks(
    per_task: list[Tensor], resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """The mean over tasks of each task's mean over prompts, and its two-level percentile
    bootstrap interval (NaN without resamples)."""
    mean = torch.stack([x.double().mean(0) for x in per_task]).mean(0)
    if not resamples:
        nan = torch.full_like(mean, torch.nan)
        return mean, nan, nan
    draws = task_draws(per_task, resamples, seed)
    return (mean, *_quantiles(draws, level))


def over_prompts(
    x: Tensor, resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """The mean over prompts (``x``: ``[prompt, ...]``) and its percentile bootstrap interval."""
    mean = x.double().mean(0)
    if not resamples:
        nan = torch.full_like(mean, torch.nan)
        return mean, nan, nan
    w = draw_weights(x.shape[0], resamples, seed)
    draws = (w @ x.double().reshape(x.shape[0], -1)) / x.shape[0]
    return (mean, *_quantiles(draws.reshape(resamples, *x.shape[1:]), level))


def _quantiles(draws: Tensor, level: float) -> tuple[Tensor, Tensor]:
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(draws.double(), q, dim=0)
    return lo, hi


def ranks(x: Tensor) -> Tensor:
    """Average ranks (1 = smallest) along the last dimension, ties sharing their mean rank."""
    flat = x.double().reshape(-1, x.shape[-1])
    out = torch.empty_like(flat)
    for r in range(flat.shape[0]):
        v = flat[r]
        order = v.argsort()
        rk = torch.empty_like(v)
        rk[order] = torch.arange(1, len(v) + 1, dtype=torch.float64)
        uniq, inv = torch.unique(v, return_inverse=True)
        if len(uniq) < len(v):  # ties: each tied value gets its group's mean rank
            sums = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, rk)
            one = torch.ones_like(rk)
            cnt = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, one)
            rk = (sums / cnt)[inv]
        out[r] = rk
    return out.reshape(x.shape)


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """Spearman's rank correlation of ``a`` and ``b`` along their last dimension (the Pearson
    correlation of their average ranks)."""
    ra, rb = ranks(a), ranks(b)
    ra = ra - ra.mean(-1, keepdim=True)
    rb = rb - rb.mean(-1, keepdim=True)
    return (ra * rb).sum(-1) / ((ra**2).sum(-1) * (rb**2).sum(-1)).sqrt()


def top_k(x: Tensor, k: int) -> Tensor:
    """The indices of the ``k`` largest values of ``x`` (``[..., n]`` -> ``[..., k]``)."""
    return x.double().topk(k, -1).indices


def overlap(a: Tensor, b: Tensor, k: int) -> Tensor:
    """How many of the top ``k`` of ``a`` are among the top ``k`` of ``b`` (along the last
    dimension)."""
    ta, tb = top_k(a, k), top_k(b, k)
    return (ta[..., :, None] == tb[..., None, :]).any(-1).sum(-1)


def overlap_chance(n: int, k: int, seen: int) -> tuple[float, float]:
    """Two random top-``k`` sets among ``n`` heads: their expected overlap ``k^2 / n`` and the
    chance of an overlap of at least ``seen`` (hypergeometric)."""
    total = math.comb(n, k)
    tail = sum(math.comb(k, x) * math.comb(n - k, k - x) for x in range(seen, k + 1)) / total
    return k * k / n, tail
