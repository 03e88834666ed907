"""Score a pattern tensor you extracted yourself with the same metric functions a scan uses."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.metrics import Metric, PatternBatch, get_metric
from headscope.probes.pairs import is_punctuation


def score_pattern(
    pattern: Float[Tensor, "batch head query key"],
    metric: str | Metric,
    *,
    causal: bool,
    lengths: Sequence[int] | Tensor | None = None,
    token_ids: Tensor | None = None,
    separator_id: int | None = None,
    tokenizer=None,
    repeat_len: int | None = None,
    pooled: bool = False,
):
    """Per-sequence, per-head scores ``[batch, head]`` of ``metric`` on ``pattern``.

    ``lengths`` gives the real tokens per sequence (default: all positions are real). Separator and
    punctuation metrics need ``token_ids`` (``[batch, pos]``) plus ``separator_id`` or a
    ``tokenizer`` (whose tokens are decoded to find punctuation). Repeat-probe metrics need
    ``repeat_len``. With ``pooled=True`` returns the pooled ``[head]`` score over all sequences.

    >>> A = torch.tensor([[1.0, 0, 0], [1, 0, 0], [0, 1, 0]])[None, None]
    >>> score_pattern(A, "previous_token", causal=True)
    tensor([[1.]], dtype=torch.float64)
    """
    m = metric if isinstance(metric, Metric) else get_metric(metric)
    if pattern.ndim == 3:  # [head, query, key] -> one sequence
        pattern = pattern[None]
    b, _, _, nk = pattern.shape
    lengths_t = torch.full((b,), nk) if lengths is None else torch.as_tensor(lengths).reshape(b)
    sep = punct = None
    if token_ids is not None:
        ids = torch.as_tensor(token_ids).reshape(b, nk)
        if separator_id is None and tokenizer is not None:
            separator_id = (
                tokenizer.sep_token_id
                if tokenizer.sep_token_id is not None
                else tokenizer.eos_token_id
            )
        if separator_id is not None:
            sep = ids == separator_id
        if tokenizer is not None:
            lut = {i: is_punctuation(tokenizer.decode([i])) for i in ids.unique().tolist()}
            punct = torch.tensor([[lut[i] for i in row] for row in ids.tolist()], dtype=torch.bool)
    batch = PatternBatch(
        lengths=lengths_t, causal=causal, separator=sep, punctuation=punct, repeat_len=repeat_len
    )
    result = m(pattern.float(), batch)
    if pooled:
        return result.total.sum(0) / result.count.sum()
    return result.score()
