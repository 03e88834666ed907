"""Clark et al.'s syntax protocol is exact on hand-built heads (docs/census.md)."""

import numpy as np
import pytest
import torch

from headscope.metrics.syntax import OFFSETS, accuracy_table, judge, predictions
from headscope.probes.sentences import Sentence
from headscope.probes.words import word_attention

# (words, heads (-1 = root), relations, tokens per word): roots sit at index >= 3, the first word's
# head is not word 1 and the last word's is not word 0, so that no edge case of the offset
# baseline's clipping can hold by accident
RAW = [
    (
        ["The", "old", "cat", "chased", "a", "mouse", "quickly", "."],
        [2, 2, 3, -1, 5, 3, 3, 3],
        ["det", "amod", "nsubj", "ROOT", "det", "dobj", "advmod", "punct"],
        [1, 1, 1, 2, 1, 1, 3, 1],
    ),
    (
        ["Yesterday", "the", "tall", "man", "bought", "two", "red", "apples", "."],
        [4, 3, 3, 4, -1, 7, 7, 4, 4],
        ["npadvmod", "det", "amod", "nsubj", "ROOT", "nummod", "amod", "dobj", "punct"],
        [2, 1, 1, 1, 2, 1, 1, 2, 1],
    ),
    (
        ["Then", "the", "king", "'s", "hat", "fell", "off", "."],
        [5, 2, 4, 2, 5, -1, 5, 5],
        ["advmod", "det", "poss", "case", "nsubj", "ROOT", "prt", "punct"],
        [1, 1, 1, 1, 2, 1, 1, 1],
    ),
]


def sentences(causal: bool) -> list[Sentence]:
    out = []
    for i, (words, heads, rels, n_tok) in enumerate(RAW):
        spans, at = [], 1  # position 0: BOS / [CLS]
        for n in n_tok:
            spans.append((at, at + n))
            at += n
        ids = list(range(10, 10 + at)) + (
            [] if causal else [99]
        )  # [SEP] at the end of an encoder's
        out.append(
            Sentence(i, " ".join(words), words, [True] * len(words), heads, rels, ids, spans)
        )
    return out


def pattern(s: Sentence, causal: bool, rule) -> torch.Tensor:
    """Token pattern ``[n, n]`` of a head whose word ``i`` spreads ``rule(i) = {word: mass}`` over
    those words (each word's mass split evenly over its tokens); what is left goes to position 0."""
    n = len(s.token_ids)
    A = torch.zeros(n, n, dtype=torch.float64)
    A[:, 0] = 1.0
    for i, (a, b) in enumerate(s.word_tokens):
        targets = rule(i)
        assert not causal or all(t < i for t in targets)  # a causal head never looks ahead
        for q in range(a, b):
            A[q, 0] = 1.0 - sum(targets.values())
            for t, mass in targets.items():
                ta, tb = s.word_tokens[t]
                A[q, ta:tb] = mass / (tb - ta)
    return A


def heads_for(s: Sentence, causal: bool, k: int, m: int, possessive_to_head: bool = False):
    W = len(s.words)
    ok = (lambda t, i: t < i) if causal else (lambda t, i: t != i)

    def syntactic(i):  # dep->head: every word attends to its head (where it can)
        t = s.heads[i]
        if (
            possessive_to_head
            and s.relations[i] == "case"
            and i > 0
            and s.relations[i - 1] == "poss"
        ):
            t = s.heads[
                i - 1
            ]  # the 's attends to the possessor's head (what Clark's poss case reads)
        return {t: 1.0} if t >= 0 and ok(t, i) else {}

    def dependents(j):  # head->dep: every word spreads over its dependents equally (where it can)
        deps = [i for i in range(W) if s.heads[i] == j and ok(i, j)]
        return {i: 1.0 / len(deps) for i in deps} if deps else {}

    def offset(i):  # word i attends to word i + k, clipped to the sentence (never itself)
        t = min(max(i + k, 0), W - 1)
        return {t: 1.0} if ok(t, i) and 0 <= i + k or (i + k > W - 1 and ok(W - 1, i)) else {}

    def back(j):  # word j attends to word j - m: for word i, the word attending most is i + m
        return {j - m: 1.0} if j - m >= 0 else {}

    return [syntactic, dependents, offset, back]


def run(causal: bool, k: int, m: int, **kw):
    sents = sentences(causal)
    preds = []
    for s in sents:
        A = torch.stack([pattern(s, causal, rule) for rule in heads_for(s, causal, k, m, **kw)])[
            None
        ]  # [1, 4, n, n]
        preds.append(predictions(word_attention(A, s.word_tokens), causal).to(torch.int16))
    return sents, judge(sents, preds, causal)


HAND_BUILT = [
    (c, k, m)
    for c in (False, True)
    for k, m in ((-1, 1), (-2, 2), (-3, 1), (1, 2), (2, 1))
    if not (c and k > 0)
]  # a causal head cannot attend to later words


