"""Scoring a user's own pattern (headscope/metrics/scoring.py) with the metric functions a scan
uses."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.errors import HeadscopeError
from headscope.metrics import get_metric
from headscope.scanner.scoring import score_pattern

# [1, 1, 3, 3]: q=1 and q=2 look one back; q=0 at itself
PREV = torch.tensor([[1.0, 0, 0], [1, 0, 0], [0, 1, 0]])[None, None]


def test_previous_token_on_a_user_pattern():
    s = score_pattern(PREV, "previous_token", causal=True)
    assert s.shape == (1, 1) and s.dtype == torch.float64 and s.item() == 1.0
    assert headscope.score_pattern is score_pattern


def test_three_dim_pattern_is_one_sequence():
    three = torch.stack([PREV[0, 0], torch.eye(3)])  # [head=2, q, k]
    assert score_pattern(three, "previous_token", causal=True).tolist() == [[1.0, 0.0]]


def test_lengths_mark_padding():
    # with 2 real tokens only q=1 counts: it attends to key 0 (sink 1, previous token 1)
    assert score_pattern(PREV[0], "sink", causal=True, lengths=[2]).item() == 1.0
    assert score_pattern(PREV, "sink", causal=True).item() == 0.5
    assert score_pattern(PREV, "sink", causal=True, lengths=torch.tensor([2])).item() == 1.0


def test_metric_object_or_name():
    m = get_metric("sink")
    assert torch.equal(
        score_pattern(PREV, m, causal=True), score_pattern(PREV, "sink", causal=True)
    )
    with pytest.raises(HeadscopeError, match=r"^Unknown metric 'snik'\. Did you mean: sink\?"):
        score_pattern(PREV, "snik", causal=True)


def test_separator_by_id():
    ids = torch.tensor([[5, 7, 9]])
    sep = score_pattern(PREV, "separator", causal=True, token_ids=ids, separator_id=7)
    # q=1 and q=2 see the separator at k=1; q=1 puts 0 on it, q=2 puts 1: mean 0.5
    assert sep.item() == 0.5


def test_separator_and_punctuation_need_token_ids():
    with pytest.raises(HeadscopeError, match="needs key flags 'separator'"):
        score_pattern(PREV, "separator", causal=True)
    with pytest.raises(HeadscopeError, match="needs key flags 'punctuation'"):
        score_pattern(
            PREV, "punctuation", causal=True, token_ids=torch.tensor([[5, 7, 9]]), separator_id=7
        )


class FakeTokenizer:
    def __init__(self, vocab: dict[int, str], sep_token_id=None, eos_token_id=None):
        self.vocab, self.sep_token_id, self.eos_token_id = vocab, sep_token_id, eos_token_id

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)


def test_tokenizer_gives_separator_and_punctuation():
    ids = torch.tensor([[0, 1, 2]])
    # eos stands in for sep
    tok = FakeTokenizer({0: "<s>", 1: ".", 2: " cat"}, sep_token_id=None, eos_token_id=1)
    assert score_pattern(PREV, "separator", causal=True, token_ids=ids, tokenizer=tok).item() == 0.5
    assert (
        score_pattern(PREV, "punctuation", causal=True, token_ids=ids, tokenizer=tok).item() == 0.5
    )
    tok2 = FakeTokenizer({0: "<s>", 1: ".", 2: " cat"}, sep_token_id=2, eos_token_id=1)
    # sep at k=2: only q=2 sees it and puts 0 there
    assert (
        score_pattern(PREV, "separator", causal=True, token_ids=ids, tokenizer=tok2).item() == 0.0
    )
    # an explicit separator_id wins over the tokenizer's
    assert (
        score_pattern(
            PREV, "separator", causal=True, token_ids=ids, tokenizer=tok2, separator_id=1
        ).item()
        == 0.5
    )


def test_token_ids_of_one_sequence_may_be_flat():
    flat = score_pattern(PREV[0], "separator", causal=True, token_ids=[5, 7, 9], separator_id=7)
    assert flat.item() == 0.5


def test_repeat_metrics_need_repeat_len():
    L = 2  # BOS r1 r2 r1 r2: q=3 -> key 2, q=4 -> key 3
    A = torch.zeros(1, 1, 5, 5)
    A[..., 0] = 1.0
    A[0, 0, 3] = torch.tensor([0, 0, 1.0, 0, 0])
    A[0, 0, 4] = torch.tensor([0, 0, 0, 1.0, 0])
    assert score_pattern(A, "induction", causal=True, repeat_len=L).item() == 1.0
    assert score_pattern(A, "duplicate_token", causal=True, repeat_len=L).item() == 0.0
    with pytest.raises(HeadscopeError, match=r"need PatternBatch\.repeat_len \(L >= 1\)"):
        score_pattern(A, "induction", causal=True)


def test_pooled_weights_sequences_by_their_queries():
    """pooled = sum of totals / sum of counts, not the mean of per-sequence scores."""
    A = torch.zeros(2, 1, 5, 5)
    A[0, 0, :, 0] = 1.0  # sequence 0: 4 real tokens, all on the sink -> 3 queries score 1
    A[1, 0, :, 1] = 1.0  # sequence 1: 2 real tokens, nothing on the sink -> 1 query scores 0
    per_seq = score_pattern(A, "sink", causal=False, lengths=[4, 2])
    assert per_seq.tolist() == [[1.0], [0.0]]
    pooled = score_pattern(A, "sink", causal=False, lengths=[4, 2], pooled=True)
    assert pooled.shape == (1,) and pooled.item() == pytest.approx(3 / 4)


def test_double_precision_pattern_is_accepted():
    assert score_pattern(PREV.double(), "previous_token", causal=True).item() == 1.0


def test_no_qualifying_query_is_nan():
    A = torch.ones(1, 1, 1, 1)
    assert torch.isnan(score_pattern(A, "previous_token", causal=True)).all()
