"""How much of a task's metric a set of heads carries on its own: every other head mean-ablated
(Wang et al. 2022's faithfulness), against random head sets of the same size.

For a set ``C`` of heads, run the clean prompts with every head *not* in ``C`` replaced by its
mean output (its slice of the output projection's input, averaged over every real position of
every prompt of the reference side: ``corrupt`` by default, the ABC distribution of IOI, or
``clean``), and read the metric at the last position. Per pair:

* ``m_full``: nothing ablated; ``m_none``: every head ablated; ``m_set``: all but ``C`` ablated;
* ``faithfulness = mean m_set / mean m_full`` (Wang et al.'s F(C) / F(M)), and the share of the
  gap between the empty and the full model that ``C`` recovers, ``(mean m_set - mean m_none) /
  (mean m_full - mean m_none)``, each with a percentile interval over pairs.

Random sets of the same size, drawn from the same pool of heads (seeded, one forward per set
batched over pairs), give the distribution a set's score must beat: :func:`faithfulness` returns
each draw's score so a caller can quote where ``C`` falls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from headscope.effects import loop
from headscope.effects.loop import forwards
from headscope.effects.patching import Batch, read_rows
from headscope.errors import HeadscopeError
from headscope.models.attention import SetHeads
from headscope.uncertainty import LEVEL, draw_weights

Head = tuple[int, int]


def head_means(model, batches: Sequence[Batch], side: str) -> Float[Tensor, "layer head dim"]:
    """Each head's mean output over every real position of every prompt of ``side``."""
    inputs = ((batch.tokens(side), batch.mask, None) for batch in batches)
    return loop.head_means(model, inputs).float()


def _metrics(model, batches, metric, means, keeps: Float[Tensor, "set layer head"], n_pairs):
    """``[set, pair]``: the clean metric with every head outside each set mean-ablated. Each
    distinct set runs once (first occurrence order) and repeats copy its row, so equal sets give
    equal metrics bit for bit: a batched forward's last bits depend on the row's place in it."""
    flat = keeps.flatten(1)
    first: dict[bytes, int] = {}
    where = [first.setdefault(row.numpy().tobytes(), len(first)) for row in flat]
    distinct = torch.stack([flat[where.index(j)] for j in range(len(first))]).view(
        -1, *keeps.shape[1:]
    )
    return _distinct_metrics(model, batches, metric, means, distinct, n_pairs)[where]


def _distinct_metrics(model, batches, metric, means, keeps, n_pairs):
    n_sets = keeps.shape[0]
    out = torch.full((n_sets, n_pairs), torch.nan, dtype=torch.float64)
    for batch in batches:
        b = len(batch.index)

        def setup(chunk: list, b=b) -> dict:
            rows = keeps[chunk].repeat_interleave(b, 0)  # [s*b, layer, head]: True = kept
            return {
                "interventions": [
                    SetHeads(la, ~rows[:, la], means[la]) for la in range(model.n_layers)
                ]
            }

        for chunk, hidden in forwards(
            model, batch.clean, batch.mask, list(range(n_sets)), max(1, 256 // b), setup,
            output="hidden",
        ):  # fmt: skip
            s = len(chunk)
            out[chunk[0] : chunk[0] + s, batch.index] = (
                read_rows(model, metric, hidden, batch, s).double().cpu().view(s, b)
            )
    return out


def faithfulness(
    model,
    batches: Sequence[Batch],
    n_pairs: int,
    metric: str,
    heads: Sequence[Head],
    n_random: int = 100,
    pool: Sequence[Head] | None = None,
    reference: str = "corrupt",
    seed: int = 0,
    resamples: int = 1000,
    level: float = LEVEL,
) -> dict:
    """The set ``heads`` and ``n_random`` random sets of its size from ``pool`` (default every
    head), scored as the module docstring says. Returns ``{"faithfulness", "recovered",
    "empty"}`` (each ``(value, ci_low, ci_high)``; ``empty`` is F(empty) / F(M), every head
    ablated, resampled with the same pairs), ``"random_faithfulness"`` /
    ``"random_recovered"`` (one value per draw), ``"m_full"``, ``"m_none"``, ``"m_set"`` (per
    pair) and ``"random_sets"``."""
    L, H = model.n_layers, model.n_heads
    heads = sorted({(int(la), int(h)) for la, h in heads})
    pool = sorted(set(pool)) if pool is not None else [(la, h) for la in range(L) for h in range(H)]
    bad = [h for h in heads if not (0 <= h[0] < L and 0 <= h[1] < H)]
    if bad or not heads:
        raise HeadscopeError(
            f"A circuit is one or more heads of {model.name} (L0H0..L{L - 1}H{H - 1}); got "
            f"{', '.join(f'L{a}H{b}' for a, b in bad) or 'none'}."
        )
    if reference not in ("corrupt", "clean"):
        raise HeadscopeError(f"reference must be corrupt or clean, got '{reference}'.")
    if len(pool) < len(heads):
        raise HeadscopeError(f"The pool has {len(pool)} heads, fewer than the set's {len(heads)}.")
    rng = np.random.default_rng(seed)
    sets = [heads] + [
        sorted(pool[i] for i in rng.choice(len(pool), len(heads), replace=False))
        for _ in range(n_random)
    ]
    keeps = torch.zeros(len(sets) + 2, L, H, dtype=torch.bool)
    keeps[0] = True  # the full model
    for j, s in enumerate(sets):  # row 1: nothing kept; then the set and each random draw
        for la, h in s:
            keeps[j + 2, la, h] = True
    means = head_means(model, batches, reference)
    m = _metrics(model, batches, metric, means, keeps, n_pairs)  # [set, pair]
    full, none, rest = m[0], m[1], m[2:]
    w = _weights(n_pairs, resamples, seed)  # [resample, pair]

    def scores(x: Tensor) -> tuple[Tensor, Tensor]:  # x: [pair] -> (faith, recovered), and draws
        f = x.mean() / full.mean()
        r = (x.mean() - none.mean()) / (full.mean() - none.mean())
        return f, r

    f, r = scores(rest[0])
    out = {"m_full": full, "m_none": none, "m_set": rest[0], "random_sets": sets[1:]}
    if resamples:
        mf, mn, ms = w @ full, w @ none, w @ rest[0]
        for name, v, draws in (
            ("faithfulness", f, ms / mf),
            ("recovered", r, (ms - mn) / (mf - mn)),
            ("empty", none.mean() / full.mean(), mn / mf),
        ):
            lo, hi = torch.nanquantile(
                draws, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
            )
            out[name] = (float(v), float(lo), float(hi))
    else:
        out["faithfulness"], out["recovered"], out["empty"] = (
            (float(f), np.nan, np.nan),
            (float(r), np.nan, np.nan),
            (float(none.mean() / full.mean()), np.nan, np.nan),
        )
    rf, rr = zip(*(scores(x) for x in rest[1:]), strict=True) if n_random else ((), ())
    out["random_faithfulness"] = np.array([float(x) for x in rf])
    out["random_recovered"] = np.array([float(x) for x in rr])
    return out


def _weights(n: int, resamples: int, seed: int) -> Tensor:
    return draw_weights(n, resamples, seed) / n if resamples else torch.zeros(0, n)
