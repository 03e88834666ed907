"""Intervals and controls for the report notebooks: numbers that come with their spread, and
comparisons against a base rate that could have failed.

* :func:`pooled_interval`: the percentile interval of any statistic of a scan's per-head scores
  (the mean over heads, the share of heads above a threshold, ...) by resampling *sequences*, the
  unit that was sampled, from the per-sequence sums a scan keeps (``ScanResult.per_sequence``).
* :func:`layer_intervals`: the same interval for every layer's mean over its heads, for several
  scores at once (the per-layer curves of Clark et al.).
* :func:`joint_interval`: the same for a statistic of several scores measured on the same
  sequences, resampled together (a census run's ``noop_sequences.csv``, read by
  :func:`sequence_sums`).
* :func:`proportion_interval`: a Wilson interval for ``k`` hits out of ``n`` (needles, seeds).
* :func:`random_groups`: many distinct random head groups of one size from a pool, seeded.
* :func:`group_effects`: the change in a loss target when each of several head groups is ablated
  together (mean, zero or resample ablation), per sequence, so each change gets a bootstrap
  interval (:func:`change_interval`) and can be set against the distribution of size-matched
  random groups (:func:`against`).
* :func:`resample_values`: what resample ablation puts in a head's place: its output on another
  sequence of the same batch (the next one, cyclically), upstream of it clean.
* :func:`diff_correlation`: the correlation of two curves' step-to-step changes, with a null from
  circular shifts of one of them: two monotone curves correlate near -1 or +1 whether or not they
  are linked, their changes only if they move together.
* :func:`with_first_token` and :func:`with_token_at`: sink controls (a random first token; BOS at a
  later position).

>>> round(proportion_interval(0, 10)[1], 3)   # no hit in 10 still allows up to ~28%
0.278
>>> [len(g) for g in random_groups([(0, h) for h in range(6)], 2, 3, seed=0)]
[2, 2, 2]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headscope.errors import HeadscopeError

Head = tuple[int, int]

RESAMPLES, LEVEL = 1000, 0.95


# ------------------------------------------------------------------------------ intervals


def _draws(n: int, resamples: int, seed: int) -> Tensor:
    """``[resample, sequence]``: how many times each sequence is drawn in each resample."""
    gen = torch.Generator().manual_seed(int(seed))
    idx = torch.randint(n, (resamples, n), generator=gen)
    return torch.zeros(resamples, n, dtype=torch.float64).scatter_add_(
        1, idx, torch.ones(resamples, n, dtype=torch.float64)
    )


def pooled_interval(
    total,
    count,
    statistic: Callable[[np.ndarray], float],
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(value, low, high)`` of ``statistic(scores [layer, head])`` for pooled per-head scores
    ``sum_s total[s] / sum_s count[s]``, with the percentile interval from resampling sequences.

    ``total``: ``[sequence, layer, head]``; ``count``: ``[sequence]`` (a scan's ``per_sequence``
    entry).

    >>> t = np.array([[[0.2, 0.8]], [[0.4, 0.6]]]); c = np.array([1.0, 1.0])
    >>> v, lo, hi = pooled_interval(t, c, lambda s: float(s.mean()))
    >>> round(v, 3), lo <= v <= hi
    (0.5, True)
    """
    return joint_interval(
        {"x": (total, count)}, lambda s: statistic(s["x"]), resamples, level, seed
    )


