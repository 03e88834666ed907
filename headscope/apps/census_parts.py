"""The head census's parts, each as rows of ``scores.csv``, lines of ``summary.md`` and records of
``metadata.json`` (:mod:`headscope.apps.census` runs them and writes the run directory).

=====================  =============================================================================
part                   what it computes (the definitions are each module's docstring)
=====================  =============================================================================
``syntax``             Clark et al.'s table (:mod:`headscope.metrics.syntax`) on held-out parsed
                       sentences (:mod:`headscope.probes.sentences`), each head's full pattern read
                       by the blocked (or hooks) engine and turned into word maps
``noop``               the [SEP] / BOS no-op test (:mod:`headscope.effects.noop`), the head's weight
                       there, and its whole-head mean-ablation effect beside both
``successor``          successor heads (:mod:`headscope.circuits.successor`)
``copy_suppression``   copy suppression (:mod:`headscope.circuits.copy_suppression`) and the same
                       mean-ablation effect beside it (decoders: the text loss)
``rare_word``          the rare-word metric (:mod:`headscope.metrics.rare_word`) on the text probe
=====================  =============================================================================

Intervals: seeded bootstraps over sentences (syntax), sequences (no-op, ablation, copy
suppression, rare_word) or (t, succ t) pairs (successor).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import Tensor

from headscope.apps.settings import CensusSettings
from headscope.catalog import CENSUS, COPYING_K, EFFECTS, SYNTAX_MARGIN
from headscope.errors import HeadscopeError
from headscope.result import Probe, head_name
from headscope.uncertainty import bootstrap

SHORT = {"dep->head": "d2h", "head->dep": "h2d"}


@dataclass
class Context:
    """What the parts share: the model, the settings, the probes, and what they found."""

    model: object
    settings: CensusSettings
    text: Probe
    repeat: Probe
    say: Callable[[str], None]
    summary: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # file name -> table to write
    files: dict[str, Callable] = field(default_factory=dict)  # file name -> write(path)
    ablation: dict | None = None  # the whole-head mean ablation, computed once
    sequences: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)  # SEQUENCES_FILE


# ------------------------------------------------------------------------------ rows


def rows(
    model,
    metric: str,
    probe: str,
    score: Tensor,
    chance,
    n: int,
    label: str = "",
    passes: Callable[[float, float], bool] | None = None,
    null: Tensor | None = None,
    ci: tuple[Tensor, Tensor] | None = None,
    extra: dict | None = None,
) -> list[dict]:
    """One row per head: the scan's columns, then ``null``, ``ci_low``, ``ci_high`` (and ``extra``).
    ``chance`` is one number or one per layer; ``passes(score, null)`` decides the label."""
    out = []
    for layer in range(model.n_layers):
        for h in range(model.n_heads):
            s = float(score[layer, h])
            c = float(chance[layer] if isinstance(chance, Tensor) and chance.dim() == 1 else chance)
            nl = float(null[layer, h]) if null is not None else float("nan")
            row = {
                "model": model.name,
                "metric": metric,
                "probe": probe,
                "layer": layer,
                "head": h,
                "head_name": head_name(layer, h),
                "score": s,
                "chance": c,
                "n": int(n),
                "label": label if passes is not None and s == s and passes(s, nl) else "",
                "null": nl,
                "ci_low": float(ci[0][layer, h]) if ci is not None else float("nan"),
                "ci_high": float(ci[1][layer, h]) if ci is not None else float("nan"),
            }
            for k, v in (extra or {}).items():
                row[k] = float(v[layer, h])
            out.append(row)
    return out


SEQUENCES_FILE = "noop_sequences.csv"


def per_sequence_table(parts: dict[str, tuple[Tensor, Tensor]]) -> pd.DataFrame:
    """``noop_sequences.csv``: per metric, sequence and head, the sums a pooled score is made of
    (``score = sum total / sum count`` over the sequences), so that any statistic of the heads'
    scores (a layer's mean, a median ratio of two metrics) can be resampled by sequence."""
    frames = []
    for metric, (total, count) in parts.items():
        n, n_layers, n_heads = total.shape
        seq, layer, head = torch.meshgrid(
            torch.arange(n), torch.arange(n_layers), torch.arange(n_heads), indexing="ij"
        )
        frames.append(
            pd.DataFrame(
                {
                    "metric": metric,
                    "sequence": seq.flatten().numpy(),
                    "layer": layer.flatten().numpy(),
                    "head": head.flatten().numpy(),
                    "total": total.double().flatten().numpy(),
                    "count": count.double()[:, None, None].expand(total.shape).flatten().numpy(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def _pooled(sums: dict, n_seq: int, model) -> tuple[Tensor, Tensor]:
    """``{(layer, head): (sums [seq], counts [seq])}`` -> ``(totals [seq, layer, head], counts
    [seq])``."""
    tot = torch.zeros(n_seq, model.n_layers, model.n_heads, dtype=torch.float64)
    cnt = torch.zeros(n_seq, dtype=torch.float64)
    for (layer, h), (s, c) in sums.items():
        tot[:, layer, h], cnt = s, c
    return tot, cnt


# ------------------------------------------------------------------------------ syntax


def attention_maps(
    model,
    sequences: Sequence[Sequence[int]],
    on_sequence: Callable[[int, Tensor], None],
    batch_size: int = 16,
    engine: str = "blocked",
) -> None:
    """``on_sequence(i, pattern)`` with every layer's pattern ``[layer, head, n, n]`` (float32, CPU)
    of sequence ``i``, from an engine that hands over the pattern itself (blocked or hooks)."""
    from headscope.engines.extract import pad_batch
    from headscope.engines.registry import get_engine
    from headscope.metrics.context import PatternBatch

    eng = get_engine(engine)
    reason = eng.unavailable(model, [])
    if reason is not None:
        raise HeadscopeError(f"The {engine} engine cannot read {model.name}'s patterns: {reason}.")
    L, H = model.n_layers, model.n_heads
    for start in range(0, len(sequences), batch_size):
        chunk = [list(s) for s in sequences[start : start + batch_size]]
        tokens, mask, lengths = pad_batch(chunk, model.pad_id)  # [b, n] each, [b]
        b, n = tokens.shape
        buf = torch.zeros(L, b, H, n, n)  # [layer, batch, head, query, key]

        def on_rows(layer, rows, q_start=0, buf=buf):
            p = rows.pattern  # [batch, head, query block, keys (a causal block may stop early)]
            buf[layer, :, :, q_start : q_start + p.shape[-2], : p.shape[-1]] = p.float().cpu()

        eng.run(
            model,
            tokens,
            mask,
            PatternBatch(lengths=lengths, causal=model.causal).to(model.device),
            on_rows,
        )
        for j in range(b):
            m = int(lengths[j])
            on_sequence(start + j, buf[:, j, :, :m, :m])


def sentence_predictions(
    model, sentences, batch_size: int = 16, engine: str = "blocked"
) -> list[Tensor]:
    """Per sentence, ``[layer, head, 2, word]`` predictions (int16) of every head of ``model``."""
    from headscope.metrics.syntax import predictions
    from headscope.probes.words import word_attention

    out: list[Tensor | None] = [None] * len(sentences)

    def keep(i: int, pattern: Tensor) -> None:
        word_map = word_attention(
            pattern, sentences[i].word_tokens
        )  # [layer, head, word, word], float64
        out[i] = predictions(word_map, model.causal).to(torch.int16)

    attention_maps(model, [s.token_ids for s in sentences], keep, batch_size, engine)
    return out


def syntax_part(ctx: Context) -> list[dict]:
    from headscope.metrics import syntax
    from headscope.probes import parser, sentences

    model, st = ctx.model, ctx.settings
    nlp = parser.load_parser(ctx.say)
    ss = sentences.sentence_set(
        model, nlp, n_sentences=st.n_sentences, tokenize=st.tokenize, progress=ctx.say
    )
    ctx.files["syntax_sentences.jsonl"] = ss.save
    ctx.say(f"syntax: {len(ss.sentences)} sentences, every head's word map")
    preds = sentence_predictions(model, ss.sentences, st.batch_size, st.engine)
    pairs = syntax.judge(ss.sentences, preds, model.causal)
    table, per_head = syntax.accuracy_table(
        pairs,
        len(ss.sentences),
        model.n_layers,
        model.n_heads,
        model.causal,
        min_count=st.min_count,
        resamples=st.bootstrap,
        seed=st.seed,
    )
    p = parser.PARSER
    table["labels"] = f"SILVER: {p.name} (published UAS {p.uas} / LAS {p.las})"
    ctx.tables["syntax_table.csv"] = table
    ctx.tables["syntax_heads.csv"] = per_head
    ctx.meta["parser"] = parser.provenance()
    ctx.meta["sentences"] = ss.settings | {"left_out": ss.left_out}
    ctx.summary += [
        "## Syntax heads (Clark et al. 2019, section 4.2)",
        "",
        p.note() + ".",
        f"{len(ss.sentences)} held-out sentences ({ss.settings['tokenize']} tokenization; left "
        f"out: {ss.left_out or 'none'}"
        + (
            f"; {ss.settings['differ_from_natural']} differ from the natural tokenization"
            if "differ_from_natural" in ss.settings
            else ""
        )
        + ").",
        "",
        table_markdown(table, model.causal),
        "",
    ]
    out = []
    shape = (model.n_layers, model.n_heads)
    for (rel, direction), sub in per_head.groupby(["relation", "direction"], sort=False):
        sub = sub.sort_values(["layer", "head"])
        acc, lo, hi = (
            torch.tensor(sub[c].to_numpy()).view(shape) for c in ("accuracy", "ci_low", "ci_high")
        )
        base = torch.full(shape, float(sub["baseline"].iloc[0]))
        info = CENSUS[f"syntax.{SHORT[direction]}"]
        out += rows(
            model,
            f"syntax_{rel}.{SHORT[direction]}",
            "syntax",
            acc,
            float(sub["chance"].iloc[0]),
            int(sub["count"].iloc[0]),
            f"{info.label} ({rel}, {direction})",
            lambda s, n: s >= n + SYNTAX_MARGIN,
            base,
            (lo, hi),
        )
    return out


def table_markdown(table: pd.DataFrame, causal: bool) -> str:
    """Clark's table as markdown. Encoders: the ``either`` rows (best head over both directions, as
    Clark's Table 1); decoders: each direction that keeps enough pairs, its count beside it."""
    sub = table if causal else table[table.direction == "either"]
    lines = [
        "| relation | direction | count | best head | accuracy % [95% CI] | best offset | its "
        "accuracy % | difference [95% CI] |",
        "| --- | --- | ---: | --- | --- | ---: | ---: | --- |",
    ]
    for r in sub.itertuples():
        lines.append(
            f"| {r.relation} | {r.direction if causal else r.head_direction} | {r.count} | "
            f"{r.best_head} | {100 * r.accuracy:.1f} [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}] "
            f"| {r.offset:+d} | {100 * r.baseline:.1f} | {100 * r.difference:+.1f} "
            f"[{100 * r.difference_ci_low:+.1f}, {100 * r.difference_ci_high:+.1f}] |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------ no-op and ablation


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

    model, st = ctx.model, ctx.settings
    probe = _effect_probe(ctx)
    target = target_for(model)
    ctx.say(f"mean ablation of every head ({target.metric}, {len(probe)} text sequences)")
    heads = [(la, h) for la in range(model.n_layers) for h in range(model.n_heads)]
    sums = exact_effects(model, probe, target, heads, head_means(model, probe, 8), 8)
    tot, cnt = _pooled(sums, len(probe), model)
    b = bootstrap(tot, cnt, resamples=st.bootstrap, seed=st.seed)
    score = tot.sum(0) / cnt.sum()
    info = EFFECTS[target.metric]
    ctx.ablation = {"metric": target.metric, "score": score}
    ctx.sequences[target.metric] = (tot, cnt)
    return rows(
        model,
        target.metric,
        "text",
        score,
        0.0,
        int(cnt.sum()),
        info.label,
        lambda s, n: s >= info.threshold,
        None,
        (b.ci_low, b.ci_high),
    )


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
    eff = noop.noop_effects(model, probe)
    tot, cnt = _pooled(eff, len(probe), model)
    b = bootstrap(tot, cnt, resamples=st.bootstrap, seed=st.seed)
    info = noop.noop_info(model)
    weight_metric = get_metric("sink" if model.causal else "separator")
    w = score_probe(model, probe, [weight_metric], engine="blocked")[weight_metric.name]
    bw = bootstrap(w.seq_total, w.seq_count, resamples=st.bootstrap, seed=st.seed)
    score = tot.sum(0) / cnt.sum()
    out = rows(
        model,
        info.name,
        "text",
        score,
        0.0,
        int(cnt.sum()),
        info.label,
        lambda s, n: s >= info.threshold,
        None,
        (b.ci_low, b.ci_high),
    )
    out += rows(
        model, "noop_weight", "text", w.score, w.chance, int(w.count), ci=(bw.ci_low, bw.ci_high)
    )
    out += ablation(ctx)
    ab = ctx.ablation["score"] if ctx.ablation else None
    ctx.sequences[info.name] = (tot, cnt)
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


# ------------------------------------------------------------------------------ OV circuits


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
    info = CENSUS[name]
    return rows(
        model,
        name,
        "ordinal",
        r.score,
        r.chance,
        r.count,
        info.label,
        lambda s, n: s >= info.threshold,
        r.null_mean,
        (r.ci_low, r.ci_high),
        {"null_q95": r.null_q95},
    )


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
    info = CENSUS[name]
    out = rows(
        model,
        name,
        "repeat",
        r.score,
        r.chance,
        r.count,
        info.label,
        lambda s, n: s >= info.threshold,
        r.null,
        (r.ci_low, r.ci_high),
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


# ------------------------------------------------------------------------------ rare words


def rare_word_part(ctx: Context) -> list[dict]:
    from headscope.engines.extract import score_probe
    from headscope.metrics import get_metric

    model, st = ctx.model, ctx.settings
    m = get_metric("rare_word")
    got = score_probe(model, ctx.text, [m])["rare_word"]
    b = bootstrap(got.seq_total, got.seq_count, resamples=st.bootstrap, seed=st.seed)
    ties = tied_chance(model, ctx.text)
    i = int(got.score.flatten().argmax())
    la, h = divmod(i, model.n_heads)
    ctx.summary += [
        "## Rare-word heads (Voita et al. 2019; their NMT head: 66%)",
        "",
        f"{int(got.count)} text queries; chance 1/(keys counted) = {float(got.chance_at(0)):.3f} "
        f"(a head picking a counted key uniformly hits {ties:.3f}, ties counted); best head "
        f"{head_name(la, h)}: {float(got.score[la, h]):.3f} [{float(b.ci_low[la, h]):.3f}, "
        f"{float(b.ci_high[la, h]):.3f}].",
        "",
    ]
    ctx.meta["rare_word"] = {
        "counts": "unigram counts of the bundled prose (scan + held-out parts) under the "
        "model's tokenizer",
        "chance_ties": ties,
    }
    return rows(
        model,
        "rare_word",
        "text",
        got.score,
        got.chance,
        int(got.count),
        m.label,
        lambda s, n: s >= m.threshold,
        None,
        (b.ci_low, b.ci_high),
        {"chance_ties": torch.full((model.n_layers, model.n_heads), ties)},
    )


def tied_chance(model, probe: Probe) -> float:
    """The hit rate of a head picking one counted key uniformly: mean of (rarest keys) / (keys
    counted)."""
    from headscope.probes.unigrams import unigram_counts

    table = unigram_counts(model).tolist()
    total, n = 0.0, 0
    for ids in probe.sequences:
        for q in range(len(ids)):
            last = q + 1 if model.causal else len(ids)
            keys = [k for k in range(1, last) if k != q and table[ids[k]] != float("inf")]
            if keys:
                rarest = min(table[ids[k]] for k in keys)
                total += sum(table[ids[k]] == rarest for k in keys) / len(keys)
                n += 1
    return total / n if n else float("nan")


PART_FNS = {
    "syntax": syntax_part,
    "noop": noop_part,
    "successor": successor_part,
    "copy_suppression": copy_suppression_part,
    "rare_word": rare_word_part,
}
