"""entropy: how spread out a head's attention is, in nats.

Queries ``1 <= q <= n-1``; ``f(A, q) = -sum_k A[q, k] ln A[q, k]`` (0 ln 0 = 0). A head that
always attends to one key scores 0; the chance value is the mean of ln(visible keys).

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> A = torch.tensor([[1.0, 0], [0.5, 0.5]])[None, None]
>>> entropy(A, PatternBatch(lengths=torch.tensor([2]), causal=True)).score()   # ln 2
tensor([[0.6931]], dtype=torch.float64)
"""

from headscope.metrics.base import Metric, PatternBatch, Pooled, pool, query_range, row_entropy


def entropy(pattern, batch: PatternBatch) -> Pooled:
    return pool(row_entropy(pattern, batch), query_range(pattern, batch, 1, batch.lengths - 1))


METRIC = Metric.of("entropy", entropy, fused=True)
