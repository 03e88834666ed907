"""streaming: the attention a sink + window KV cache would keep (StreamingLLM, Xiao et al. 2023).

A cache that keeps the first ``s`` tokens (the sinks) and the last ``w`` tokens (the window) serves
a head well exactly when the head's attention already lives there. For query ``q``:
``f(A, q) = sum of A[q, k]`` over ``k < s`` and ``q - w < k <= q``; qualifying queries
``s + w <= q <= n-1`` (before that the cache keeps every key). Defaults ``s = 4``, ``w = 64``
(``PatternBatch.band``). A head scoring near 1 can be restricted to the cache at little cost; a
head scoring low reads from the middle of the context. Decoders only (a KV cache is a decoding
structure).

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> A = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.3, 0.5, 0],
...                   [0.1, 0.6, 0.1, 0.2]])[None, None]
>>> b = PatternBatch(lengths=torch.tensor([4]), causal=True, band=(1, 1))  # key 0 and the query
>>> streaming(A, b).score()   # q = 2: 0.2 + 0.5; q = 3: 0.1 + 0.2
tensor([[0.5000]], dtype=torch.float64)
"""

from headscope.metrics.base import Metric, PatternBatch, Pooled, pool, query_range
from headscope.metrics.rows import as_rows

SINKS, WINDOW = 4, 64  # StreamingLLM's 4 sinks; a 64-token window


def band_of(batch: PatternBatch) -> tuple[int, int]:
    return batch.band if batch.band is not None else (SINKS, WINDOW)


def streaming(pattern, batch: PatternBatch) -> Pooled:
    sinks, window = band_of(batch)
    rows = as_rows(pattern)
    vals = rows.band_mass(batch, sinks, window)  # [batch, head, query]
    qualifies = query_range(rows, batch, sinks + window, batch.lengths - 1)
    if not batch.causal:
        qualifies = qualifies & False  # no KV cache to plan for an encoder: NaN, with the reason
    return pool(vals, qualifies)


METRIC = Metric.of("streaming", streaming, fused=True, needs=("band",))
