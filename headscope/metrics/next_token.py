"""next_token: attention from each token to the one just after it.

Queries ``0 <= q <= n-2``; ``f(A, q) = A[q, q+1]``. On causal models the mask makes this 0 by
construction, so the score is NaN there (the report says why) rather than a misleading 0.

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> A = torch.tensor([[0, 1.0, 0], [0, 0, 1], [0, 0, 1]])[None, None]
>>> next_token(A, PatternBatch(lengths=torch.tensor([3]), causal=False)).score()
tensor([[1.]], dtype=torch.float64)
"""

import torch

from headscope.metrics.base import Metric, PatternBatch, Pooled, at_offset, pool, query_range

CAUSAL_REASON = "causal model: the mask hides every later token, so A[q, q+1] is 0 by construction"


def next_token(pattern, batch: PatternBatch) -> Pooled:
    mask = query_range(pattern, batch, 0, batch.lengths - 2)  # [batch, query]
    if batch.causal:
        total = torch.full(pattern.shape[:2], torch.nan, dtype=torch.float64, device=pattern.device)
        return Pooled(total, mask.sum(-1).to(torch.float64))
    return pool(at_offset(pattern, batch, +1), mask)


METRIC = Metric.of("next_token", next_token, fused=True)
