"""Unigram counts of the bundled prose under a model's tokenizer (what ``rare_word`` ranks keys by).

The counts are taken over both parts of the long prose corpus (:mod:`headscope.probes.corpus`: the
scan text and the held-out text, ~140k words), tokenized whole with the model's tokenizer (no
special tokens). A token the prose never holds has count 0 (rarer than any it holds); special
tokens get ``inf`` (never counted as a key). One table per tokenizer, built once per process.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.probes.long import corpus_ids

PARTS = ("scan", "heldout")
_TABLES: dict[int, Tensor] = {}


def unigram_counts(model, progress=None) -> Float[Tensor, " vocab"]:
    """Per token id, its count in the bundled prose (float64; ``inf`` for special tokens)."""
    key = id(model.tokenizer)
    if key not in _TABLES:
        n = max(len(model.tokenizer), int(getattr(model.hf.config, "vocab_size", 0) or 0))
        counts = torch.zeros(n, dtype=torch.float64)
        for part in PARTS:
            ids = torch.tensor(corpus_ids(model, part, progress))
            counts += torch.bincount(ids, minlength=n)[:n].double()
        for i in model.special_ids:
            if 0 <= i < n:
                counts[i] = torch.inf
        _TABLES[key] = counts
    return _TABLES[key]


def key_counts(
    model, tokens: Int[Tensor, "batch pos"], mask: Bool[Tensor, "batch pos"]
) -> Float[Tensor, "batch pos"]:
    """Each key's count (``inf`` on padding and special tokens): ``PatternBatch.key_counts``."""
    table = unigram_counts(model)
    out = table[tokens.clamp(0, len(table) - 1)]
    return torch.where(mask, out, torch.inf)
