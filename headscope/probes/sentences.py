"""Parsed sentences for the syntax census: held-out prose, silver parses, a model's tokens.

The sentences come from the **held-out** part of the long prose corpus
(:mod:`headscope.probes.corpus`: *Alice's Adventures in Wonderland*), the text the long-context
checks read and no scan scores, so the heads are never judged on text that chose them. Each
paragraph is parsed by the pinned spaCy pipeline (:mod:`headscope.probes.parser`), cut into its
sentences, and each sentence is tokenized for the model (:mod:`headscope.probes.words`):

* ``tokenize="natural"`` (default): the sentence tokenized whole, words mapped to tokens by the
  tokenizer's offsets; a sentence in which a token straddles two words (``don't`` -> ``don`` +
  ``'t`` against spaCy's ``do`` + ``n't``; ``!'`` as one token) is left out and counted;
* ``tokenize="words"``: each word tokenized on its own and concatenated, as Clark et al. did for
  BERT: every sentence is kept, and the record says how many token sequences differ from the
  natural tokenization.

Kept: sentences of ``min_words..max_words`` words with no whitespace token, in corpus order, the
first ``n_sentences`` that align. Each is a :class:`Sentence`, saved with the run (one JSON line:
token ids, words, word token spans, heads, relations), so the census can be recomputed from the
run directory alone.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from headscope.errors import HeadscopeError
from headscope.probes.corpus import long_text, provenance
from headscope.probes.words import Aligned, align, align_by_word, check_offsets

TOKENIZE = ("natural", "words")


@dataclass(frozen=True)
class Sentence:
    """One parsed sentence as a model reads it. Word indices are 0-based; ``heads[i] = -1`` for the
    root."""

    index: int  # place among the kept sentences
    text: str
    words: list[str]
    spaces: list[bool]  # a space follows word i in the text
    heads: list[int]  # each word's syntactic head (a word index), -1 for the root
    relations: list[str]  # ClearNLP labels (nsubj, dobj, ...); "ROOT" for the root
    token_ids: list[int]  # BOS + tokens, or [CLS] + tokens + [SEP]
    word_tokens: list[tuple[int, int]]  # per word, its token positions [start, end)

    @classmethod
    def from_json(cls, line: str | dict) -> Sentence:
        d = json.loads(line) if isinstance(line, str) else line
        return cls(
            d["index"],
            d["text"],
            d["words"],
            d["spaces"],
            d["heads"],
            d["relations"],
            d["token_ids"],
            [tuple(s) for s in d["word_tokens"]],
        )


@dataclass
class SentenceSet:
    """The kept sentences and how they were chosen (what a run's metadata records)."""

    sentences: list[Sentence]
    settings: dict = field(default_factory=dict)
    left_out: dict = field(default_factory=dict)  # reason -> sentences

    def save(self, path: Path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for s in self.sentences:
                f.write(json.dumps(asdict(s)) + "\n")


def load_sentences(path: Path) -> list[Sentence]:
    """The sentences a run saved (``syntax_sentences.jsonl``)."""
    with open(path, encoding="utf-8") as f:
        return [Sentence.from_json(line) for line in f if line.strip()]


def parsed_sentences(nlp, text: str) -> Iterator[tuple]:
    """Every sentence of ``text`` (paragraphs split at blank lines) as ``(text, words, spaces,
    char spans, heads, relations)``, spans and heads relative to the sentence, parsed as they are
    asked for; sentences with whitespace tokens are skipped. The spaCy calls live here only."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    for doc in nlp.pipe(paragraphs):
        for sent in doc.sents:
            toks = list(sent)
            if any(t.is_space for t in toks):
                continue
            start = sent.start
            words = [t.text for t in toks]
            spaces = [bool(t.whitespace_) for t in toks]
            spans = [(t.idx - sent.start_char, t.idx - sent.start_char + len(t.text)) for t in toks]
            heads = [-1 if t.head.i == t.i else t.head.i - start for t in toks]
            relations = [t.dep_ for t in toks]
            yield sent.text, words, spaces, spans, heads, relations


def sentence_set(
    model,
    nlp,
    n_sentences: int = 1000,
    min_words: int = 3,
    max_words: int = 60,
    tokenize: str = "natural",
    part: str = "heldout",
    progress=None,
) -> SentenceSet:
    """The first ``n_sentences`` sentences of the held-out prose that align to ``model``'s
    tokens."""
    if tokenize not in TOKENIZE:
        raise HeadscopeError(
            f"Unknown tokenize mode '{tokenize}'; use one of {', '.join(TOKENIZE)}."
        )
    if n_sentences < 1 or min_words < 2 or max_words < min_words:
        raise HeadscopeError(
            f"Need n_sentences >= 1 and 2 <= min_words <= max_words, got {n_sentences}, "
            f"{min_words}, {max_words}."
        )
    check_offsets(model)  # before the parse: a tokenizer without offsets costs nothing
    left: collections.Counter = collections.Counter()
    kept: list[Sentence] = []
    differs = 0
    for text, words, spaces, spans, heads, relations in parsed_sentences(
        nlp, long_text(part, progress)
    ):
        if not min_words <= len(words) <= max_words:
            left[f"not {min_words}..{max_words} words"] += 1
            continue
        if tokenize == "natural":
            got = align(model, text, spans)
        else:
            got = align_by_word(model, words, spaces)
        if isinstance(got, str):
            left[got] += 1
            continue
        if len(got.token_ids) > model.n_ctx:
            left["longer than the context"] += 1
            continue
        if tokenize == "words" and got.token_ids != model.wrap(model.encode(text)):
            differs += 1
        kept.append(_sentence(len(kept), text, words, spaces, heads, relations, got))
        if len(kept) == n_sentences:
            break
    if not kept:
        raise HeadscopeError(
            f"No sentence of the held-out prose aligns to {model.name}'s tokens "
            f"({dict(left)}); try tokenize='words'."
        )
    settings = {
        "n_sentences": n_sentences,
        "min_words": min_words,
        "max_words": max_words,
        "tokenize": tokenize,
        "corpus": provenance(part),
        "kept": len(kept),
    }
    if tokenize == "words":
        settings["differ_from_natural"] = differs
    return SentenceSet(kept, settings, dict(left))


def _sentence(index, text, words, spaces, heads, relations, got: Aligned) -> Sentence:
    return Sentence(
        index,
        text,
        list(words),
        list(spaces),
        list(heads),
        list(relations),
        list(got.token_ids),
        [tuple(s) for s in got.word_tokens],
    )
