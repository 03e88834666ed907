"""Successor heads (Gould et al. 2023): does a head's OV circuit map a token to its successor?

For each ordinal set ``S`` (digits 1-9, number words, ordinals, days, months and their short forms,
letters A-Z) and each ``t`` in ``S`` that has a successor in ``S`` (``1 -> 2``, ``Monday ->
Tuesday``, ``Sunday -> Monday``: days and months wrap around), take the **effective embedding**
of ``t``, pass it through head ``h``'s OV circuit and read it through the unembedding restricted
to ``S`` (:mod:`headscope.circuits.ov`). A **hit** when the top token within ``S`` is ``succ(t)``.

* **effective embedding** (what we compute): the residual stream after block 0 of a forward of
  ``t`` alone (a one-token sequence, no BOS): the embedding, plus layer-0 attention (on one token
  it can only attend to itself: exact, no approximation), plus MLP0 on its real (normalised)
  input. Gould et al. use MLP0's output on the token embedding (``MLP0(W_E)``), layer-0
  attention left out; we keep the residual and layer-0 attention because later heads read their
  sum. Layer-0 heads read the raw embedding (their real input), not this;
* **tokens**: each element with a leading space (``" Monday"``, as Gould et al.), else bare
  (``"1"``: SmolLM2 splits numbers into single digits), kept only if that is one ordinary token;
  a set keeps its surviving elements (``|S|``), and a pair only when both ends survive;
* **score** = hits / pairs, pooled over all sets; **chance** = mean of ``1/|S|`` over pairs;
  **null**: the same score against shuffled successor maps (``succ' = sigma o succ``, ``sigma`` a
  uniformly random permutation of ``S``), ``n_null`` seeds: their mean and 95th percentile;
  **interval**: a bootstrap over pairs. Label "successor head" at score >= 0.4 (10x the chance of
  a ~25-token set; :data:`headscope.catalog.CENSUS`).

Encoders have no trained unembedding: refused, unless ``readout="embeddings"`` (through the
input embeddings; not an unembedding).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.catalog import CENSUS
from headscope.circuits.ov import effective_embeddings, head_logits, output_gains, readout, values
from headscope.errors import HeadscopeError
from headscope.uncertainty import bootstrap

#: name -> (cyclic, elements in order)
SETS: dict[str, tuple[bool, list[str]]] = {
    "digits": (False, [str(i) for i in range(1, 10)]),
    "number_words": (
        False,
        [
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ],
    ),
    "ordinals": (
        False,
        [
            "first",
            "second",
            "third",
            "fourth",
            "fifth",
            "sixth",
            "seventh",
            "eighth",
            "ninth",
            "tenth",
        ],
    ),
    "days": (True, ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]),
    "days_short": (True, ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]),
    "months": (
        True,
        [
            "January",
            "February",
            "March",
            "April",
            "May",
            "June",
            "July",
            "August",
            "September",
            "October",
            "November",
            "December",
        ],
    ),
    "months_short": (
        True,
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"],
    ),
    "letters": (False, list(string.ascii_uppercase)),
}
INFO = CENSUS["successor"]
THRESHOLD = INFO.threshold


@dataclass
class OrdinalSet:
    name: str
    ids: list[int]  # the surviving elements' token ids, in order
    pairs: list[tuple[int, int]]  # (index of t, index of succ t) within ids
    dropped: list[str] = field(default_factory=list)  # elements that are not one token


def single_token(model, word: str) -> int | None:
    """The one ordinary token of ``" " + word``, else of ``word``; None if neither is one token."""
    special = model.special_ids
    for piece in (" " + word, word):
        ids = model.encode(piece)
        if len(ids) == 1 and ids[0] not in special:
            return ids[0]
    return None


def ordinal_sets(model, names=None) -> list[OrdinalSet]:
    """The ordinal sets filtered to single tokens of ``model``'s tokenizer. A set named in ``names``
    that keeps no pair is refused in one line; with the default sets such a set is left out (and
    every set empty is refused)."""
    chosen = list(SETS) if names is None else list(names)
    unknown = [n for n in chosen if n not in SETS]
    if unknown:
        raise HeadscopeError(f"Unknown ordinal set(s) {', '.join(unknown)}; use {', '.join(SETS)}.")
    out = []
    for name in chosen:
        cyclic, words = SETS[name]
        tok = [single_token(model, w) for w in words]
        keep = [i for i, t in enumerate(tok) if t is not None]
        where = {i: j for j, i in enumerate(keep)}
        succ = [
            (i, (i + 1) % len(words)) for i in range(len(words)) if cyclic or i + 1 < len(words)
        ]
        pairs = [(where[a], where[b]) for a, b in succ if a in where and b in where]
        s = OrdinalSet(
            name,
            [tok[i] for i in keep],
            pairs,
            [w for w, t in zip(words, tok, strict=True) if t is None],
        )
        if not pairs:
            if names is not None:
                raise HeadscopeError(
                    f"The ordinal set '{name}' has no (t, successor) pair of single tokens in "
                    f"{model.name}'s tokenizer ({len(keep)} of {len(words)} elements are one "
                    "token); choose other sets."
                )
            continue
        out.append(s)
    if not out:
        raise HeadscopeError(
            f"No ordinal set has a (t, successor) pair of single tokens in {model.name}'s "
            "tokenizer."
        )
    return out


@dataclass
class SuccessorScores:
    """Per head: the pooled score, its null and interval; per set, the score of every head."""

    score: Float[Tensor, "layer head"]
    hits: Float[Tensor, "pair layer head"]  # 1.0 where the head's top token is the successor
    chance: float
    null_mean: Float[Tensor, "layer head"]
    null_q95: Float[Tensor, "layer head"]
    ci_low: Float[Tensor, "layer head"]
    ci_high: Float[Tensor, "layer head"]
    per_set: dict[str, Tensor]  # name -> [layer, head]
    sets: list[OrdinalSet]
    readout: str

    @property
    def count(self) -> int:
        return self.hits.shape[0]


def successor_scores(
    model,
    names=None,
    readout_kind: str = "unembedding",
    n_null: int = 200,
    seed: int = 0,
    resamples: int = 1000,
) -> SuccessorScores:
    """The successor score of every head (see the module docstring)."""
    U, centre = readout(model, readout_kind)  # refuses an encoder's missing unembedding first
    sets = ordinal_sets(model, names)
    all_ids = sorted({i for s in sets for i in s.ids})
    row = {t: r for r, t in enumerate(all_ids)}
    e, v0 = effective_embeddings(model, torch.tensor(all_ids))  # [n, d_model], [n, head, d_head]
    W_O = model.output_weights()  # [layer, head, d_head, d_model]
    gains = output_gains(model)  # [layer, d_model] or None
    L, H = model.n_layers, model.n_heads
    n_pairs = sum(len(s.pairs) for s in sets)
    hits = torch.zeros(n_pairs, L, H, dtype=torch.float64)
    null = torch.zeros(n_null, L, H, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    perms = {
        s.name: torch.stack([torch.randperm(len(s.ids), generator=gen) for _ in range(n_null)])
        for s in sets
    }
    for layer in range(L):
        z = (
            v0
            if layer == 0
            else values(
                model,
                torch.tensor(all_ids).view(-1, 1),
                [layer],
                resume=(layer, e[:, None, :].to(model.dtype)),
            )[layer][:, :, 0]
        )  # [n, head, d_head]
        gain = None if gains is None else gains[layer]
        at = 0
        for s in sets:
            cols = U[:, s.ids]  # [d_model, |S|]
            src = torch.tensor([row[s.ids[a]] for a, _ in s.pairs])  # [pairs]
            tgt = torch.tensor([b for _, b in s.pairs])  # [pairs]: index of succ t in S
            for h in range(H):
                top = head_logits(z[src, h], W_O[layer, h], cols, gain, centre).argmax(
                    -1
                )  # [pairs]
                hits[at : at + len(tgt), layer, h] = (top == tgt).double()
                shuffled = perms[s.name][:, tgt]  # [n_null, pairs]: sigma(succ t)
                null[:, layer, h] += (top[None, :] == shuffled).double().sum(1)
            at += len(tgt)
    null /= n_pairs
    chance = float(sum(len(s.pairs) / len(s.ids) for s in sets) / n_pairs)
    boot = bootstrap(hits, torch.ones(n_pairs, dtype=torch.float64), resamples=resamples, seed=seed)
    per_set, at = {}, 0
    for s in sets:
        per_set[s.name] = hits[at : at + len(s.pairs)].mean(0)
        at += len(s.pairs)
    return SuccessorScores(
        hits.mean(0),
        hits,
        chance,
        null.mean(0),
        torch.quantile(null, 0.95, dim=0),
        boot.ci_low,
        boot.ci_high,
        per_set,
        sets,
        readout_kind,
    )
