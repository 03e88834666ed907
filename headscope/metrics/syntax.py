"""Syntax heads: Clark et al. (2019, section 4.2) protocol, on silver parses.

Each head is a classifier. For a word ``i`` of a sentence, on the head's word-level map ``M``
(:func:`headscope.probes.words.word_attention`; special tokens are no word, so never predicted):

* ``dep->head``: the prediction is the word ``i`` attends to most, ``argmax_j M[i, j]``;
* ``head->dep`` (Clark's ``transpose`` mode): the word that attends to ``i`` most, ``argmax_j M[j,
  i]``;

with ``j != i`` (self excluded, as Clark sets the diagonal to 0; ties: the first word). It is
**correct** when the prediction is ``i``'s syntactic head. Accuracy for relation ``r`` = correct /
words with relation ``r``; ``all`` = over every word (the root and ``punct`` included; a root word
is never correct in an encoder, as in Clark's code). Clark's special case for ``poss``: when the
word after a possessor is ``'s`` (or ``s'``) and the possessor's prediction is not the sentence's
last word, the prediction read is that of the ``'s``.

**Decoders** see only earlier words. A (query word, target) pair counts only when the target is
visible from the query: ``dep->head`` keeps words whose head comes before them (candidates ``j <
i``), ``head->dep`` words whose head comes after them (candidates ``j > i``: the words that can
attend to ``i``); the root and the ``'s`` special case are judged the same way (the query is the
word whose prediction is read). Each (relation, direction) reports how many pairs it keeps.

**Baseline**: a fixed offset ``k`` predicts word ``i + k`` (clipped to the sentence, ``-1``
reading as the root, as Clark's ``offset_predictor``), ``k`` in Clark's ``-3..2``, the best
``k`` chosen on the same pairs. **Chance**: a head picking one candidate uniformly, the mean of
``1/candidates`` over the pairs. **Interval**: a seeded bootstrap over sentences of the chosen
head's accuracy, the baseline's, and their paired difference (the choice itself is not resampled).

Labels are **silver** (:data:`headscope.probes.parser.PARSER`), never gold.

Pure: word maps in, verdicts and tables out; no model. A sentence is anything with ``index``,
``words``, ``heads`` and ``relations`` (:class:`headscope.probes.sentences.Sentence`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from headscope.result import head_name
from headscope.uncertainty import bootstrap

DIRECTIONS = ("dep->head", "head->dep")
OFFSETS = tuple(range(-3, 3))  # Clark's baseline offsets, -3..2
MIN_COUNT = 100  # relations in the table: at least this many words (Clark's cut)
POSSESSIVE = ("'s", "s'")


# ------------------------------------------------------------------------------ predictions


def predictions(
    word_map: Float[Tensor, "*heads word word"], causal: bool
) -> Int[Tensor, "*heads 2 word"]:
    """Each head's predicted word for every word, in both directions (-1: no candidate).

    ``[..., 0, i]`` = ``argmax_j M[i, j]`` (dep->head), ``[..., 1, i]`` = ``argmax_j M[j, i]``
    (head->dep), over ``j != i`` (encoders), ``j < i`` / ``j > i`` (decoders, resp.)."""
    W = word_map.shape[-1]
    i = torch.arange(W)
    dirs = []
    for d, m in enumerate(
        (word_map, word_map.transpose(-1, -2))
    ):  # row i of m: what predicts for word i
        if causal:
            cand = (
                i[None, :] < i[:, None] if d == 0 else i[None, :] > i[:, None]
            )  # [word i, word j]
        else:
            cand = i[None, :] != i[:, None]
        m = m.masked_fill(~cand.to(m.device), float("-inf"))
        pred = m.argmax(-1)  # [..., word]: the first maximum
        dirs.append(torch.where(cand.any(-1).to(pred.device), pred, -1))
    return torch.stack(dirs, -2)  # [..., 2, word]


# ------------------------------------------------------------------------------ evaluation


@dataclass
class Pairs:
    """Every (word, direction) pair the protocol judges, flat over the sentences."""

    sentence: np.ndarray  # [pair] sentence index
    relation: np.ndarray  # [pair] relation label
    direction: np.ndarray  # [pair] 0 dep->head, 1 head->dep
    target: np.ndarray  # [pair] the head word (-1: root)
    chance: np.ndarray  # [pair] 1 / candidates of the query word
    heads: np.ndarray  # [pair, layer * head] bool: the head's prediction is the target
    offsets: np.ndarray  # [pair, offset] bool: offset k's prediction is the target


def judge(
    sentences: Sequence, preds: Sequence[Tensor], causal: bool, offsets: Sequence[int] = OFFSETS
) -> Pairs:
    """Every kept pair of the protocol (see the module docstring), with each predictor's verdict."""
    cols: dict[str, list] = {
        k: [] for k in ("sentence", "relation", "direction", "target", "chance", "heads", "offsets")
    }
    for s, p in zip(sentences, preds, strict=True):
        W = len(s.words)
        p = p.reshape(-1, 2, W).numpy().astype(np.int64)  # [layer * head, 2, word]
        i = np.arange(W)
        base = np.stack([np.clip(i + k, -1, W - 1) for k in offsets])  # [offset, word]
        y = np.array(s.heads)
        special = np.array(
            [
                s.relations[w] == "poss" and w + 1 < W and s.words[w + 1] in POSSESSIVE
                for w in range(W)
            ]
        )
        query = np.where(special, i + 1, i)  # the word whose prediction is read (Clark's poss case)
        for d in (0, 1):
            if causal:
                keep = (y >= 0) & (y < query) if d == 0 else y > query
                n_cand = query if d == 0 else W - 1 - query
            else:
                keep = np.ones(W, bool)
                n_cand = np.full(W, W - 1)
            heads = _read(p[:, d], special, W)  # [layer * head, word]
            offs = _read(base, special, W)  # [offset, word]
            w = np.nonzero(keep)[0]
            cols["sentence"].append(np.full(len(w), s.index))
            cols["relation"].append(np.array(s.relations, dtype=object)[w])
            cols["direction"].append(np.full(len(w), d))
            cols["target"].append(y[w])
            cols["chance"].append(1.0 / np.maximum(n_cand[w], 1))
            cols["heads"].append((heads[:, w] == y[w]).T)
            cols["offsets"].append((offs[:, w] == y[w]).T)
    return Pairs(*(np.concatenate(cols[k]) for k in cols))


