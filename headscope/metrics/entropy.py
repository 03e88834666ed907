"""entropy: how spread out a head's attention is, in nats.

Queries ``1 <= q <= n-1``; ``f(A, q) = -sum_k A[q, k] ln A[q, k]`` (0 ln 0 = 0). A head that
always attends to one key scores 0; the chance value is the mean of ln(visible keys).

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> A = torch.tensor([[1.0, 0], [0.5, 0.5]])[None, None]
>>> entropy(A, PatternBatch(lengths=torch.tensor([2]), causal=True)).score()   # ln 2
tensor([[0.6931]], dtype=torch.float64)
"""

import torch

from headscope.metrics.base import Metric, PatternBatch, Pooled, pool, query_range


def entropy(pattern, batch: PatternBatch) -> Pooled:
    nk = pattern.shape[-1]
    if bool((batch.lengths < nk).any()):  # padding keys in range: they never count
        k = torch.arange(nk, device=pattern.device)
        real = (k[None, :] < batch.lengths.to(pattern.device)[:, None])[:, None, None, :]  # [b,1,1,key]
        pattern = pattern * real
    if batch.log_pattern is not None:  # the blocked engine hands over ln A: no log per element
        vals = -(pattern * batch.log_pattern).sum(-1)  # [batch, head, query]
    else:
        vals = torch.special.entr(pattern).sum(-1)  # [batch, head, query]
    return pool(vals, query_range(pattern, batch, 1, batch.lengths - 1))


METRIC = Metric(
    name="entropy",
    probe="text",
    fn=entropy,
    definition="mean of -sum_k A[q,k] ln A[q,k] (nats) over queries 1 <= q <= n-1",
    label="focused head",
    threshold=0.3,
    below=True,
)
