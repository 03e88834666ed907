"""previous_token: attention from each token to the one just before it.

Queries ``1 <= q <= n-1``; ``f(A, q) = A[q, q-1]``. A perfect previous-token head scores 1.

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> A = torch.tensor([[1.0, 0, 0], [1, 0, 0], [0, 1, 0]])[None, None]   # [batch, head, q, k]
>>> previous_token(A, PatternBatch(lengths=torch.tensor([3]), causal=True)).score()
tensor([[1.]], dtype=torch.float64)
"""

from headscope.metrics.base import Metric, PatternBatch, Pooled, at_offset, pool, query_range


def previous_token(pattern, batch: PatternBatch) -> Pooled:
    vals = at_offset(pattern, batch, -1)  # [batch, head, query]: A[q, q-1]
    return pool(vals, query_range(pattern, batch, 1, batch.lengths - 1))


METRIC = Metric.of("previous_token", previous_token, fused=True)
