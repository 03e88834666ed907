"""Head metrics: one module per behaviour, registered here in one greppable place.

Adding a behaviour = one new module defining ``METRIC = Metric(...)``, one line below, one test.
"""

from headscope.metrics import (
    duplicate_token,
    entropy,
    induction,
    next_token,
    previous_token,
    punctuation,
    retrieval,
    separator,
    sink,
    streaming,
)
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

register(previous_token.METRIC)
register(next_token.METRIC)
register(sink.METRIC)
register(separator.METRIC)
register(punctuation.METRIC)
register(entropy.METRIC)
register(induction.METRIC)
register(duplicate_token.METRIC)
# long-context metrics: scanned when named (or with --long-context), never by default
register(streaming.METRIC)
register(retrieval.METRIC)
register(retrieval.SOFT)

__all__ = ["PROBES", "REGISTRY", "Metric", "PatternBatch", "Pooled", "default_metrics", "get_metric", "register",
           "uniform_pattern"]
