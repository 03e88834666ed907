"""The whole scan as one function: probes -> streaming extraction -> a tidy report.

>>> import headscope                                           # doctest: +SKIP
>>> model = headscope.load_model("smollm2-135m")               # doctest: +SKIP
>>> result = headscope.scan(model)                             # doctest: +SKIP
>>> result.scores.query("metric == 'induction'").nlargest(3, "score")   # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from headscope.extract import MetricScores, resolve_engine, score_probe
from headscope.metrics import REGISTRY, Metric, get_metric
from headscope.probes import (
    Probe,
    load_pairs,
    packed_text_probe,
    repeat_len_for,
    repeat_probe,
    text_probe,
)
from headscope.report import to_frame


@dataclass
class ScanResult:
    """A scan's tidy table plus everything needed to reproduce it."""

    model_name: str
    scores: pd.DataFrame  # long format: one row per (metric, layer, head)
    probes: list[Probe]
    metadata: dict = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)


def default_probes(
    model,
    n_prompts: int = 64,
    repeat_len: int = 50,
    seed: int = 0,
    prompts: str | None = None,
    seq_len: int | None = None,
) -> list[Probe]:
    """The text probe (first ``n_prompts`` pairs) and ``n_prompts`` repeat sequences.

    With ``seq_len``, every sequence is ``seq_len`` tokens long: text segments are packed until
    full, and the repeat probe uses the longest ``R`` that fits (``repeat_len`` is then ignored).
    """
    if seq_len is not None:
        return [
            packed_text_probe(model, load_pairs(prompts), seq_len, n_prompts),
            repeat_probe(model, repeat_len=repeat_len_for(model, seq_len), n_sequences=n_prompts, seed=seed),
        ]
    return [
        text_probe(model, load_pairs(prompts), n_prompts),
        repeat_probe(model, repeat_len=repeat_len, n_sequences=n_prompts, seed=seed),
    ]


def scan(
    model,
    probes: Sequence[Probe] | None = None,
    metrics: Sequence[str | Metric] | None = None,
    batch_size: int | None = None,
    thresholds: dict[str, float] | None = None,
    progress=None,
    engine: str = "auto",
) -> ScanResult:
    """Score every head of ``model`` for every metric; return a :class:`ScanResult`.

    ``probes`` defaults to :func:`default_probes`; ``metrics`` to every registered metric;
    ``thresholds`` overrides label thresholds by metric name. ``progress`` is an optional
    ``tqdm``-like factory ``progress(total=..., desc=...)``.
    """
    probes = list(probes) if probes is not None else default_probes(model)
    chosen = [m if isinstance(m, Metric) else get_metric(m) for m in (metrics or list(REGISTRY))]
    thresholds = dict(thresholds or {})
    for name in thresholds:
        get_metric(name)  # unknown names fail loudly
    results: dict[str, MetricScores] = {}
    timings: dict[str, float] = {}
    for probe in probes:
        t0 = time.perf_counter()
        bar = progress(total=len(probe), desc=f"{probe.name} probe") if progress else None
        results.update(score_probe(model, probe, chosen, batch_size,
                                   on_batch=bar.update if bar is not None else None, engine=engine))
        if bar is not None:
            bar.close()
        timings[f"scan_{probe.name}_s"] = round(time.perf_counter() - t0, 3)
    ordered = [m for m in chosen if m.name in results]
    frame = to_frame(model.name, model.n_layers, model.n_heads, [results[m.name] for m in ordered], thresholds)
    return ScanResult(
        model_name=model.name,
        scores=frame,
        probes=probes,
        metadata={"timings": timings, "causal": model.causal, "batch_size": batch_size or "auto",
                  "engine": resolve_engine(model, engine, chosen)},
        thresholds={m.name: thresholds.get(m.name, m.threshold) for m in ordered},
    )
