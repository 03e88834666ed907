"""The census's parts read through a head's OV circuit: ``successor`` (successor heads,
:mod:`headscope.circuits.successor`; intervals over (t, succ t) pairs) and ``copy_suppression``
(:mod:`headscope.circuits.copy_suppression`, with the whole-head mean ablation beside it; decoders:
the text loss; intervals over sequences).
"""

from __future__ import annotations

import torch

from headscope.catalog import CENSUS, COPYING_K
from headscope.census.base import Context, labelled_rows, rows
from headscope.census.noop import ablation
from headscope.result import head_name


def readout_of(ctx: Context) -> str | None:
    """The readout successor and copy suppression use here (None: not measured, NaN rows)."""
    kind = ctx.settings.readout
    if kind == "auto":
        return "unembedding" if ctx.model.causal else None
    return kind


def _nan_rows(ctx: Context, metric: str, probe: str) -> list[dict]:
    model = ctx.model
    nan = torch.full((model.n_layers, model.n_heads), float("nan"))
    reason = CENSUS[metric].nan_reason
    ctx.summary += [
        f"## {metric}: not measured",
        "",
        f"{reason}; `--readout embeddings` reads them there.",
        "",
    ]
    return rows(model, metric, probe, nan, float("nan"), 0)


def successor_part(ctx: Context) -> list[dict]:
    from headscope.circuits import successor

    model, st = ctx.model, ctx.settings
    kind = readout_of(ctx)
    if kind is None:
        return _nan_rows(ctx, "successor", "ordinal")
    r = successor.successor_scores(
        model, readout_kind=kind, n_null=st.n_null, seed=st.seed, resamples=st.bootstrap
    )
    name = (
        "successor" if kind == "unembedding" else "successor_embeddings"
    )  # not an unembedding: another name
    ctx.meta["successor"] = {
        "readout": kind,
        "n_null": st.n_null,
        "null": "per set in order, n_null permutations "
        "torch.randperm(|S|, generator=torch.Generator().manual_seed(seed)); succ' = sigma(succ)",
        "sets": {
            s.name: {"token_ids": s.ids, "pairs": s.pairs, "dropped": s.dropped} for s in r.sets
        },
    }
    i = int(r.score.flatten().argmax())
    la, h = divmod(i, model.n_heads)
    ctx.summary += [
        "## Successor heads (Gould et al. 2023)",
        "",
        f"readout: {kind}; {r.count} pairs in {len(r.sets)} sets, chance {r.chance:.3f}; best head "
        f"{head_name(la, h)}: {float(r.score[la, h]):.3f} [{float(r.ci_low[la, h]):.3f}, "
        f"{float(r.ci_high[la, h]):.3f}], shuffled-map null mean {float(r.null_mean[la, h]):.3f} "
        f"(95th percentile {float(r.null_q95[la, h]):.3f}); heads above their null's 95th "
        f"percentile: {int((r.score > r.null_q95).sum())} of {model.n_layers * model.n_heads}.",
        "",
    ]
    ci, extra = (r.ci_low, r.ci_high), {"null_q95": r.null_q95}
    return labelled_rows(model, CENSUS[name], r.score, r.chance, r.count, r.null_mean, ci, extra)


def copy_suppression_part(ctx: Context) -> list[dict]:
    from headscope.circuits import copy_suppression

    model, st = ctx.model, ctx.settings
    kind = readout_of(ctx)
    if kind is None:
        return _nan_rows(ctx, "copy_suppression", "repeat")
    r = copy_suppression.copy_suppression_scores(
        model,
        ctx.repeat,
        readout_kind=kind,
        max_sequences=st.repeat_sequences,
        resamples=st.bootstrap,
        seed=st.seed,
    )
    name = "copy_suppression" if kind == "unembedding" else "copy_suppression_embeddings"
    out = labelled_rows(
        model, CENSUS[name], r.score, r.chance, r.count, r.null, (r.ci_low, r.ci_high)
    )
    out += ablation(ctx)
    ab = ctx.ablation["score"] if ctx.ablation else None
    ctx.meta["copy_suppression"] = {
        "readout": kind,
        "sequences": int(r.seq_count.numel()),
        "k": COPYING_K,
        "control": "the token L // 2 further along the first copy (cyclically)",
    }
    ctx.summary += [
        "## Copy suppression (McDougall et al. 2023)",
        "",
        f"readout: {kind}; {r.count} first-copy positions; chance {r.chance:.2e}; control = "
        "another token of R among the k lowest.",
        "",
        "| head | copy_suppression [95% CI] | control |"
        + (f" {ctx.ablation['metric']} |" if ab is not None else ""),
        "| --- | --- | --- |" + (" --- |" if ab is not None else ""),
    ]
    for i in r.score.flatten().argsort(descending=True)[:8].tolist():
        la, h = divmod(i, model.n_heads)
        line = (
            f"| {head_name(la, h)} | {float(r.score[la, h]):.3f} [{float(r.ci_low[la, h]):.3f}, "
            f"{float(r.ci_high[la, h]):.3f}] | {float(r.null[la, h]):.3f} |"
        )
        ctx.summary.append(line + (f" {float(ab[la, h]):+.4f} |" if ab is not None else ""))
    ctx.summary.append("")
    return out
