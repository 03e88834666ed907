"""Random whole-KV-group baselines of a KV plan (notebook 06): every way of dropping a plan's
number of KV groups when there are few (:func:`every_kv_group_set`, :func:`kv_group_losses`), a
sample of them when there are many (:func:`random_kv_losses`), and where the plan falls among them
(:func:`rank_in`). ``headscope kvplan`` itself measures three seeded random-KV draws
(:mod:`headscope.apps.kvplan`); these ask the same question of a whole distribution.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import pandas as pd

from headscope.apps.kvplan import (
    HeadSet,
    Restricted,
    kv_saving,
    random_kv_groups,
    text_losses,
)
from headscope.errors import HeadscopeError


def every_kv_group_set(
    n_layers: int, n_heads: int, n_kv_heads: int, count: int, limit: int = 1000
) -> list[HeadSet]:
    """Every way of choosing ``count`` whole KV groups of the ``n_layers * n_kv_heads`` (in
    lexicographic order of the KV heads): the exact distribution a plan with that memory saving
    can be ranked in, when there are few enough ways (at most ``limit``) to run them all. A model
    with one KV head per layer (Gemma 3 270M: 18) has only 18 ways to drop one.

    >>> [sorted(s) for s in every_kv_group_set(2, 2, 1, 1)]  # two layers, one KV head each
    [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]
    """
    total = n_layers * n_kv_heads
    if not 0 <= count <= total:
        raise HeadscopeError(f"Cannot choose {count} KV groups from {total}; use 0..{total}.")
    ways = math.comb(total, count)
    if ways > limit:
        raise HeadscopeError(
            f"{ways} ways to choose {count} of {total} KV groups is more than limit={limit}; "
            "draw a sample with random_kv_losses instead, or raise the limit."
        )
    group = n_heads // n_kv_heads
    return [
        HeadSet(
            (i // n_kv_heads, (i % n_kv_heads) * group + j) for i in chosen for j in range(group)
        )
        for chosen in itertools.combinations(range(total), count)
    ]


def kv_group_losses(
    model,
    texts: Sequence[Sequence[int]],
    sets: Sequence[HeadSet],
    sinks: int,
    window: int,
    base_sums: Sequence[float],
    say: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """The loss change of restricting each head set of ``sets`` to ``sinks`` + ``window``,
    measured as :func:`kv_plan` measures it: ``loss = sum_t s_t / sum_t n_t`` and ``loss_delta =
    loss - L_base`` with ``L_base`` from ``base_sums`` (the full-attention per-text sums on the
    same ``texts``). One row per set: ``set`` (its index), ``heads_restricted``,
    ``kv_heads_dropped``, ``loss``, ``loss_delta``; the per-text sums in
    ``df.attrs["text_sums"]``."""
    if not sets:
        raise HeadscopeError("Give at least one head set to measure.")
    if len(base_sums) != len(texts):
        raise HeadscopeError(
            f"base_sums has {len(base_sums)} per-text sums for {len(texts)} texts; pass the "
            "full-attention sums of these texts (text_losses(model, texts, None))."
        )
    base = 0.0
    rows, all_sums = [], []
    for k, heads in enumerate(sets):
        handler = Restricted(heads, model.n_heads, sinks, window) if heads else None
        sums, counts = text_losses(model, texts, handler)
        if k == 0:
            for v in base_sums:  # the order kv_plan sums its full row in
                base += v
            base /= sum(counts)
        loss = 0.0
        for v in sums:
            loss += v
        loss /= sum(counts)
        all_sums.append(sums)
        dropped = kv_saving(
            heads, model.n_layers, model.n_heads, model.n_kv_heads, model.d_head, 1, 0
        )["kv_heads_dropped"]
        rows.append(
            {
                "set": k,
                "heads_restricted": len(heads),
                "kv_heads_dropped": dropped,
                "loss": loss,
                "loss_delta": loss - base,
            }
        )
        if say and ((k + 1) % 10 == 0 or k + 1 == len(sets)):
            say(f"KV group sets: {k + 1}/{len(sets)} measured")
    df = pd.DataFrame(rows)
    df.attrs["text_sums"] = all_sums
    return df


def random_kv_losses(
    model,
    texts: Sequence[Sequence[int]],
    dropped: int,
    draws: int,
    sinks: int,
    window: int,
    base_sums: Sequence[float],
    first_seed: int = 0,
    say: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """The loss change of ``draws`` random whole-KV-group restrictions (seeds ``first_seed``,
    ``first_seed + 1``, ...), each restricting every query head of ``dropped`` KV heads drawn by
    :func:`random_kv_groups` to ``sinks`` + ``window``: the distribution a plan with the same
    memory saving is ranked in (:func:`rank_in`). Loss only (no needles), measured by
    :func:`kv_group_losses`, so seed ``s`` here is the row ``random_kv`` seed ``s`` of
    :func:`kv_plan`. One row per draw: ``seed``, ``heads_restricted``, ``kv_heads_dropped``,
    ``loss``, ``loss_delta``; the per-text sums in ``df.attrs["text_sums"]``."""
    if draws < 1:
        raise HeadscopeError(f"Draw at least one random KV group set, got draws={draws}.")
    seeds = range(first_seed, first_seed + draws)
    sets = [
        random_kv_groups(model.n_layers, model.n_heads, model.n_kv_heads, dropped, seed)
        for seed in seeds
    ]
    tell = None
    if say:
        tell = lambda m: say(  # noqa: E731
            m.replace("KV group sets", f"random KV groups ({dropped} KV heads)").replace(
                "measured", "draws"
            )
        )
    df = kv_group_losses(model, texts, sets, sinks, window, base_sums, tell)
    df = df.drop(columns="set")
    df.insert(0, "seed", list(seeds))
    return df


def rank_in(draws: Sequence[float], value: float, exhaustive: bool = False) -> dict:
    """Where ``value`` (a plan's loss change) falls among random ``draws`` of it: how many draws
    are at or below it (``at_or_below``, of ``n``), and the one-sided permutation p-value
    ``(1 + at_or_below) / (1 + n)`` (the chance that a random draw does as well as ``value`` when
    ``value`` is itself one more random draw; small means the plan costs less than chance does).
    With ``exhaustive`` the draws are every possible set (:func:`every_kv_group_set`), so the
    share ``at_or_below / n`` is the exact chance, not an estimate, and ``p`` is that share.

    >>> rank_in([0.1, 0.2, 0.3], 0.15)
    {'at_or_below': 1, 'n': 3, 'p': 0.5}
    >>> rank_in([0.1, 0.2, 0.3], 0.15, exhaustive=True)["p"]
    0.3333333333333333
    """
    vals = [float(v) for v in draws]
    if not vals:
        raise HeadscopeError("rank_in needs at least one random draw.")
    k = sum(v <= value for v in vals)
    p = k / len(vals) if exhaustive else (1 + k) / (1 + len(vals))
    return {"at_or_below": int(k), "n": len(vals), "p": p}
