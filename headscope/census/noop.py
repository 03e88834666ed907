"""The census's ``noop`` part: the [SEP] / BOS no-op test (:mod:`headscope.effects.noop`), the
head's weight there, and its whole-head mean-ablation effect beside both (:func:`ablation`, shared
with ``copy_suppression``); intervals over sequences, the sums kept in ``noop_sequences.csv``.
"""

from __future__ import annotations

from headscope.catalog import EFFECTS
from headscope.census.base import Context, labelled_rows, pooled, rows
from headscope.result import Probe, head_name
from headscope.uncertainty import bootstrap


def _effect_probe(ctx: Context) -> Probe:
    from headscope.effects.settings import EffectSettings

    return EffectSettings(n_sequences=ctx.settings.noop_sequences).subset(ctx.text)


def ablation(ctx: Context) -> list[dict]:
    """Each head's whole-head mean-ablation effect on the text probe (text loss / embedding),
    once."""
    if ctx.ablation is not None or not ctx.settings.ablation:
        return []
    from headscope.effects.ablation import exact_effects, head_means
    from headscope.effects.noop import target_for

    model = ctx.model
    probe = _effect_probe(ctx)
    target = target_for(model)
    ctx.say(f"mean ablation of every head ({target.metric}, {len(probe)} text sequences)")
    heads = [(la, h) for la in range(model.n_layers) for h in range(model.n_heads)]
    sums = exact_effects(model, probe, target, heads, head_means(model, probe, 8), 8)
    out, score, _, ctx.sequences[target.metric] = effect_rows(
        ctx, EFFECTS[target.metric], sums, len(probe)
    )
    ctx.ablation = {"metric": target.metric, "score": score}
    return out


def effect_rows(ctx: Context, info, sums: dict, n_seq: int):
    """``(rows, score, interval, (totals, counts))`` of an effect on the text probe: ``sums``
    (``{(layer, head): (sums, counts)}`` per sequence) pooled, with its bootstrap over sequences;
    chance 0 (no effect). The per-sequence sums go to ``noop_sequences.csv``."""
    tot, cnt = pooled(sums, n_seq, ctx.model)
    b = bootstrap(tot, cnt, resamples=ctx.settings.bootstrap, seed=ctx.settings.seed)
    score = tot.sum(0) / cnt.sum()
    out = labelled_rows(ctx.model, info, score, 0.0, int(cnt.sum()), ci=(b.ci_low, b.ci_high))
    return out, score, b, (tot, cnt)


def noop_part(ctx: Context) -> list[dict]:
    from headscope.effects import noop
    from headscope.engines.extract import score_probe
    from headscope.metrics import get_metric

    model, st = ctx.model, ctx.settings
    probe = _effect_probe(ctx)
    ctx.say(
        f"no-op test: {'position 0' if model.causal else '[SEP]'} removed from each head "
        f"({len(probe)} text sequences)"
    )
    info = noop.noop_info(model)
    out, score, b, sums = effect_rows(ctx, info, noop.noop_effects(model, probe), len(probe))
    weight_metric = get_metric("sink" if model.causal else "separator")
    w = score_probe(model, probe, [weight_metric], engine="blocked")[weight_metric.name]
    bw = bootstrap(w.seq_total, w.seq_count, resamples=st.bootstrap, seed=st.seed)
    out += rows(
        model, "noop_weight", "text", w.score, w.chance, int(w.count), ci=(bw.ci_low, bw.ci_high)
    )
    out += ablation(ctx)
    ab = ctx.ablation["score"] if ctx.ablation else None
    ctx.sequences[info.name] = sums
    ctx.sequences["noop_weight"] = (w.seq_total, w.seq_count)
    ctx.meta["noop"] = {
        "removed": "position 0 (BOS)" if model.causal else "[SEP] keys k >= 1",
        "weight_metric": weight_metric.name,
        "sequences": len(probe),
        "effect": info.name,
    }
    ctx.summary += [
        f"## [SEP] / BOS no-op test ({'position 0' if model.causal else '[SEP]'} removed, row "
        "renormalised)",
        "",
        f"effect = {info.name} ({info.unit}); weight = the head's "
        f"{weight_metric.name} mass on {len(probe)} text sequences"
        + (
            f"; beside it the whole-head mean ablation ({ctx.ablation['metric']})"
            if ab is not None
            else ""
        )
        + ". The ten heads with the most weight there:",
        "",
        "| head | weight [95% CI] | no-op effect [95% CI] |"
        + (" mean ablation |" if ab is not None else ""),
        "| --- | --- | --- |" + (" --- |" if ab is not None else ""),
    ]
    for i in w.score.flatten().argsort(descending=True)[:10].tolist():
        la, h = divmod(i, model.n_heads)
        line = (
            f"| {head_name(la, h)} | {float(w.score[la, h]):.3f} [{float(bw.ci_low[la, h]):.3f}, "
            f"{float(bw.ci_high[la, h]):.3f}] | {float(score[la, h]):.2e} "
            f"[{float(b.ci_low[la, h]):.2e}, {float(b.ci_high[la, h]):.2e}] |"
        )
        ctx.summary.append(line + (f" {float(ab[la, h]):.2e} |" if ab is not None else ""))
    ctx.summary.append("")
    return out
