"""Head metrics: one module per behaviour; the built-in ones are registered from
:mod:`headscope.catalog`.

================  ==================================================================================
context           :class:`~headscope.metrics.context.PatternBatch`: what a metric knows of a batch
rows              one protocol for a full pattern, a block of its query rows, or per-row statistics
base              :class:`~headscope.metrics.base.Metric`, the selectors every metric reads through,
                  the registry (a second metric of one name is refused)
stats             per-row statistics as the fused kernel returns them
previous_token    A[q, q-1]
next_token        A[q, q+1] (NaN on causal models)
sink              A[q, 0]
separator         mass on separator keys
punctuation       mass on punctuation keys (and what counts as punctuation)
entropy           -sum A ln A
induction         A[q, q-L+1] on BOS + R + R
duplicate_token   A[q, q-L] on BOS + R + R
streaming         mass on a sink + window band (a StreamingLLM cache)
retrieval         needle copy-paste: arg-max on the needle token (and the soft version)
rare_word         arg-max on the least frequent visible token (Voita et al. 2019; the head census)
syntax            Clark et al.'s syntax-head protocol on word maps: accuracy per relation, offsets
================  ==================================================================================

Adding a behaviour = one module defining ``METRIC = Metric.of("name", fn)``, one entry in
:data:`headscope.catalog.PATTERN` (what it means, and ``impl`` naming the module: the registration),
and one test file. A metric you define at run time: ``register(Metric(name=..., fn=..., ...))``.
"""

from importlib import import_module

from headscope.catalog import PATTERN
from headscope.metrics.base import (
    PROBES,
    REGISTRY,
    Metric,
    PatternBatch,
    Pooled,
    default_metrics,
    get_metric,
    register,
    uniform_pattern,
)

for _info in PATTERN.values():  # the built-in metrics, in the catalog's order
    _module, _attr = _info.impl.split(":")
    register(getattr(import_module(_module), _attr))

__all__ = [
    "PROBES",
    "REGISTRY",
    "Metric",
    "PatternBatch",
    "Pooled",
    "default_metrics",
    "get_metric",
    "register",
    "uniform_pattern",
]