def joint_interval(
    parts: Mapping[str, tuple],
    statistic: Callable[[Mapping[str, np.ndarray]], float],
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> tuple[float, float, float]:
    """:func:`pooled_interval` of a statistic of several pooled scores measured on the same
    sequences (``parts``: name -> ``(total [sequence, layer, head], count [sequence])``), each
    resample drawing the same sequences for all of them: e.g. the median over heads of one
    effect's size over another's. ``statistic`` gets ``{name: scores [layer, head]}``.

    >>> t = np.array([[[1.0, 2.0]], [[3.0, 2.0]]]); c = np.ones(2)
    >>> v, lo, hi = joint_interval({"a": (t, c), "b": (2 * t, c)},
    ...                            lambda s: float(np.median(s["b"] / s["a"])))
    >>> (v, lo, hi)
    (2.0, 2.0, 2.0)
    """
    tensors = {}
    for name, (total, count) in parts.items():
        t = torch.as_tensor(np.asarray(total), dtype=torch.float64)
        c = torch.as_tensor(np.asarray(count), dtype=torch.float64)
        tensors[name] = (t, c)
    sizes = {t.shape[0] for t, _ in tensors.values()}
    if len(sizes) != 1:
        raise HeadscopeError(
            f"Each part must be measured on the same sequences; got {sorted(sizes)} sequences."
        )
    n = sizes.pop()
    value = statistic({k: (t.sum(0) / c.sum()).numpy() for k, (t, c) in tensors.items()})
    w = _draws(n, resamples, seed)  # [resample, sequence]
    pooled = {  # name -> [resample, layer, head]
        k: ((w @ t.reshape(n, -1)) / (w @ c)[:, None]).reshape(resamples, *t.shape[1:]).numpy()
        for k, (t, c) in tensors.items()
    }
    stats = np.array([statistic({k: p[i] for k, p in pooled.items()}) for i in range(resamples)])
    a = (1 - level) / 2
    return float(value), float(np.nanquantile(stats, a)), float(np.nanquantile(stats, 1 - a))


def sequence_sums(table: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``(total [sequence, layer, head], count [sequence])`` of one metric of a census run's
    ``noop_sequences.csv`` (``load_census(dir)["noop_sequences"]``), for :func:`joint_interval`."""
    have = sorted(set(table["metric"]))
    if metric not in have:
        raise HeadscopeError(
            f"noop_sequences.csv has no rows for '{metric}'; it has {', '.join(have) or 'none'}."
        )
    t = table[table["metric"] == metric]
    n, n_layers, n_heads = (int(t[c].max()) + 1 for c in ("sequence", "layer", "head"))
    total = np.full((n, n_layers, n_heads), np.nan)
    total[t["sequence"], t["layer"], t["head"]] = t["total"]
    count = t.groupby("sequence")["count"].first().reindex(range(n)).to_numpy(float)
    return total, count


def scan_interval(
    result, score: str, statistic: Callable[[np.ndarray], float], **kw
) -> tuple[float, float, float]:
    """:func:`pooled_interval` of one score of a :class:`~headscope.result.ScanResult` (scanned
    with its bootstrap on, which keeps the per-sequence sums)."""
    if score not in result.per_sequence:
        raise HeadscopeError(
            f"The scan kept no per-sequence sums for '{score}'; scan with bootstrap on "
            f"(kept: {', '.join(result.per_sequence) or 'none'})."
        )
    ps = result.per_sequence[score]
    return pooled_interval(ps["total"], ps["count"], statistic, **kw)


def layer_intervals(
    result,
    scores: Sequence[str],
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> pd.DataFrame:
    """Per (score, layer): the mean of the layer's per-head scores with its percentile interval
    from resampling sequences, for a :class:`~headscope.result.ScanResult` scanned with its
    bootstrap on. Columns ``model, metric, layer, mean, ci_low, ci_high, resamples, level``.

    Each row is :func:`scan_interval` of ``nanmean(scores[layer])`` with the same draws (same
    ``seed``), computed for all layers in one pass; NaN heads are left out of a layer's mean.
    """
    rows = []
    for score in scores:
        if score not in result.per_sequence:
            raise HeadscopeError(
                f"The scan kept no per-sequence sums for '{score}'; scan with bootstrap on "
                f"(kept: {', '.join(result.per_sequence) or 'none'})."
            )
        ps = result.per_sequence[score]
        total = torch.as_tensor(np.asarray(ps["total"]), dtype=torch.float64)
        count = torch.as_tensor(np.asarray(ps["count"]), dtype=torch.float64)
        n, n_layers, n_heads = total.shape
        point = np.nanmean((total.sum(0) / count.sum()).numpy(), axis=1)  # [layer]
        w = _draws(n, resamples, seed)
        pooled = (w @ total.reshape(n, -1)) / (w @ count)[:, None]
        per_layer = np.nanmean(pooled.reshape(resamples, n_layers, n_heads).numpy(), axis=2)
        a = (1 - level) / 2
        lo, hi = np.nanquantile(per_layer, a, axis=0), np.nanquantile(per_layer, 1 - a, axis=0)
        for layer in range(n_layers):
            rows.append(
                {
                    "model": result.model_name,
                    "metric": score,
                    "layer": layer,
                    "mean": float(point[layer]),
                    "ci_low": float(lo[layer]),
                    "ci_high": float(hi[layer]),
                    "resamples": resamples,
                    "level": level,
                }
            )
    return pd.DataFrame(rows)


def proportion_interval(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes out of ``n`` (``n >= 1``): kvplan's
    :func:`~headscope.uncertainty.wilson` at the ``level``'s normal quantile."""
    if n < 1 or not 0 <= k <= n:
        raise HeadscopeError(f"proportion_interval needs 0 <= k <= n and n >= 1, got k={k}, n={n}.")
    from statistics import NormalDist

    from headscope.uncertainty import wilson

    return wilson(k, n, z=NormalDist().inv_cdf(1 - (1 - level) / 2))


#: Student's t, 97.5th percentile, by degrees of freedom (1..30): a 95% interval of a mean of few
# values.
_T975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: the 95% Student-t interval of the mean of a few values (2..31), e.g.
    one number per training seed.

    >>> [round(v, 2) for v in t_interval([270, 280, 280])]
    [276.67, 262.32, 291.01]
    """
    v = np.asarray(values, dtype=float)
    if not 2 <= len(v) <= len(_T975) + 1:
        raise HeadscopeError(f"t_interval takes 2..{len(_T975) + 1} values, got {len(v)}.")
    half = _T975[len(v) - 2] * v.std(ddof=1) / math.sqrt(len(v))
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def change_interval(
    sums: Tensor, counts: Tensor, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
) -> tuple[float, float, float]:
    """``(pooled change, low, high)`` from per-sequence change sums and target counts."""
    s = torch.as_tensor(sums, dtype=torch.float64)
    c = torch.as_tensor(counts, dtype=torch.float64)
    w = _draws(len(s), resamples, seed)
    boot = ((w @ s) / (w @ c)).numpy()
    a = (1 - level) / 2
    return float(s.sum() / c.sum()), float(np.quantile(boot, a)), float(np.quantile(boot, 1 - a))


# ------------------------------------------------------------------------------ random head groups


def random_groups(pool: Sequence[Head], size: int, n: int, seed: int = 0) -> list[tuple[Head, ...]]:
    """``n`` distinct groups of ``size`` heads drawn without replacement from ``pool`` (seeded),
    each sorted; fewer when the pool has fewer distinct groups."""
    pool = sorted(set(pool))
    if not 1 <= size <= len(pool):
        raise HeadscopeError(f"random_groups: size must be 1..{len(pool)} (the pool), got {size}.")
    n_max = math.comb(len(pool), size)
    rng = np.random.default_rng(seed)
    seen: set[tuple[Head, ...]] = set()
    out = []
    while len(out) < min(n, n_max):
        g = tuple(sorted(pool[i] for i in rng.choice(len(pool), size, replace=False)))
        if g not in seen:
            seen.add(g)
            out.append(g)
    return out


def against(value: float, random: Sequence[float]) -> dict:
    """Where ``value`` falls in a distribution of random-group effects: the share of random groups
    whose effect is at least as large (the base rate of doing so by chance), and the distribution's
    median, 95th percentile and maximum."""
    r = np.asarray(random, dtype=float)
    return {
        "n_random": len(r),
        "share_random_ge": float((r >= value).mean()),
        "random_median": float(np.median(r)),
        "random_p95": float(np.quantile(r, 0.95)),
        "random_max": float(r.max()),
    }


# ------------------------------------------------------------------------------ group ablation


def group_effects(
    model,
    probe,
    groups: Mapping[str, Sequence[Head]],
    ablation: str = "mean",
    means: Tensor | None = None,
    batch_size: int = 8,
    target: str = "repeat_loss",
) -> dict[str, tuple[Tensor, Tensor]]:
    """``{name: (change sums [sequence], target counts [sequence])}``: the change in ``target``
    (``repeat_loss`` or ``text_loss``, nats) when each group's heads are ablated *together*.

    ``ablation``: ``"mean"`` (each head's mean output over the probe, ``means`` from
    :func:`headscope.effects.ablation.head_means`), ``"zero"``, or ``"resample"`` (each head's
    output on another sequence of the same batch: needs sequences of one length). Each batch runs
    clean once, keeping every block's output; an ablated forward resumes at the group's first layer.
    """
    from headscope.effects.loop import batches, forwards
    from headscope.effects.targets import TARGETS, logits_from, measure
    from headscope.models.attention import SetHeads

    if ablation not in ("mean", "zero", "resample"):
        raise HeadscopeError(f"ablation must be 'mean', 'zero' or 'resample', got '{ablation}'.")
    if ablation == "mean" and means is None:
        raise HeadscopeError(
            "Mean ablation needs the heads' means (headscope.effects.ablation.head_means)."
        )
    if ablation == "resample" and len({len(s) for s in probe.sequences}) != 1:
        raise HeadscopeError(
            "Resample ablation swaps outputs between sequences of one length; this probe has "
            "several."
        )
    tgt = TARGETS[target]
    n = len(probe)
    sums = {
        k: (torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64))
        for k in groups
    }
    for tokens, mask, lengths, index in batches(model, probe, batch_size, with_index=True):
        if ablation == "resample" and len(tokens) < 2:
            raise HeadscopeError("Resample ablation needs at least 2 sequences per batch.")
        first = logits_from(tgt, tokens, probe.repeat_len)
        kept: dict[int, Tensor] = {}
        outputs: dict[int, Tensor] = {}

        def record(call, outputs=outputs):
            out = call.output()
            outputs[call.layer] = out.detach()
            return out

        out = model.run(
            tokens,
            mask,
            handler=record if ablation == "resample" else None,
            output="logits",
            keep_blocks=kept,
            logits_from=first,
        )
        s0, c0 = measure(tgt, out, tokens, lengths, probe.repeat_len)
        for name, heads in groups.items():
            heads = sorted(set(heads))
            if not heads:
                continue
            layers = sorted({la for la, _ in heads})
            ablate = []
            for la in layers:
                hs = [h for layer, h in heads if layer == la]
                # resample: each head's output on the next sequence of the batch (cyclically)
                value = {"mean": means[la] if means is not None else None, "zero": 0.0}.get(
                    ablation
                )
                value = outputs[la].roll(1, dims=0) if ablation == "resample" else value
                ablate.append(SetHeads(la, hs, value))

            def setup(_chunk, ablate=ablate):
                return {"interventions": ablate}

            ((_, abl),) = forwards(
                model, tokens, mask, [name], 1, setup,
                layer=layers[0], kept=kept, output="logits", logits_from=first,
            )  # fmt: skip
            s1, _ = measure(tgt, abl, tokens, lengths, probe.repeat_len)
            sums[name][0][index] += (s1 - s0).double().cpu()
            sums[name][1][index] += c0.double().cpu()
    return sums


def effects_table(sums: Mapping[str, tuple[Tensor, Tensor]], seed: int = 0) -> pd.DataFrame:
    """One row per group: pooled change (nats) and its 95% bootstrap interval over sequences."""
    rows = []
    for name, (s, c) in sums.items():
        v, lo, hi = change_interval(s, c, seed=seed) if float(c.sum()) > 0 else (0.0, 0.0, 0.0)
        rows.append(
            {"ablated": name, "change": v, "ci_low": lo, "ci_high": hi, "sequences": len(s)}
        )
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ curves


def diff_correlation(a: Sequence[float], b: Sequence[float], seed: int = 0) -> dict:
    """Correlation of two curves (over the same steps) and of their step-to-step changes, with the
    share of circular shifts of ``b``'s changes whose correlation with ``a``'s is at least as strong
    (same sign, as large): a base rate for the changes moving together by chance."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or len(a) < 4:
        raise HeadscopeError("diff_correlation needs two curves of one length, at least 4 points.")
    da, db = np.diff(a), np.diff(b)
    r_level = float(np.corrcoef(a, b)[0, 1])
    r_diff = float(np.corrcoef(da, db)[0, 1])
    shifts = [float(np.corrcoef(da, np.roll(db, k))[0, 1]) for k in range(1, len(db))]
    sign = 1.0 if r_diff >= 0 else -1.0
    share = float(np.mean([sign * s >= sign * r_diff for s in shifts]))
    return {
        "corr_levels": r_level,
        "corr_changes": r_diff,
        "shifts": len(shifts),
        "share_shifts_as_strong": share,
        "strongest_shift": float(max(shifts, key=lambda s: sign * s)),
    }


# ------------------------------------------------------------------------------ sink controls


def with_first_token(probe, tokens: Sequence[int]):
    """A copy of ``probe`` whose position 0 holds ``tokens[i]`` in sequence ``i`` (e.g. random
    ordinary tokens in place of BOS)."""
    from headscope.probes.pairs import Probe

    if len(tokens) != len(probe):
        raise HeadscopeError(f"with_first_token: {len(tokens)} tokens for {len(probe)} sequences.")
    return Probe(
        probe.name,
        [[int(t), *s[1:]] for t, s in zip(tokens, probe.sequences, strict=True)],
        settings={**probe.settings, "first_token": "replaced"},
    )


def with_token_at(probe, token: int, position: int, drop_first: bool = False):
    """A copy of ``probe`` with ``token`` inserted at ``position`` of every sequence (after dropping
    position 0 first when ``drop_first``): e.g. BOS in the middle of a prompt."""
    from headscope.probes.pairs import Probe

    seqs = [list(s[1:]) if drop_first else list(s) for s in probe.sequences]
    if any(len(s) <= position for s in seqs):
        raise HeadscopeError(f"with_token_at: every sequence needs more than {position} tokens.")
    return Probe(
        probe.name,
        [s[:position] + [int(token)] + s[position:] for s in seqs],
        settings={**probe.settings, "inserted": {"token": int(token), "position": position}},
    )


def random_ordinary_tokens(model, n: int, seed: int = 0) -> list[int]:
    """``n`` ordinary vocabulary ids drawn at random (seeded), with replacement."""
    vocab = model.ordinary_vocab()
    gen = torch.Generator().manual_seed(int(seed))
    return vocab[torch.randint(len(vocab), (n,), generator=gen)].tolist()


def group_ablation_study(
    model,
    probe,
    named: Mapping[str, Sequence[Head]],
    pool: Sequence[Head],
    n_random: int = 100,
    seed: int = 0,
    ablations: Sequence[str] = ("mean", "zero", "resample"),
    means: Tensor | None = None,
    batch_size: int = 8,
    target: str = "repeat_loss",
    random_for: Sequence[str] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Named head groups ablated together, each beside ``n_random`` size-matched random groups
    drawn from ``pool`` (mean ablation), and with every ablation in ``ablations``.

    Returns ``(table, random)``: ``table`` has one row per (group, ablation) with the pooled
    change, its 95% bootstrap interval over the probe's sequences and, for mean ablation, where it
    falls among the random groups of its size (:func:`against`); ``random`` one row per random
    group (size, heads, change). ``random_for``: the named groups whose sizes get random groups
    (default: every one)."""
    from headscope.effects.ablation import head_means

    if "mean" in ablations and means is None:
        means = head_means(model, probe, batch_size)
    sizes = sorted(
        {len(set(h)) for k, h in named.items() if h and (random_for is None or k in random_for)}
    )
    random_sets = {k: random_groups(pool, k, n_random, seed=seed + k) for k in sizes}
    rand = {f"random {k} #{i}": g for k, gs in random_sets.items() for i, g in enumerate(gs)}
    rand_sums = group_effects(model, probe, rand, "mean", means, batch_size, target) if rand else {}
    random_rows = [
        {
            "size": len(g),
            "heads": ", ".join(f"L{a}H{b}" for a, b in g),
            "change": float(rand_sums[k][0].sum() / rand_sums[k][1].sum()),
        }
        for k, g in rand.items()
    ]
    random = pd.DataFrame(random_rows, columns=["size", "heads", "change"])
    rows = []
    for ablation in ablations:
        sums = group_effects(model, probe, named, ablation, means, batch_size, target)
        for name, heads in named.items():
            s, c = sums[name]
            v, lo, hi = change_interval(s, c, seed=seed) if float(c.sum()) > 0 else (0.0, 0.0, 0.0)
            row = {
                "group": name,
                "heads": len(set(heads)),
                "ablation": ablation,
                "change": v,
                "ci_low": lo,
                "ci_high": hi,
            }
            if ablation == "mean" and heads:
                dist = random[random["size"] == len(set(heads))]["change"]
                row.update(against(v, dist) if len(dist) else {})
            rows.append(row)
    return pd.DataFrame(rows), random


# ------------------------------------------------------------------------------ composition


class PatchInputs:
    """Replace one layer's attention inputs (query, key and/or value, after rotary) by stored
    tensors of the same shape, e.g. those of another run: path patching into one layer."""

    def __init__(
        self,
        layer: int,
        query: Tensor | None = None,
        key: Tensor | None = None,
        value: Tensor | None = None,
    ):
        self.layer, self.query, self.key, self.value = layer, query, key, value

    def before(self, call):
        from dataclasses import replace

        if call.layer != self.layer:
            return call
        new = {
            name: getattr(self, name).to(getattr(call, name))
            for name in ("query", "key", "value")
            if getattr(self, name) is not None
        }
        return replace(call, **new)

    def after(self, call, out):
        return out


def attention_inputs_of(
    model, tokens: Tensor, layers: Sequence[int], interventions: Sequence = ()
) -> dict[int, dict[str, Tensor]]:
    """``{layer: {"query", "key", "value"}}`` of one forward of ``tokens`` (with ``interventions``),
    as the attention call saw them (after rotary and after the interventions' ``before``)."""
    from headscope.models.attention import StopForward

    wanted, seen = set(layers), {}

    def record(call):
        if call.layer in wanted:
            seen[call.layer] = {
                "query": call.query.detach().clone(),
                "key": call.key.detach().clone(),
                "value": call.value.detach().clone(),
            }
        out = call.output()
        if len(seen) == len(wanted):
            raise StopForward
        return out

    try:
        model.run(tokens, handler=record, interventions=interventions)
    except StopForward:  # pragma: no cover - model.run catches it
        pass
    return seen


def induction_scores(
    model, probe, layers: Sequence[int], interventions: Sequence = ()
) -> np.ndarray:
    """``[len(layers), head]`` induction scores (mean ``A[q, q-L+1]`` over second-copy queries
    ``L+1..2L``) of ``layers`` on a repeat probe, computed from each call's own query, key and mask
    (so any intervention's ``before`` counts), in one batch."""
    from headscope.models.attention import StopForward

    if probe.repeat_len is None or len({len(s) for s in probe.sequences}) != 1:
        raise HeadscopeError("induction_scores needs a repeat probe of one length (BOS + R + R).")
    L = int(probe.repeat_len)
    tokens = torch.tensor(probe.sequences)
    order, found = list(layers), {}
    q_idx = torch.arange(L + 1, 2 * L + 1)

    def score(call):
        out = call.output()
        if call.layer in order:
            k = call.key.repeat_interleave(call.group, dim=1)  # [batch, head, key, dim]
            s = (
                call.query.float() @ k.float().transpose(-1, -2)
            ) * call.scale  # [batch, head, query, key]
            s = s.masked_fill(~call.full_mask().expand_as(s), float("-inf"))
            a = s.softmax(-1)
            found[call.layer] = a[:, :, q_idx, q_idx - L + 1].mean((0, 2)).double().cpu().numpy()
        if len(found) == len(order):
            raise StopForward
        return out

    model.run(tokens, handler=score, interventions=interventions)
    return np.stack([found[la] for la in order])


def composition(model, probe, head: Head, value: Tensor, layers: Sequence[int]) -> pd.DataFrame:
    """How ablating ``head`` (its output replaced by ``value``) reaches the heads of ``layers``:
    their induction scores, and the second-copy loss, when the ablation reaches everything
    (``all``), or only the keys, only the queries or only the values of ``layers`` (path patching:
    those inputs are taken from the ablated run, everything else stays clean). One row per
    (condition, layer, head) plus the condition's loss."""
    from headscope.effects.targets import TARGETS, measure
    from headscope.models.attention import ReplaceHeadOutput

    tokens = torch.tensor(probe.sequences)
    lengths = torch.tensor([len(s) for s in probe.sequences])
    ablate = [ReplaceHeadOutput(head[0], head[1], value)]
    ablated = attention_inputs_of(model, tokens, layers, ablate)
    conditions = {"clean": [], "all (head ablated)": ablate}
    for part, plural in (("key", "keys"), ("query", "queries"), ("value", "values")):
        conditions[f"{plural} of layers {layers[0]}-{layers[-1]} only"] = [
            PatchInputs(la, **{part: ablated[la][part]}) for la in layers
        ]
    rows = []
    tgt = TARGETS["repeat_loss"]
    for name, ivs in conditions.items():
        scores = induction_scores(model, probe, layers, ivs)
        out = model.run(
            tokens, interventions=ivs, output="logits", logits_from=probe.repeat_len + 1
        )
        s, c = measure(tgt, out, tokens, lengths, probe.repeat_len)
        loss = float(s.sum() / c.sum())
        for i, la in enumerate(layers):
            for h in range(scores.shape[1]):
                rows.append(
                    {
                        "condition": name,
                        "layer": la,
                        "head": h,
                        "head_name": f"L{la}H{h}",
                        "induction": float(scores[i, h]),
                        "second_copy_loss": loss,
                    }
                )
    return pd.DataFrame(rows)
