"""The census's ``rare_word`` part: the rare-word metric (:mod:`headscope.metrics.rare_word`) on the
text probe, with the chance of a head that picks among tied rarest keys; intervals over sequences.
"""

from __future__ import annotations

import torch

from headscope.census.base import Context, labelled_rows
from headscope.result import Probe, head_name
from headscope.uncertainty import bootstrap


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
    extra = {"chance_ties": torch.full((model.n_layers, model.n_heads), ties)}
    return labelled_rows(
        model, m, got.score, got.chance, int(got.count), None, (b.ci_low, b.ci_high), extra
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
