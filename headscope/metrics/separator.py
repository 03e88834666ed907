"""separator: attention on the separator token ([SEP], else the tokenizer's EOS).

Queries that can see at least one separator key at ``k >= 1`` (causal models: ``k <= q``);
``f(A, q)`` = the sum of ``A[q, k]`` over those keys. Position 0 is never a key here, so a
model whose BOS is also its EOS (GPT-2) does not count its sink twice.

>>> import torch
>>> from headscope.metrics.base import PatternBatch
>>> A = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.6, 0.2]])[None, None]
>>> sep = torch.tensor([[False, True, False]])          # the token at position 1 is [SEP]
>>> separator(A, PatternBatch(lengths=torch.tensor([3]), causal=True, separator=sep)).score()
tensor([[0.5500]], dtype=torch.float64)
"""

from headscope.metrics.base import Metric, PatternBatch, Pooled, key_set_mass


def separator(pattern, batch: PatternBatch) -> Pooled:
    return key_set_mass(pattern, batch, "separator")


METRIC = Metric.of("separator", separator, fused=True)
