"""Effects, their bootstrap intervals, and the tidy tables of a patching run (docs/patching.md).

Per row (one patch: activation, position, direction, layer, head, estimator) the pooled effect is a
ratio of means over the task's pairs:

* denoising: ``(mean m_patched - mean m_corrupt) / (mean m_clean - mean m_corrupt)``, the share of
  the clean-corrupt gap restored;
* noising: ``(mean m_clean - mean m_patched) / (mean m_clean - mean m_corrupt)``, the share
  destroyed.

Both are 0 for an activation that carries nothing and 1 for one that carries everything. ``delta``
keeps the raw metric difference beside it: ``mean m_patched - mean m_base`` (base = the run patched:
corrupt for denoising, clean for noising), in the metric's units.

Intervals follow :mod:`headscope.uncertainty`: pairs are the unit that was sampled, so each of
``resamples`` seeded resamples draws pairs with replacement (one draw shared by every row, so rows
can be compared resample by resample) and recomputes the ratio of means from them; ``ci_low`` /
``ci_high`` are the percentile interval at ``level``. A resample whose gap is exactly 0 gives no
ratio and is left out (NaN).

Columns of the table (:data:`COLUMNS`): ``position`` is ``all``, a named position (``S2``, ``END``)
or a token index (``"7"``, from ``positions="each"``); ``kv_mode`` is ``group`` for rows that patch
a KV head (k, v on a grouped-query model: ``head`` is then the KV head's index, ``head_name``
``L{l}KV{g}``, ``query_heads`` the query heads that read it) and ``head`` for every per-query-head
row (z, q, pattern, and k/v as one query head reads them); ``estimator`` is ``exact`` or
``attribution``; ``m_patched`` is the mean patched metric (attribution: ``m_base + estimate``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from headscope.uncertainty import LEVEL, RESAMPLES, check, draw_weights

COLUMNS = [
    "task",
    "activation",
    "position",
    "direction",
    "layer",
    "head",
    "head_name",
    "effect",
    "ci_low",
    "ci_high",
    "estimator",
    "kv_mode",
    "query_heads",
    "delta",
    "delta_ci_low",
    "delta_ci_high",
    "m_patched",
    "n_pairs",
]
#: Columns of ``dla.csv``.
DLA_COLUMNS = [
    "task",
    "prompt",
    "layer",
    "head",
    "head_name",
    "dla",
    "ci_low",
    "ci_high",
    "n_pairs",
]
#: Columns of ``baseline.csv``.
BASELINE_COLUMNS = [
    "task",
    "prompt",
    "metric",
    "mean",
    "ci_low",
    "ci_high",
    "share_correct",
    "n_pairs",
]


def ratio_effects(
    m_clean: Tensor,
    m_corrupt: Tensor,
    m_patched: Float[Tensor, "row pair"],
    denoise: Tensor,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Effect, delta and their percentile intervals for every row (see the module docstring).

    ``denoise[row]``: True for denoising rows (base corrupt), False for noising (base clean).
    Returns ``{"effect", "ci_low", "ci_high", "delta", "delta_ci_low", "delta_ci_high",
    "m_patched"}``, one value per row.
    """
    check(resamples, level)
    n = m_clean.shape[0]
    mp = m_patched.double()
    den = denoise.bool()[:, None]  # [row, 1]

    def stats(c, k, p):  # means [..., 1], [..., 1], [..., row]
        gap = c - k
        eff = torch.where(den.T, p - k, c - p) / torch.where(gap == 0, torch.nan, gap)
        delta = p - torch.where(den.T, k, c)
        return eff, delta

    mean = lambda x: x.mean(-1, keepdim=True)  # noqa: E731
    eff, delta = stats(
        mean(m_clean.double())[None], mean(m_corrupt.double())[None], mp.mean(-1)[None]
    )
    out = {"effect": eff[0].numpy(), "delta": delta[0].numpy(), "m_patched": mp.mean(-1).numpy()}
    if resamples:
        w = draw_weights(n, resamples, seed) / n  # [resample, pair]
        c, k = (w @ m_clean.double())[:, None], (w @ m_corrupt.double())[:, None]  # [resample, 1]
        r_eff, r_delta = stats(c, k, w @ mp.T)  # [resample, row]
        alpha = (1 - level) / 2
        q = torch.tensor([alpha, 1 - alpha], dtype=torch.float64)
        for name, x in (("", r_eff), ("delta_", r_delta)):
            lo, hi = torch.nanquantile(x, q, dim=0)
            out[f"{name}ci_low"], out[f"{name}ci_high"] = lo.numpy(), hi.numpy()
    else:
        for name in ("ci_low", "ci_high", "delta_ci_low", "delta_ci_high"):
            out[name] = np.full(len(mp), np.nan)
    return out


