"""rare_word: does the head look at the rarest token it can see? (Voita et al. 2019, section 5.3)

Voita et al. found an NMT encoder head whose arg-max points at the least frequent token of the
sentence 66% of the time. For a query ``q`` of the text probe, the **keys counted** are the real
keys it can see (causal models: ``k <= q``), except position 0 (BOS / [CLS]), the query itself, and
special tokens (they have no count in prose). ``PatternBatch.key_counts[b, k]`` holds each key's
unigram count in the bundled prose under the model's tokenizer (:mod:`headscope.probes.unigrams`;
``inf`` for a special token). A query qualifies when it has at least one counted key, and

* **hit** when the head's arg-max key is a counted key with the smallest count (ties: any of them);
* **chance** = ``1 / (keys counted)``, averaged like the score (the contract's definition: a head
  picking one counted key uniformly hits at least that often; with ``m`` tied rarest keys, ``m``
  times it);
* a sliding-window layer's reach is not applied to the keys counted (text probes are shorter
  than any window).

It reads the pattern only through ``arg_max`` (every engine has it: the fused kernel and the flex
pass when asked, ``needs=("argmax", "counts")``), so it runs on every engine.

>>> import torch
>>> A = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.7, 0.1, 0],
...                   [0.1, 0.2, 0.6, 0.1]])[None, None]
>>> counts = torch.tensor([[float("inf"), 5.0, 2.0, 9.0]])   # key 2 is the rarest token
>>> b = PatternBatch(lengths=torch.tensor([4]), causal=True, key_counts=counts)
>>> rare_word(A, b).score()  # q = 2 counts key 1 only (hit: arg-max 1); q = 3: 1, 2 (hit: 2)
tensor([[1.]], dtype=torch.float64)
>>> rare_word_chance(A, b).score()   # (1/1 + 1/2) / 2
tensor([[0.7500]], dtype=torch.float64)
"""

import torch

from headscope.metrics.base import Metric, PatternBatch, Pooled, pool, query_positions
from headscope.metrics.rows import as_rows


def counted_keys(shape, batch: PatternBatch, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(counted [batch, query, key] bool, counts [batch, key])`` for a block of query rows."""
    b, _, nq, nk = shape
    if batch.key_counts is None:
        return torch.zeros(b, nq, nk, dtype=torch.bool, device=device), torch.zeros(
            b, nk, device=device
        )
    counts = batch.key_counts.to(device)[:, :nk].double()  # [batch, key]
    k = torch.arange(nk, device=device)
    q = torch.arange(batch.q_start, batch.q_start + nq, device=device)
    keys = (
        (k[None, :] < batch.lengths.to(device)[:, None])
        & (k[None, :] >= 1)
        & torch.isfinite(counts)
    )  # [batch, key]
    counted = (
        keys[:, None, :] & (k[None, :] != q[:, None])[None]
    )  # [batch, query, key]: not the query itself
    if batch.causal:
        counted = counted & (k[None, :] <= q[:, None])[None]
    return counted, counts


def _qualifying(rows, batch: PatternBatch, counted: torch.Tensor) -> torch.Tensor:
    q = query_positions(rows, batch)
    real = q[None, :] < batch.lengths.to(rows.device)[:, None]  # [batch, query]
    return counted.any(-1) & real


def rare_word(pattern, batch: PatternBatch) -> Pooled:
    rows = as_rows(pattern)
    counted, counts = counted_keys(rows.shape, batch, rows.device)  # [b, q, k], [b, k]
    rarest = torch.where(counted, counts[:, None, :], torch.inf).amin(-1)  # [b, q]
    am = rows.arg_max(batch).clamp(min=0)  # [b, h, q]; -1 (a row that sees nothing) never qualifies
    b, h, nq = am.shape
    at = (
        counted[:, None].expand(b, h, nq, counted.shape[-1]).gather(-1, am[..., None]).squeeze(-1)
    )  # [b, h, q]
    count_at = counts[:, None, :].expand(b, h, counts.shape[-1]).gather(-1, am)  # [b, h, q]
    hits = (at & (count_at == rarest[:, None, :])).to(torch.float64)
    return pool(hits, _qualifying(rows, batch, counted))


def rare_word_chance(pattern, batch: PatternBatch) -> Pooled:
    """``1 / (keys counted)`` per qualifying query, for every head (the pattern is not read)."""
    rows = as_rows(pattern)
    counted, _ = counted_keys(rows.shape, batch, rows.device)
    inv = 1.0 / counted.sum(-1).clamp(min=1).to(torch.float64)  # [b, q]
    return pool(
        inv[:, None, :].expand(rows.shape[0], rows.shape[1], -1), _qualifying(rows, batch, counted)
    )


METRIC = Metric.of(
    "rare_word", rare_word, fused=True, chance_fn=rare_word_chance, needs=("argmax", "counts")
)
