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
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from headscope.effects.patch_table import draw_weights
from headscope.effects.patching import Batch
from headscope.effects.readout import read_metric
from headscope.errors import HeadscopeError
from headscope.models.attention import AttentionCall
from headscope.uncertainty import LEVEL

Head = tuple[int, int]


@dataclass(frozen=True)
class KeepOnly:
    """Replace every head where ``keep[row, head]`` is False by ``means[head]`` (one layer)."""

    layer: int
    keep: Bool[Tensor, "row head"]
    means: Float[Tensor, "head dim"]

    def before(self, call: AttentionCall) -> AttentionCall:
        return call

    def after(self, call: AttentionCall, out: Tensor) -> Tensor:
        if call.layer != self.layer:
            return out
        keep = self.keep.to(out.device)[:, None, :, None]  # [row, 1, head, 1]
        means = self.means.to(device=out.device, dtype=out.dtype)[None, None]  # [1, 1, head, dim]
        return torch.where(keep, out, means)


def head_means(model, batches: Sequence[Batch], side: str) -> Float[Tensor, "layer head dim"]:
    """Each head's mean output over every real position of every prompt of ``side``."""
    sums: dict[int, Tensor] = {}
    count = 0.0
    for batch in batches:
        real = batch.mask.to(model.device)[:, :, None, None].double()  # [b, pos, 1, 1]

        def record(call: AttentionCall, real=real) -> Tensor:
            out = call.output()  # [b, pos, head, dim]
            s = (out.double() * real).sum((0, 1))
            sums[call.layer] = sums.get(call.layer, 0) + s
            return out

        model.run(batch.tokens(side), batch.mask, handler=record, output=None)
        count += float(batch.mask.sum())
    return torch.stack([sums[la] / count for la in range(model.n_layers)]).float()


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
        per = max(1, 256 // b)  # sets per forward
        for start in range(0, n_sets, per):
            k = keeps[start : start + per]  # [s, layer, head]
            s = len(k)
            rows = k.repeat_interleave(b, 0)  # [s*b, layer, head]
            interventions = [KeepOnly(la, rows[:, la], means[la]) for la in range(model.n_layers)]
            hidden = model.run(
                batch.clean.repeat(s, 1),
                batch.mask.repeat(s, 1),
                interventions=interventions,
                output="hidden",
            )
            with torch.no_grad():
                m, _ = read_metric(
                    model,
                    metric,
                    hidden,
                    batch.lengths.repeat(s),
                    batch.answer.repeat(s),
                    batch.wrong.repeat(s),
                )
            out[start : start + s, batch.index] = m.double().cpu().view(s, b)
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
