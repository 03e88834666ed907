"""QK attribution over prompts (:mod:`headscope.circuits.qk_attribution`): each head's tables summed
per prompt, their means with percentile bootstrap intervals over prompts, the top pairs beside
their nulls, the knock-outs and the subspaces summarised the same way (docs/qk.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from headscope.circuits.qk_attribution import (
    Instances,
    QKRecord,
    knockouts,
    subspaces,
    table,
    tables,
)
from headscope.errors import HeadscopeError


def over_prompts(
    x: Tensor, resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """``x`` ``[prompt, m]`` (NaN: missing) -> the mean over prompts and its percentile bootstrap
    interval (``[m]`` each; NaN intervals when ``resamples`` is 0)."""
    from headscope.uncertainty import draw_weights

    ok = ~torch.isnan(x)
    m = torch.nansum(x, 0) / ok.sum(0).clamp(min=1)
    if not resamples:
        nan = torch.full_like(m, torch.nan)
        return m, nan, nan
    w = draw_weights(x.shape[0], resamples, seed)
    hits = w @ ok.double()
    boot = (w @ torch.nan_to_num(x)) / hits.clamp(min=1e-12)
    boot[hits == 0] = torch.nan
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.nanquantile(boot, q, dim=0)
    return m, lo, hi


@dataclass
class HeadTables:
    """One head's tables summed per prompt: ``sums[p]`` the table summed over prompt ``p``'s
    instances (``counts[p]`` of them), ``null_sums``/``null_counts`` at their null keys; ``logit``
    and ``attn``: per prompt, the mean logit and attention on the chosen keys."""

    components: list[str]
    sums: Tensor
    counts: Tensor
    null_sums: Tensor
    null_counts: Tensor
    logit: Tensor
    attn: Tensor


def head_tables(
    rec: QKRecord, layer: int, head: int, inst: Instances, prompts: Tensor, n_prompts: int,
    chunk: int = 64,
) -> HeadTables:  # fmt: skip
    """Sum head ``(layer, head)``'s tables per prompt (``prompts[row]``: the prompt of each of
    ``rec``'s rows, ``n_prompts`` in all), in chunks of ``chunk`` instances."""
    a = rec.graph.writers_before_attn(layer) + 1
    sums = torch.zeros(n_prompts, a, a, dtype=torch.float64)
    null_sums = torch.zeros_like(sums)
    counts = torch.zeros(n_prompts, dtype=torch.float64)
    null_counts = torch.zeros_like(counts)
    logit = torch.zeros(n_prompts, dtype=torch.float64)
    attn = torch.zeros(n_prompts, dtype=torch.float64)
    pat = rec.head_pattern(layer, head)
    for s in range(0, len(inst), chunk):
        r, i = inst.rows[s : s + chunk], inst.query[s : s + chunk]
        j, nj = inst.key[s : s + chunk], inst.null[s : s + chunk]
        p = prompts[r]
        ok = nj >= 0
        c, cn = tables(rec, layer, head, r, i, [j, nj.clamp(min=0)])  # a missing null: dropped
        sums.index_add_(0, p, c)
        counts.index_add_(0, p, torch.ones(len(r), dtype=torch.float64))
        logit.index_add_(0, p, c.sum((1, 2)))
        attn.index_add_(0, p, pat[r, i, j])
        if ok.any():
            null_sums.index_add_(0, p[ok], cn[ok])
            null_counts.index_add_(0, p[ok], torch.ones(int(ok.sum()), dtype=torch.float64))
    return HeadTables(rec.components(layer), sums, counts, null_sums, null_counts, logit, attn)


def merge(tables: list[HeadTables]) -> HeadTables:
    """The tables of one head from several records (prompts of other lengths) added up."""
    first = tables[0]
    add = lambda name: sum(getattr(t, name) for t in tables)  # noqa: E731
    return HeadTables(
        first.components,
        *(add(n) for n in ("sums", "counts", "null_sums", "null_counts", "logit", "attn")),
    )


