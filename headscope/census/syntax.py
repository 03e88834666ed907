"""The census's ``syntax`` part: Clark et al.'s table (:mod:`headscope.metrics.syntax`) on held-out
parsed sentences (:mod:`headscope.probes.sentences`), each head's full pattern read by the blocked
(or hooks) engine and turned into word maps; intervals over sentences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd
import torch
from torch import Tensor

from headscope.catalog import CENSUS, SYNTAX_MARGIN
from headscope.census.base import Context, rows
from headscope.errors import HeadscopeError

SHORT = {"dep->head": "d2h", "head->dep": "h2d"}


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