def _read(pred: np.ndarray, special: np.ndarray, W: int) -> np.ndarray:
    """``[predictor, word]`` -> the prediction Clark's evaluation reads for each word: that of the
    next word (``'s``) for a possessor whose own prediction is not the last word."""
    nxt = np.concatenate(
        [pred[:, 1:], pred[:, -1:]], 1
    )  # prediction of word i + 1 (unused at the end)
    use_next = special[None, :] & (pred != W - 1)
    return np.where(use_next, nxt, pred)


def accuracy_table(
    pairs: Pairs,
    n_sentences: int,
    n_layers: int,
    n_heads: int,
    causal: bool,
    offsets: Sequence[int] = OFFSETS,
    min_count: int = MIN_COUNT,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(table, per_head)``: Clark's table, and every head's accuracy per (relation, direction).

    Table rows: ``all`` then each relation (not ROOT / punct) with at least ``min_count`` words,
    most frequent first; one row per direction (a decoder's direction only when it keeps at least
    ``min_count`` pairs of the relation), and for
    encoders (both directions judge the same pairs) an ``either`` row: the best head over both
    directions against the one baseline, as in Clark's Table 1."""
    relations = pd.Series(pairs.relation[pairs.direction == 0]).value_counts()
    if causal:  # both directions count for a decoder (they keep different pairs)
        relations = pd.Series(pairs.relation).value_counts()
    names = ["all"] + [
        r for r, c in relations.items() if r not in ("ROOT", "punct") and c >= min_count
    ]
    rows, per_head = [], []
    for rel in names:
        found = {}
        for d, direction in enumerate(DIRECTIONS):
            sel = (pairs.direction == d) & ((pairs.relation == rel) if rel != "all" else True)
            if not sel.any() or (causal and rel != "all" and sel.sum() < min_count):
                # a decoder's direction that keeps too few pairs of this relation is left out
                continue
            acc = pairs.heads[sel].mean(0)  # [layer * head]
            base = pairs.offsets[sel].mean(0)  # [offset]
            found[direction] = (sel, acc, base)
            lo, hi = _head_intervals(
                pairs.heads[sel], pairs.sentence[sel], n_sentences, resamples, seed
            )
            for k in range(n_layers * n_heads):
                per_head.append(
                    {
                        "relation": rel,
                        "direction": direction,
                        "layer": k // n_heads,
                        "head": k % n_heads,
                        "accuracy": float(acc[k]),
                        "ci_low": float(lo[k]),
                        "ci_high": float(hi[k]),
                        "count": int(sel.sum()),
                        "chance": float(pairs.chance[sel].mean()),
                        "baseline": float(base.max()),
                        "offset": int(offsets[int(np.argmax(base))]),
                    }
                )
        n_k = n_layers * n_heads
        for direction in [*found, *(["either"] if not causal and len(found) == 2 else [])]:
            if (
                direction == "either"
            ):  # Clark: best over heads and both directions, one shared baseline
                d_best, k_best = max(
                    ((d, k) for d in found for k in range(n_k)), key=lambda t: found[t[0]][1][t[1]]
                )
                sel, _, base = found[
                    "dep->head"
                ]  # an encoder's two directions judge the same pairs, in order
            else:
                sel, acc, base = found[direction]
                d_best, k_best = direction, int(np.argmax(acc))
            hits = pairs.heads[found[d_best][0]][:, k_best]  # [pair]
            j = max(
                range(len(offsets)), key=lambda j: (base[j], offsets[j])
            )  # Clark: ties -> the larger offset
            rows.append(
                _row(
                    rel,
                    direction,
                    d_best,
                    k_best,
                    n_heads,
                    hits,
                    pairs.offsets[sel][:, j],
                    offsets[j],
                    pairs.sentence[sel],
                    n_sentences,
                    float(pairs.chance[sel].mean()),
                    resamples,
                    seed,
                )
            )
    return pd.DataFrame(rows), pd.DataFrame(per_head)


def _head_intervals(
    hits: np.ndarray, sentence: np.ndarray, n_sentences: int, resamples: int, seed: int
):
    """Bootstrap (over sentences) intervals of every head's accuracy: ``(low, high)``, ``[layer *
    head]`` each."""
    tot = torch.zeros(n_sentences, hits.shape[1], dtype=torch.float64).index_add_(
        0, torch.from_numpy(sentence), torch.from_numpy(hits.astype(np.float64))
    )  # [sentence, layer * head]
    cnt = torch.bincount(torch.from_numpy(sentence), minlength=n_sentences).double()
    b = bootstrap(tot[:, None, :], cnt, resamples=resamples, seed=seed)
    return b.ci_low[0].numpy(), b.ci_high[0].numpy()


def _row(
    rel,
    direction,
    d_best,
    k_best,
    n_heads,
    hits,
    base_hits,
    offset,
    sentence,
    n_sentences,
    chance,
    resamples,
    seed,
) -> dict:
    """One table row, with bootstrap intervals over sentences (head, baseline, paired
    difference)."""
    tot = np.zeros((n_sentences, 3))
    np.add.at(tot, sentence, np.stack([hits, base_hits, hits.astype(float) - base_hits], 1))
    cnt = np.bincount(sentence, minlength=n_sentences).astype(float)
    b = bootstrap(torch.tensor(tot)[:, None, :], torch.tensor(cnt), resamples=resamples, seed=seed)
    lo, hi = b.ci_low[0].tolist(), b.ci_high[0].tolist()
    acc, base = float(hits.mean()), float(base_hits.mean())
    return {
        "relation": rel,
        "direction": direction,
        "count": int(len(hits)),
        "best_head": head_name(k_best // n_heads, k_best % n_heads),
        "head_direction": d_best,
        "accuracy": acc,
        "ci_low": lo[0],
        "ci_high": hi[0],
        "offset": int(offset),
        "baseline": base,
        "baseline_ci_low": lo[1],
        "baseline_ci_high": hi[1],
        "difference": acc - base,
        "difference_ci_low": lo[2],
        "difference_ci_high": hi[2],
        "chance": chance,
    }