@pytest.mark.parametrize("causal,k,m", HAND_BUILT)
def test_hand_built_heads_are_scored_exactly(causal, k, m):
    sents, pairs = run(causal, k, m)
    d0, d1 = pairs.direction == 0, pairs.direction == 1
    poss_case = np.isin(pairs.relation, ["poss"])  # Clark's special case reads the 's instead
    root = pairs.target < 0
    # the head attending to each word's syntactic head: every dep->head pair right but the root
    assert pairs.heads[d0 & ~root & ~poss_case, 0].all()
    assert not pairs.heads[d0 & root, 0].any()
    # the head attending to its dependents: every head->dep pair right
    assert pairs.heads[d1 & ~root & ~poss_case, 1].all()
    # fixed-offset heads give exactly the verdicts of their offset baseline, pair by pair
    kept_k = d0 if causal or k < 0 else d0 | d1
    np.testing.assert_array_equal(pairs.heads[d0, 2], pairs.offsets[d0, OFFSETS.index(k)])
    np.testing.assert_array_equal(pairs.heads[d1, 3], pairs.offsets[d1, OFFSETS.index(m)])
    assert kept_k.any()
    # decoders keep only visible pairs: dep->head with the head earlier, head->dep with it later
    if causal:
        for s in sents:
            W = len(s.words)
            for d, keep in ((0, lambda i, y: 0 <= y < i), (1, lambda i, y: y > i)):
                want = sum(
                    keep(i + (s.relations[i] == "poss" and i + 1 < W and s.words[i + 1] == "'s"), y)
                    for i, y in enumerate(s.heads)
                )
                got = int(((pairs.sentence == s.index) & (pairs.direction == d)).sum())
                assert got == want
    else:
        assert d0.sum() == d1.sum() == sum(len(s.words) for s in sents)


@pytest.mark.parametrize("causal", [False, True])
def test_table_accuracies_and_counts(causal):
    sents, pairs = run(causal, -1, 1)
    table, per_head = accuracy_table(pairs, len(sents), 1, 4, causal, min_count=1, resamples=200)
    # the syntactic head scores 1.0 on every relation it can be judged on (not poss: Clark's case)
    mine = per_head[
        (per_head.layer == 0) & (per_head.head == 0) & (per_head.direction == "dep->head")
    ]
    for row in mine.itertuples():
        if row.relation not in ("all", "poss", "ROOT"):
            assert row.accuracy == 1.0, row
    # the offset head's accuracy is the offset baseline's (offset -1 is this head's offset)
    off = (
        per_head[(per_head.head == 2) & (per_head.direction == "dep->head")]
        .set_index("relation")
        .accuracy
    )
    for rel, acc in off.items():
        sel = (pairs.direction == 0) & ((pairs.relation == rel) if rel != "all" else True)
        assert acc == pytest.approx(pairs.offsets[sel, OFFSETS.index(-1)].mean(), abs=1e-12)
    # "all" counts every word for an encoder (a root is never right), visible pairs for a decoder
    n_words = sum(len(s.words) for s in sents)
    all0 = table[(table.relation == "all") & (table.direction == "dep->head")].iloc[0]
    if not causal:
        assert all0["count"] == n_words
        assert all0["accuracy"] == pytest.approx(
            (n_words - 3 - 1) / n_words
        )  # 3 roots, 1 poss judged by 's
        either = table[(table.relation == "all") & (table.direction == "either")].iloc[0]
        assert either["accuracy"] >= all0["accuracy"]
    else:
        assert all0["count"] == int((pairs.direction == 0).sum())
    for row in table.itertuples():
        assert row.ci_low <= row.accuracy <= row.ci_high
        assert row.difference == pytest.approx(row.accuracy - row.baseline)
        assert row.difference_ci_low <= row.difference <= row.difference_ci_high


def test_clarks_possessive_case():
    """A poss word is judged by the prediction of the 's after it (Clark et al., section 4.2)."""
    _, pairs = run(False, -1, 1, possessive_to_head=True)
    poss = (pairs.relation == "poss") & (pairs.direction == 0)
    assert pairs.heads[poss, 0].all()  # the 's attends to the possessed noun: counted right
    _, plain = run(False, -1, 1)
    assert not plain.heads[(plain.relation == "poss") & (plain.direction == 0), 0].any()


def test_predictions_exclude_self_and_respect_causality():
    M = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.3, 0.3, 0.4]], dtype=torch.float64)
    enc = predictions(M, causal=False)
    assert enc[0].tolist() == [1, 0, 0]  # dep->head: self excluded, ties go to the first word
    assert enc[1].tolist() == [2, 2, 1]  # head->dep: the word attending most to each word
    dec = predictions(M, causal=True)
    assert dec[0].tolist() == [-1, 0, 0]  # word 0 sees no earlier word
    assert dec[1].tolist() == [2, 2, -1]  # only later words can attend to a word
