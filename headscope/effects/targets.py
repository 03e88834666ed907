"""What an ablation is measured on: the quantity whose change is a head's effect.

* ``repeat_loss`` (decoders, repeat probe ``BOS + R + R``): mean next-token cross-entropy, in nats,
  of the second copy: the tokens at positions ``L+2 .. 2L``, each predicted from everything before
  it (the logits at ``t - 1``). Position ``L+1`` is left out: nothing before it predicts it.
* ``text_loss`` (decoders, text probe): mean next-token cross-entropy over positions ``1 .. n-1``.
* ``embedding`` (encoders without a trained LM head, text probe): ``1 - cos(e, e')`` with ``e`` the
  mean-pooled last hidden state over real tokens (the sentence-transformers embedding), clean
  against ablated, averaged over sequences.

Losses pool like every score: summed over every (sequence, target token) pair, divided by their
count, so a head's effect is ``loss(ablated) - loss(clean)``, in nats (chance: 0, no effect).

>>> lengths, L = torch.tensor([9, 7]), 4            # BOS + R + R with |R| = 4 is 9 tokens
>>> target_positions(lengths, 9, "repeat", L).nonzero().tolist()   # t = 6..8, and t < length
[[0, 6], [0, 7], [0, 8], [1, 6]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.catalog import EFFECTS
from headscope.result import ScoreInfo


@dataclass(frozen=True)
class Target:
    """One measured quantity: how it is computed, and how the report describes a head's effect on
    it."""

    name: str  # "repeat_loss", "text_loss", "embedding"
    probe: str  # the probe it is measured on
    output: str  # what the forward must return: "logits" or "hidden"
    causal: bool  # decoders (True) or encoders (False)
    definition: str
    label: str  # given to a head whose effect passes the threshold
    threshold: float
    unit: str
    below: bool = False
    nan_reason: str | None = None

    @property
    def metric(self) -> str:
        """The metric name of the effect rows in ``scores.csv``."""
        return f"effect_{self.name}"

    def info(self) -> ScoreInfo:
        """How ``effect_<name>`` rows are described (exact where the run says so, else
        estimates)."""
        return EFFECTS[self.metric]

    def attribution_info(self) -> ScoreInfo:
        """``attribution_<name>`` rows: first-order estimates for every head, never labelled."""
        return EFFECTS[f"attribution_{self.name}"]


def _target(name: str, output: str, causal: bool) -> Target:
    info = EFFECTS[f"effect_{name}"]  # what it means lives in the catalog
    return Target(
        name, info.probe, output, causal, info.definition, info.label, info.threshold, info.unit
    )


TARGETS: dict[str, Target] = {
    t.name: t
    for t in [
        _target("repeat_loss", "logits", True),
        _target("text_loss", "logits", True),
        _target("embedding", "hidden", False),
    ]
}


def targets_for(model) -> list[Target]:
    """The targets a model's effects are measured on: losses for decoders, the embedding for
    encoders."""
    return [t for t in TARGETS.values() if t.causal == model.causal]


def target_positions(
    lengths: Int[Tensor, " batch"], n: int, probe: str, repeat_len: int | None
) -> Bool[Tensor, "batch pos"]:
    """``[batch, pos]``: True at the target tokens ``t`` of each sequence (predicted from ``t -
    1``)."""
    t = torch.arange(n)[None, :]  # [1, pos]
    real = t < lengths[:, None]  # [batch, pos]
    if probe == "repeat":
        L = int(repeat_len)
        return real & (t >= L + 2) & (t <= 2 * L)
    return real & (t >= 1)


def logits_from(target: Target, tokens: Tensor, repeat_len: int | None) -> int:
    """The first position whose logits a loss target reads (the unembedding of earlier ones is
    skipped)."""
    return int(repeat_len) + 1 if target.probe == "repeat" else 0


def token_losses(
    logits: Float[Tensor, "batch pos vocab"],
    tokens: Int[Tensor, "batch pos"],
    targets: Bool[Tensor, "batch pos"],
    first: int = 0,
) -> tuple[Tensor, Tensor]:
    """Per sequence: the summed next-token cross-entropy over its target tokens, and their count.

    ``logits`` hold positions ``first ..`` (``[batch, pos - first, vocab]``); only the rows that
    predict a target are read. Returns ``(sum [batch] float64, count [batch] float64)``; the sum
    is differentiable.
    """
    b_idx, t_idx = targets.nonzero(as_tuple=True)  # [m], [m]: target t is predicted at t - 1
    rows = logits[b_idx.to(logits.device), (t_idx - 1 - first).to(logits.device)]  # [m, vocab]
    rows = rows if rows.dtype == torch.float64 else rows.float()  # bf16/fp16 scored in fp32
    ce = F.cross_entropy(rows, tokens[b_idx, t_idx].to(logits.device), reduction="none")  # [m]
    total = torch.zeros(targets.shape[0], dtype=torch.float64, device=logits.device)
    total = total.index_add(0, b_idx.to(logits.device), ce.double())  # [batch]
    return total, targets.sum(-1).double().to(logits.device)


def sentence_embedding(
    hidden: Float[Tensor, "batch pos d_model"], lengths: Int[Tensor, " batch"]
) -> Float[Tensor, "batch d_model"]:
    """Mean of the last hidden state over each sequence's real tokens (sentence-transformers
    pooling)."""
    real = (
        torch.arange(hidden.shape[1], device=hidden.device)[None, :]
        < lengths.to(hidden.device)[:, None]
    )
    w = real.to(hidden.dtype)[..., None]  # [batch, pos, 1]
    return (hidden * w).sum(1) / w.sum(1)  # [batch, d_model]


def measure(target: Target, out: Tensor, tokens: Tensor, lengths: Tensor, repeat_len: int | None):
    """The target's per-sequence state from a forward's output: ``(sum, count)`` for a loss, the
    sentence embeddings for ``embedding``."""
    if target.output == "hidden":
        return sentence_embedding(out.float(), lengths).double()  # [batch, d_model]
    mask = target_positions(lengths, tokens.shape[1], target.probe, repeat_len)
    s, c = token_losses(out, tokens, mask, first=tokens.shape[1] - out.shape[1])
    return s.detach(), c


def effect_sums(target: Target, clean, ablated) -> tuple[Tensor, Tensor]:
    """Per sequence: (sum of the effect, count) from the clean and the ablated states.

    Losses: ``sum_ablated - sum_clean`` over the same target tokens; embedding: ``1 - cos``, one
    per sequence. Pooled effect = ``sum of sums / sum of counts``.
    """
    if target.output == "hidden":
        cos = F.cosine_similarity(clean, ablated, dim=-1)  # [batch]
        return 1 - cos, torch.ones_like(cos)
    (s0, c0), (s1, _) = clean, ablated
    return s1 - s0, c0
