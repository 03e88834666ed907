"""retrieval: copy-paste retrieval from far back in the context (Wu et al. 2024, "Retrieval Head").

The ``needle`` probe hides ``K`` random ordinary tokens (the needle) in long natural text, then asks
for them and gives them (teacher-forced). For every answer query ``q`` whose next token is needle
token ``j`` (``PatternBatch.targets[q]`` = the key position of token ``j``):

* ``retrieval``: a hit when the head's arg-max key is that position; score = hits / answer queries.
  Its chance is the hit rate of a head picking one visible key uniformly at random, ``1/(q+1)``.
* ``retrieval_soft``: ``A[q, position of j]``, the weight on the token about to be copied.

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> A = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.1, 0.7, 0.2, 0],
...                   [0.1, 0.2, 0.3, 0.4]])[None, None]
>>> b = PatternBatch(lengths=torch.tensor([4]), causal=True, targets=torch.tensor([[-1, -1, 1, 1]]))
>>> retrieval(A, b).score(), retrieval_soft(A, b).score()   # q = 2 hits key 1; q = 3 looks at key 3
(tensor([[0.5000]], dtype=torch.float64), tensor([[0.4500]], dtype=torch.float64))
"""

import torch

from headscope.metrics.base import Metric, PatternBatch, Pooled, pool, query_positions
from headscope.metrics.rows import as_rows


def _targets(rows, batch: PatternBatch):
    """Per (sequence, row of this block): the target key, and which rows are answer queries."""
    if batch.targets is None:
        b, _, nq, _ = rows.shape
        none = torch.full((b, nq), -1, dtype=torch.long, device=rows.device)
        return none, none >= 0
    q = query_positions(rows, batch)  # [query]
    t = batch.targets.to(rows.device)[:, q]  # [batch, query]
    real = q[None, :] < batch.lengths.to(rows.device)[:, None]
    return t, (t >= 0) & real


def retrieval(pattern, batch: PatternBatch) -> Pooled:
    rows = as_rows(pattern)
    target, answer = _targets(rows, batch)
    hits = (rows.arg_max(batch) == target[:, None, :]).to(torch.float64)  # [batch, head, query]
    return pool(hits, answer)


def retrieval_soft(pattern, batch: PatternBatch) -> Pooled:
    rows = as_rows(pattern)
    target, answer = _targets(rows, batch)
    return pool(rows.at(target.clamp(min=0), batch), answer)


# chance: a head picking uniformly hits with probability 1/(keys it sees), which is retrieval_soft's
METRIC = Metric.of("retrieval", retrieval, fused=True, chance_fn=retrieval_soft, needs=("argmax",))

SOFT = Metric.of("retrieval_soft", retrieval_soft, fused=True)
