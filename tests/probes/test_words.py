"""Word-level attention maps: the matrix form equals a direct loop; alignment by offsets."""

import pytest
import torch

from headscope.errors import HeadscopeError
from headscope.probes.words import align, align_by_word, check_offsets, word_attention


def loop_word_attention(A, spans):
    """Clark et al.'s definition written out: to a word = sum over its tokens, from = mean."""
    W = len(spans)
    out = [[0.0] * W for _ in range(W)]
    for i, (si, ei) in enumerate(spans):
        for j, (sj, ej) in enumerate(spans):
            total = 0.0
            for q in range(si, ei):
                total += sum(float(A[q, k]) for k in range(sj, ej))
            out[i][j] = total / (ei - si)
    return torch.tensor(out, dtype=torch.float64)


def test_word_attention_equals_a_direct_loop_with_split_words():
    gen = torch.Generator().manual_seed(0)
    n = 9  # [CLS] w0 w1a w1b w1c w2 w3a w3b [SEP]
    spans = [(1, 2), (2, 5), (5, 6), (6, 8)]
    A = torch.rand(2, 3, n, n, generator=gen).softmax(-1)  # [layer, head, n, n]
    got = word_attention(A, spans)  # [layer, head, word, word]
    assert got.shape == (2, 3, 4, 4)
    for la in range(2):
        for h in range(3):
            want = loop_word_attention(A[la, h], spans)
            torch.testing.assert_close(got[la, h], want, rtol=0, atol=1e-12)
    # rows sum to 1 minus what the special tokens took: nothing is lost or counted twice
    special = A[..., :, [0, n - 1]].sum(-1)  # [layer, head, token]
    F = torch.zeros(4, n, dtype=torch.float64)
    for w, (s, e) in enumerate(spans):
        F[w, s:e] = 1 / (e - s)
    torch.testing.assert_close(got.sum(-1), 1 - (F @ special.double()[..., None]).squeeze(-1))


def test_align_by_offsets_on_a_bpe_tokenizer(tiny_gpt2):
    text = "The cat sat on the mat."
    words = [(0, 3), (4, 7), (8, 11), (12, 14), (15, 18), (19, 22), (22, 23)]
    got = align(tiny_gpt2, text, words)
    assert not isinstance(got, str), got
    assert got.token_ids[0] == tiny_gpt2.bos_id
    assert got.token_ids[1:] == tiny_gpt2.encode(text)
    # every token of the text belongs to exactly one word, in order, none left over
    covered = [t for s, e in got.word_tokens for t in range(s, e)]
    assert covered == list(range(1, len(got.token_ids)))
    for (s, e), (a, b) in zip(got.word_tokens, words, strict=True):
        assert tiny_gpt2.tokenizer.decode(got.token_ids[s:e]).strip() == text[a:b]


def test_align_refuses_a_token_across_two_words(tiny_gpt2):
    text = "catsat"
    got = align(tiny_gpt2, text, [(0, 3), (3, 6)])
    toks = tiny_gpt2.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    crosses = any(a < 3 < b for a, b in toks)
    assert (got == "a token straddles two words") == crosses
    assert crosses or not isinstance(got, str)


def test_align_on_an_encoder_wraps_cls_and_sep(tiny_bert):
    text = "the cat sat"
    got = align(tiny_bert, text, [(0, 3), (4, 7), (8, 11)])
    assert not isinstance(got, str), got
    assert got.token_ids[0] == tiny_bert.bos_id and got.token_ids[-1] == tiny_bert.eos_id
    assert got.word_tokens[0][0] == 1 and got.word_tokens[-1][1] == len(got.token_ids) - 1


def test_align_by_word_keeps_every_word(tiny_gpt2):
    got = align_by_word(tiny_gpt2, ["do", "n't", "go", "!"], [False, True, False, False])
    assert not isinstance(got, str)
    assert len(got.word_tokens) == 4
    assert tiny_gpt2.tokenizer.decode(got.token_ids[1:]) == "don't go!"


class NoOffsets:
    """A tokenizer as Python ("slow") tokenizers answer an offsets request."""

    def __call__(self, text, return_offsets_mapping=False, **kwargs):
        if return_offsets_mapping:
            raise NotImplementedError(
                "return_offset_mapping is not available when using Python tokenizers"
            )
        return {"input_ids": [1, 2]}


def test_a_tokenizer_without_offsets_is_refused_in_one_line(tiny_gpt2):
    from dataclasses import replace

    model = replace(tiny_gpt2, tokenizer=NoOffsets())
    for call in (
        lambda: check_offsets(model),
        lambda: align(model, "ab", [(0, 2)]),
        lambda: align_by_word(model, ["ab"], [False]),
    ):
        with pytest.raises(HeadscopeError) as err:
            call()
        assert "cannot map words to tokens" in str(err.value) and "\n" not in str(err.value)
