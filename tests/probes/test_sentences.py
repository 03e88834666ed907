"""Parsed held-out sentences aligned to a model's tokens (natural and word-by-word tokenization)."""

import pytest

from headscope.errors import HeadscopeError
from headscope.probes import parser
from headscope.probes.sentences import load_sentences, sentence_set

pytestmark = pytest.mark.skipif(
    __import__("importlib").util.find_spec("spacy") is None,
    reason="spaCy is not installed: pip install 'headscope[syntax]' (it is part of the dev extra)",
)


@pytest.fixture(scope="module")
def nlp():
    return parser.load_parser()


def test_sentences_align_every_token_once_and_save(tiny_gpt2, nlp, tmp_path):
    ss = sentence_set(tiny_gpt2, nlp, n_sentences=20)
    assert len(ss.sentences) == 20 and ss.settings["corpus"]["part"] == "heldout"
    for s in ss.sentences:
        assert len(s.words) == len(s.heads) == len(s.relations) == len(s.word_tokens)
        assert sum(1 for h in s.heads if h < 0) == 1  # one root per sentence
        covered = [t for a, b in s.word_tokens for t in range(a, b)]
        assert covered == list(range(1, len(s.token_ids)))  # every token but BOS, once, in order
        assert s.token_ids == tiny_gpt2.wrap(tiny_gpt2.encode(s.text))
    ss.save(tmp_path / "s.jsonl")
    assert load_sentences(tmp_path / "s.jsonl") == ss.sentences


def test_by_word_tokenization_keeps_sentences_the_natural_one_leaves_out(tiny_gpt2, nlp):
    natural = sentence_set(tiny_gpt2, nlp, n_sentences=40)
    by_word = sentence_set(tiny_gpt2, nlp, n_sentences=40, tokenize="words")
    assert (
        "differ_from_natural" in by_word.settings and "differ_from_natural" not in natural.settings
    )
    assert sum(by_word.left_out.values()) <= sum(natural.left_out.values())
    assert not any("straddles" in k for k in by_word.left_out)
    for s in by_word.sentences:  # each word's tokens decode to the word (after its space)
        for w, (a, b) in zip(s.words, s.word_tokens, strict=True):
            assert tiny_gpt2.tokenizer.decode(s.token_ids[a:b]).strip() == w


def test_bad_settings_are_one_line(tiny_gpt2, nlp):
    with pytest.raises(HeadscopeError, match="Unknown tokenize mode"):
        sentence_set(tiny_gpt2, nlp, tokenize="chars")
    with pytest.raises(HeadscopeError, match="n_sentences"):
        sentence_set(tiny_gpt2, nlp, n_sentences=0)