def mean_interval(
    x: Tensor, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean, ci_low, ci_high)`` of a per-pair quantity, same draws and percentiles as above."""
    x = x.double()
    if not resamples:
        return float(x.mean()), float("nan"), float("nan")
    w = draw_weights(len(x), resamples, seed) / len(x)
    alpha = (1 - level) / 2
    lo, hi = torch.quantile(w @ x, torch.tensor([alpha, 1 - alpha], dtype=torch.float64))
    return float(x.mean()), float(lo), float(hi)


def baseline_table(
    task: str, metric: str, base: dict[str, Tensor], resamples: int, level: float, seed: int
) -> pd.DataFrame:
    """One row per prompt side (clean, corrupt) and one for the gap clean - corrupt: the metric's
    mean over pairs with its interval, and the share of pairs whose logit difference is > 0."""
    rows = []
    for name, x, ld in (
        ("clean", base["clean"], base["clean_logit_diff"]),
        ("corrupt", base["corrupt"], base["corrupt_logit_diff"]),
        ("clean - corrupt", base["clean"] - base["corrupt"], None),
    ):
        mean, lo, hi = mean_interval(x, resamples, level, seed)
        rows.append(
            {
                "task": task,
                "prompt": name,
                "metric": metric,
                "mean": mean,
                "ci_low": lo,
                "ci_high": hi,
                "share_correct": float((ld > 0).double().mean())
                if ld is not None
                else float("nan"),
                "n_pairs": len(x),
            }
        )
    return pd.DataFrame(rows, columns=BASELINE_COLUMNS)


def head_name(layer: int, head: int, kv: bool = False) -> str:
    """``L{layer}H{head}``; a KV head (group-mode k/v rows) is ``L{layer}KV{head}``."""
    return f"L{layer}{'KV' if kv else 'H'}{head}"


def effect_table(
    keys: list[tuple],
    m_clean: Tensor,
    m_corrupt: Tensor,
    m_patched: Float[Tensor, "row pair"],
    task: str,
    n_heads: int,
    n_kv_heads: int,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> pd.DataFrame:
    """The tidy table (:data:`COLUMNS`), one row per key ``(direction, activation, kv_mode,
    position, layer, unit, estimator)`` with its per-pair patched metric in ``m_patched[row]``."""
    denoise = torch.tensor([k[0] == "denoising" for k in keys], dtype=torch.bool)
    stats = ratio_effects(m_clean, m_corrupt, m_patched, denoise, resamples, level, seed)
    group = n_heads // n_kv_heads
    gqa = group > 1
    rows = []
    for i, (d, act, kv_mode, position, layer, unit, estimator) in enumerate(keys):
        kv = act in ("k", "v") and kv_mode == "group" and gqa
        heads = range(unit * group, (unit + 1) * group) if kv else [unit]
        rows.append(
            {
                "task": task,
                "activation": act,
                "position": position,
                "direction": d,
                "layer": layer,
                "head": unit,
                "head_name": head_name(layer, unit, kv),
                "estimator": estimator,
                "kv_mode": kv_mode,
                "query_heads": ",".join(map(str, heads)),
                "n_pairs": len(m_clean),
                **{c: float(stats[c][i]) for c in stats},
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def dla_table(
    task: str,
    per_prompt: dict[str, Float[Tensor, "pair layer head"]],
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> pd.DataFrame:
    """Every head's direct logit attribution per prompt side (``{"clean": [pair, layer, head],
    ...}``): the mean over pairs with its percentile interval (the same draws as the effects)."""
    check(resamples, level)
    rows = []
    for prompt, per in per_prompt.items():
        n, n_layers, n_heads = per.shape
        mean = per.mean(0)
        lo = hi = torch.full_like(mean, torch.nan)
        if resamples:
            w = draw_weights(n, resamples, seed) / n
            boot = torch.einsum("rp,plh->rlh", w, per.double())  # [resample, layer, head]
            alpha = (1 - level) / 2
            lo, hi = torch.quantile(
                boot, torch.tensor([alpha, 1 - alpha], dtype=torch.float64), dim=0
            )
        for layer in range(n_layers):
            for h in range(n_heads):
                rows.append(
                    {
                        "task": task,
                        "prompt": prompt,
                        "layer": layer,
                        "head": h,
                        "head_name": head_name(layer, h),
                        "dla": float(mean[layer, h]),
                        "ci_low": float(lo[layer, h]),
                        "ci_high": float(hi[layer, h]),
                        "n_pairs": n,
                    }
                )
    return pd.DataFrame(rows, columns=DLA_COLUMNS)
