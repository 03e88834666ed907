"""Long-context probes: long natural prose, and needles hidden in it.

* :func:`long_text_probe` (decoders and encoders): ``n`` sequences of exactly ``seq_len`` tokens cut
  one after another from the long prose corpus (:mod:`headscope.probes.corpus`), never overlapping
  and never wrapping; a corpus too short for what is asked is refused. Its ``name`` is ``text``:
  every text metric reads it, and ``streaming`` needs it (queries past the sinks and the window).
* :func:`needle_probe`: the copy-paste retrieval test of Wu et al. (2024). Each sequence is
  ``BOS + haystack[:a] + INTRO + needle + ". " + haystack[a:] + REQUEST + needle``: ``K`` random
  word tokens (:func:`needle_vocab`) hidden at depth ``a / len(haystack)``, then asked for and given
  back (teacher forced), ending exactly at ``length`` tokens. The layout is saved per sequence
  (``Probe.needles``), so the answer queries and the key each should copy are known from the ids.

The needle probe is for decoders only: it exists to study what a KV cache must keep.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headscope.errors import HeadscopeError, at_least, setting
from headscope.probes.corpus import long_text, provenance
from headscope.result import Probe

INTRO = " The secret code is:"
REQUEST = " Remember it. The secret code is:"
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)  # where the needle sits in the haystack
NEEDLE_TOKENS = 8

_ENCODED: dict[tuple[int, str], list[int]] = {}  # (id(tokenizer), part) -> token ids of the corpus


def corpus_ids(model, part: str = "scan", progress=None) -> list[int]:
    """The long corpus ``part`` as the model's token ids (encoded once per tokenizer)."""
    key = (id(model.tokenizer), part)
    if key not in _ENCODED:
        _ENCODED[key] = model.encode(long_text(part, progress))
    return _ENCODED[key]


def needle_vocab(model) -> torch.Tensor:
    """Token ids a needle is drawn from: whole words (a space, then 3+ ASCII letters), so that a
    needle reads as words and greedy decoding can give it back token for token; all ordinary
    tokens when a vocabulary has too few such words (tiny test tokenizers)."""
    import re

    vocab = model.ordinary_vocab()
    words = [
        int(i) for i in vocab.tolist() if re.fullmatch(r" [A-Za-z]{3,}", model.decode_one(int(i)))
    ]
    return torch.tensor(words) if len(words) >= 256 else vocab


def needle_min_length(model, k: int) -> int:
    """The shortest sequence a ``k``-token needle fits (with a 1-token haystack)."""
    return (
        2 + len(model.encode(INTRO)) + len(model.encode(".")) + len(model.encode(REQUEST)) + 2 * k
    )


def check_fits(model, seq_len: int, decoder: bool = True) -> None:
    """One line when ``seq_len`` is outside the model's context, or (``decoder``) the model is an
    encoder."""
    if decoder and not model.causal:
        raise HeadscopeError(
            "Long-context probes are for decoders (a KV cache is a decoding structure); "
            f"{model.name} is an encoder."
        )
    if seq_len < 16 or seq_len > model.n_ctx:
        raise HeadscopeError(
            f"{setting('seq_len')} {seq_len} is outside 16..{model.n_ctx} (the model's context); "
            f"use at most {model.n_ctx}."
        )


def long_text_probe(
    model, seq_len: int, n_sequences: int = 1, part: str = "scan", progress=None
) -> Probe:
    """``n_sequences`` distinct windows of real prose, each ``BOS`` + ``seq_len - 1`` corpus
    tokens."""
    check_fits(model, seq_len, decoder=False)
    at_least("n_prompts", n_sequences)
    ids = corpus_ids(model, part, progress)
    # room between BOS/[CLS] and an encoder's final [SEP]
    body = seq_len - 1 - (model.eos_id is not None)
    fits = len(ids) // body
    if n_sequences > fits:
        raise HeadscopeError(
            f"The long prose corpus ({part} part) holds {len(ids)} tokens for this tokenizer: "
            f"enough for {fits} distinct sequences of {seq_len} tokens, not {n_sequences}. Use "
            f"{setting('n_prompts')} {max(fits, 1)} "
            f"or a shorter {setting('seq_len')} (the text is never repeated to fill a sequence)."
        )
    seqs = [model.wrap(ids[i * body : (i + 1) * body]) for i in range(n_sequences)]
    return Probe(
        "text",
        seqs,
        settings={
            "n_prompts": n_sequences,
            "seq_len": seq_len,
            "long": part,
            "corpus": provenance(part),
        },
    )


def needle_probe(
    model,
    lengths: Sequence[int],
    depths: Sequence[float] = DEPTHS,
    k: int = NEEDLE_TOKENS,
    seed: int = 0,
    part: str = "scan",
    progress=None,
) -> Probe:
    """One sequence per (length, depth): a ``k``-token needle at that depth of a haystack of real
    prose, asked for and given back at the end. Haystacks of successive sequences start at
    successive places in the corpus (wrapping to its start only between sequences, never inside
    one)."""
    if k < 1:
        at_least("needle_tokens", k)
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad or not depths:
        raise HeadscopeError(
            f"Needle depths must lie in 0..1 (a fraction of the haystack), got {list(depths)}."
        )
    ids = corpus_ids(model, part, progress)
    intro, request, period = model.encode(INTRO), model.encode(REQUEST), model.encode(".")
    vocab = needle_vocab(model)
    gen = torch.Generator().manual_seed(seed)
    seqs, needles, start = [], [], 0
    for length in lengths:
        check_fits(model, length)
        hay = length - 1 - len(intro) - k - len(period) - len(request) - k
        if hay < 1:
            raise HeadscopeError(
                f"A needle of {k} tokens (given twice, with its "
                f"{len(intro) + len(period) + len(request)}-token question) does not fit {length} "
                f"tokens; use fewer {setting('needle_tokens')} or a longer {setting('seq_len')}."
            )
        if hay > len(ids):
            raise HeadscopeError(
                f"The long prose corpus holds {len(ids)} tokens, fewer than a {hay}-token haystack."
            )
        for depth in depths:
            if start + hay > len(ids):
                # a new sequence may start the corpus again; one sequence never repeats itself
                start = 0
            h = ids[start : start + hay]
            start += hay
            a = int(round(depth * hay))
            needle = vocab[torch.randperm(len(vocab), generator=gen)[:k]].tolist()
            seq = [model.bos_id, *h[:a], *intro, *needle, *period, *h[a:], *request, *needle]
            assert len(seq) == length
            needles.append(
                {
                    "needle_start": 1 + a + len(intro),
                    "answer_start": length - k,
                    "k": k,
                    "depth": float(depth),
                    "length": int(length),
                }
            )
            seqs.append(seq)
    return Probe(
        "needle",
        seqs,
        needles=needles,
        settings={
            "lengths": [int(n) for n in lengths],
            "depths": [float(d) for d in depths],
            "needle_tokens": k,
            "seed": seed,
            "corpus": provenance(part),
        },
    )