def summarise(
    t: HeadTables, top: int = 20, resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> dict:
    """One head's results over prompts: ``table`` (the mean table, ``[component, component]``),
    ``pairs`` (the ``top`` pairs by ``|contribution|``: each with its interval over prompts, its
    null at the null keys and the difference, each with an interval), ``query_side`` and
    ``key_side`` (each component's total on its side: a row or column sum; per prompt, and per
    prompt at the null keys, in ``per_prompt_sides``), ``logit`` and ``attn`` (each ``(mean,
    low, high)``), ``n_prompts``, ``n_instances``."""
    used = t.counts > 0
    n = int(used.sum())
    if not n:
        raise HeadscopeError("No prompt has an instance of this query and key rule.")
    per = t.sums[used] / t.counts[used, None, None]  # [prompt, a, b]: each prompt's mean
    has_null = t.null_counts[used] > 0
    null = torch.full_like(per, torch.nan)
    null[has_null] = t.null_sums[used][has_null] / t.null_counts[used][has_null, None, None]
    mean = per.mean(0)

    def stat(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return over_prompts(x, resamples, level, seed)

    order = mean.reshape(-1).abs().argsort(descending=True)[:top]
    a_idx, b_idx = order // mean.shape[1], order % mean.shape[1]
    flat = per.reshape(n, -1)[:, order]
    nflat = null.reshape(n, -1)[:, order]
    c, c_lo, c_hi = stat(flat)
    nu, nu_lo, nu_hi = stat(nflat)
    d, d_lo, d_hi = stat(flat - nflat)
    names = t.components
    pairs = [
        {
            "query_component": names[a],
            "key_component": names[b],
            "contribution": float(c[k]),
            "ci_low": float(c_lo[k]),
            "ci_high": float(c_hi[k]),
            "null": float(nu[k]),
            "null_low": float(nu_lo[k]),
            "null_high": float(nu_hi[k]),
            "above_null": float(d[k]),
            "above_null_low": float(d_lo[k]),
            "above_null_high": float(d_hi[k]),
        }
        for k, (a, b) in enumerate(zip(a_idx.tolist(), b_idx.tolist(), strict=True))
    ]
    sides = {}
    for side, dim in (("query_side", 2), ("key_side", 1)):
        tot, lo, hi = stat(per.sum(dim))
        sides[side] = [
            {"component": names[x], "total": float(tot[x]), "ci_low": float(lo[x]),
             "ci_high": float(hi[x])}
            for x in range(len(names))
        ]  # fmt: skip
    logit = stat((t.logit[used] / t.counts[used])[:, None])
    attn = stat((t.attn[used] / t.counts[used])[:, None])
    return {
        "table": mean,
        # [prompt, component]: query side, key side; then the same at the null keys
        "per_prompt_sides": (per.sum(2), per.sum(1), null.sum(2), null.sum(1)),
        "pairs": pairs,
        **sides,
        "logit": tuple(float(x[0]) for x in logit),
        "attn": tuple(float(x[0]) for x in attn),
        "n_prompts": n,
        "n_instances": int(t.counts.sum()),
    }


def knockout_summary(
    recs: list[tuple[QKRecord, Instances, Tensor]],
    layer: int,
    head: int,
    pairs: list[dict],
    n_prompts: int,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> list[dict]:
    """For each pair of ``pairs`` (names from :func:`summarise`): the exact knock-outs of its
    query-side and key-side component beside their first-order estimates, each the mean change
    of the attention on the chosen key over prompts with an interval."""
    from headscope.uncertainty import draw_weights

    out = []
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    cs = [  # each instance's key-side totals (what the first-order key-side change reads)
        torch.cat([table(rec, layer, head, inst.rows[s : s + 64], inst.query[s : s + 64],
                         inst.key[s : s + 64]).sum(1) for s in range(0, len(inst), 64)])
        for rec, inst, _ in recs
    ]  # fmt: skip
    for pair in pairs:
        sums = torch.zeros(n_prompts, 4, dtype=torch.float64)
        counts = torch.zeros(n_prompts, dtype=torch.float64)
        for (rec, inst, prompts), c in zip(recs, cs, strict=True):
            names = rec.components(layer)
            a, b = names.index(pair["query_component"]), names.index(pair["key_component"])
            ko = knockouts(rec, layer, head, inst, a, b, c)
            vals = torch.stack([ko[k] for k in ("ko_q", "fo_q", "ko_k", "fo_k")], 1)
            p = prompts[inst.rows]
            sums.index_add_(0, p, vals)
            counts.index_add_(0, p, torch.ones(len(p), dtype=torch.float64))
        used = counts > 0
        per = sums[used] / counts[used, None]
        row = {"query_component": pair["query_component"], "key_component": pair["key_component"]}
        m = per.mean(0)
        if resamples:
            w = draw_weights(int(used.sum()), resamples, seed) / int(used.sum())
            lo, hi = torch.quantile(w @ per, q, dim=0)
        else:
            lo = hi = torch.full_like(m, torch.nan)
        for k, name in enumerate(("knockout_query", "first_order_query", "knockout_key",
                                  "first_order_key")):  # fmt: skip
            row[name], row[f"{name}_low"], row[f"{name}_high"] = (
                float(m[k]),
                float(lo[k]),
                float(hi[k]),
            )
        out.append(row)
    return out


def subspace_summary(
    recs: list[tuple[QKRecord, Instances, Tensor]],
    layer: int,
    head: int,
    n_prompts: int,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> list[dict]:
    """Each subspace's part of the logit (:func:`subspaces`), the mean over prompts of each
    prompt's mean over its instances, with an interval; largest ``|part|`` first."""
    sums, counts, names = None, torch.zeros(n_prompts, dtype=torch.float64), None
    for rec, inst, prompts in recs:
        names, parts = subspaces(rec, layer, head, inst.rows, inst.query, inst.key)
        if sums is None:
            sums = torch.zeros(n_prompts, parts.shape[1], dtype=torch.float64)
        p = prompts[inst.rows]
        sums.index_add_(0, p, parts)
        counts.index_add_(0, p, torch.ones(len(p), dtype=torch.float64))
    used = counts > 0
    m, lo, hi = over_prompts(sums[used] / counts[used, None], resamples, level, seed)
    order = m.abs().argsort(descending=True).tolist()
    return [
        {"subspace": names[x], "contribution": float(m[x]), "ci_low": float(lo[x]),
         "ci_high": float(hi[x])}
        for x in order
    ]  # fmt: skip
