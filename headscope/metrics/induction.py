"""induction: on ``BOS + R + R``, attention to the token after the earlier copy of the current one.

With ``|R| = L`` the second copy sits at ``L+1..2L``; its token at ``q`` first appeared at
``q-L``, so an induction head attends to ``q-L+1``. Queries ``L+1 <= q <= 2L``;
``f(A, q) = A[q, q-L+1]``.

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> L = 2                                   # BOS r1 r2 r1 r2 -> q=3 looks at 2, q=4 at 3
>>> A = torch.zeros(1, 1, 5, 5); A[0, 0, :, 0] = 1
>>> A[0, 0, 3] = torch.tensor([0, 0, 1.0, 0, 0]); A[0, 0, 4] = torch.tensor([0, 0, 0, 1.0, 0])
>>> induction(A, PatternBatch(lengths=torch.tensor([5]), causal=True, repeat_len=L)).score()
tensor([[1.]], dtype=torch.float64)
"""

from headscope.errors import HeadscopeError
from headscope.metrics.base import Metric, PatternBatch, Pooled, at_offset, pool, query_range


def induction(pattern, batch: PatternBatch) -> Pooled:
    L = _repeat_len(batch)
    vals = at_offset(pattern, batch, -(L - 1))  # [batch, head, query]: A[q, q-L+1]
    return pool(vals, query_range(pattern, batch, L + 1, 2 * L))


def _repeat_len(batch: PatternBatch) -> int:
    if not batch.repeat_len or batch.repeat_len < 1:
        raise HeadscopeError("Repeat-probe metrics need PatternBatch.repeat_len (L >= 1).")
    return int(batch.repeat_len)


METRIC = Metric.of("induction", induction, fused=True)
