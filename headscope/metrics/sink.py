"""sink: attention parked on the first token (BOS or [CLS]).

Queries ``1 <= q <= n-1``; ``f(A, q) = A[q, 0]``. Query 0 is left out: in a causal model it can
only look at itself, which says nothing about the head.

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> A = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.25, 0.25, 0.5]])[None, None]
>>> sink(A, PatternBatch(lengths=torch.tensor([3]), causal=True)).score()   # (0.5 + 0.25) / 2
tensor([[0.3750]], dtype=torch.float64)
"""

from headscope.metrics.base import Metric, PatternBatch, Pooled, at_key, pool, query_range


def sink(pattern, batch: PatternBatch) -> Pooled:
    vals = at_key(pattern, batch, 0)  # [batch, head, query]: A[q, 0]
    return pool(vals, query_range(pattern, batch, 1, batch.lengths - 1))


METRIC = Metric.of("sink", sink, fused=True)
