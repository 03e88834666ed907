"""duplicate_token: on ``BOS + R + R``, attention to the earlier copy of the current token.

Queries ``L+1 <= q <= 2L``; ``f(A, q) = A[q, q-L]``.

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> A = torch.zeros(1, 1, 5, 5); A[0, 0, :, 0] = 1
>>> A[0, 0, 3] = torch.tensor([0, 1.0, 0, 0, 0]); A[0, 0, 4] = torch.tensor([0, 0, 1.0, 0, 0])
>>> duplicate_token(A, PatternBatch(lengths=torch.tensor([5]), causal=True, repeat_len=2)).score()
tensor([[1.]], dtype=torch.float64)
"""

from headscope.metrics.base import Metric, PatternBatch, Pooled, at_offset, pool, query_range
from headscope.metrics.induction import _repeat_len


def duplicate_token(pattern, batch: PatternBatch) -> Pooled:
    L = _repeat_len(batch)
    vals = at_offset(pattern, batch, -L)  # [batch, head, query]: A[q, q-L]
    return pool(vals, query_range(pattern, batch, L + 1, 2 * L))


METRIC = Metric.of("duplicate_token", duplicate_token, fused=True)
