"""punctuation: attention on punctuation tokens.

A token is punctuation when, decoded alone and stripped of whitespace, it is non-empty and every
character is Unicode punctuation (category P*). Queries that can see at least one punctuation key
at ``k >= 1``; ``f(A, q)`` = the sum of ``A[q, k]`` over those keys.

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> A = torch.tensor([[0.5, 0.5, 0], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]])[None, None]
>>> punct = torch.tensor([[False, False, True]])        # position 2 is "."
>>> punctuation(A, PatternBatch(lengths=torch.tensor([3]), causal=False, punctuation=punct)).score()
tensor([[0.2833]], dtype=torch.float64)
"""

from headscope.metrics.base import Metric, PatternBatch, Pooled, key_set_mass


def punctuation(pattern, batch: PatternBatch) -> Pooled:
    return key_set_mass(pattern, batch, "punctuation")


METRIC = Metric.of("punctuation", punctuation, fused=True)
