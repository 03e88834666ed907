"""Word-level attention maps (Clark et al. 2019, section 4.2), from token-level patterns.

A parser's words and a model's tokens differ: one word may be split into several tokens. Clark
et al. convert each token x token map to a word x word map (their ``get_word_word_attention``,
mode ``mean``, the one the paper uses):

* attention **to** a split word is the **sum** over its tokens (the row still sums to 1 over words
  and the special tokens);
* attention **from** a split word is the **mean** over its tokens' rows.

Special tokens ([CLS]/[SEP], BOS) are no word: their columns and rows are left out of the map, so
they can never be predicted (Clark slices them off before the arg-max). With ``F`` = ``[word,
token]`` (``1/|w|`` on word ``w``'s tokens) and ``T`` = ``[token, word]`` (1 on its tokens), the map
is ``F A T``.

Words are mapped to tokens by character offsets (a fast tokenizer's ``return_offsets_mapping``):
a token belongs to the one word its non-space characters fall in (a token of whitespace alone, to
the word after it). A sentence in which a token straddles two words, or lies outside every word,
has no exact word map and is left out (the caller counts how many); a tokenizer without offsets
is refused in one line.

>>> # tokens: BOS w0 w1a w1b; from w1 = mean of rows 2, 3; to w1 = sum of columns 2, 3
>>> A = torch.tensor([[1., 0, 0, 0], [.5, .5, 0, 0], [.2, .3, .5, 0], [.1, .2, .3, .4]])
>>> word_attention(A, [(1, 2), (2, 4)]).float()
tensor([[0.5000, 0.0000],
        [0.2500, 0.6000]])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.errors import HeadscopeError

Spans = Sequence[tuple[int, int]]  # per word, its token positions [start, end) in the sequence


@dataclass(frozen=True)
class Aligned:
    """One sentence as a model's tokens, with the token positions of each parser word."""

    token_ids: list[
        int
    ]  # the whole sequence: BOS + tokens (decoders), [CLS] + tokens + [SEP] (encoders)
    word_tokens: list[tuple[int, int]]  # per word, [start, end) positions in token_ids


def check_offsets(model) -> None:
    """One line when ``model``'s tokenizer cannot map characters to tokens (no offsets)."""
    tok = model.tokenizer
    try:
        enc = tok("ab cd", add_special_tokens=False, return_offsets_mapping=True)
        ok = len(enc["offset_mapping"]) == len(enc["input_ids"])
    # noqa: BLE001 - Python ("slow") tokenizers raise NotImplementedError, others vary
    except Exception:
        ok = False
    if not ok:
        raise HeadscopeError(
            f"{model.name}'s tokenizer ({type(tok).__name__}) cannot map words to tokens: "
            "word-level attention needs character offsets (a fast tokenizer's "
            "return_offsets_mapping); load the model with its tokenizer.json."
        )


def align(model, text: str, words: Sequence[tuple[int, int]]) -> Aligned | str:
    """``text`` tokenized whole, and each word's token span; or a few words saying why not.

    ``words``: per word, its ``(start, end)`` character span in ``text``, in order, not overlapping.
    The text is tokenized with offsets (no special tokens), then wrapped as the model wraps a
    sequence (:meth:`~headscope.models.model.Model.wrap`): spans count the one leading BOS / [CLS].
    """
    check_offsets(model)
    enc = model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    owner = []  # per token, the word it belongs to
    w, pending = 0, 0  # pending: whitespace-only tokens waiting for the word they precede
    for a, b in offsets:
        piece = text[a:b]
        a += len(piece) - len(
            piece.lstrip()
        )  # a byte-level BPE token carries the space before its word
        b -= len(piece) - len(piece.rstrip())
        if b <= a:  # only whitespace: part of the word that follows (the BPE convention, " word")
            pending += 1
            continue
        while w < len(words) and words[w][1] <= a:
            w += 1
        if w == len(words) or not (words[w][0] <= a and b <= words[w][1]):
            inside = w < len(words) and a < words[w][1] and words[w][0] < b
            return "a token straddles two words" if inside else "a token lies outside every word"
        owner += [w] * (pending + 1)
        pending = 0
    if pending:
        return "a token lies outside every word"  # trailing whitespace
    return _spans(model, ids, owner, len(words))


def align_by_word(model, words: Sequence[str], spaces: Sequence[bool]) -> Aligned | str:
    """Clark et al.'s own alignment: each word tokenized on its own (after a space when
    ``spaces[i - 1]``, the text had one), the sequence their concatenation. Every sentence aligns,
    but where a natural tokenization merges across words (``don't``, ``!'``) the model reads
    tokens it would not have been given for the sentence as a whole."""
    check_offsets(model)
    ids, owner = [], []
    for i, word in enumerate(words):
        piece = (" " if i and spaces[i - 1] else "") + word
        got = model.encode(piece)
        ids += got
        owner += [i] * len(got)
    return _spans(model, ids, owner, len(words))


def _spans(model, ids: list[int], owner: list[int], n_words: int) -> Aligned | str:
    spans = []
    for i in range(n_words):
        pos = [t for t, o in enumerate(owner) if o == i]
        if not pos:
            return "a word has no token of its own"
        spans.append((pos[0] + 1, pos[-1] + 2))  # + 1: the leading BOS / [CLS]
    return Aligned(model.wrap(ids), spans)


def word_matrices(word_tokens: Spans, n_tokens: int, dtype=torch.float64) -> tuple[Tensor, Tensor]:
    """``(F, T)``: ``F`` ``[word, token]`` averages a word's token rows, ``T`` ``[token, word]``
    sums its token columns. Tokens of no word (special tokens) get no weight in either."""
    n_words = len(word_tokens)
    F = torch.zeros(n_words, n_tokens, dtype=dtype)
    T = torch.zeros(n_tokens, n_words, dtype=dtype)
    for w, (s, e) in enumerate(word_tokens):
        F[w, s:e] = 1.0 / (e - s)
        T[s:e, w] = 1.0
    return F, T


def word_attention(
    pattern: Float[Tensor, "*heads token token"], word_tokens: Spans
) -> Float[Tensor, "*heads word word"]:
    """The word x word map ``F A T`` of a token x token pattern (any leading axes, e.g. layer,
    head).

    Computed in float64: sums over a split word's tokens are exact to float rounding, so that two
    computations of the same pattern agree on which word is attended most."""
    n = pattern.shape[-1]
    F, T = word_matrices(word_tokens, n)
    p = pattern.double()
    return F.to(p.device) @ p @ T.to(p.device)  # [..., word, token] @ ... -> [..., word, word]
