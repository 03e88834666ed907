"""Copy suppression, or negative copying (McDougall et al. 2023): the mirror of ``copying``.

On the repeat probe ``BOS + R + R``, at every position ``k`` of the first copy of ``R``, suppose
head ``h`` of layer ``l`` attended to ``k`` alone: its output is its value there, ``v_h(x_k)``
(the model's own input norm and projection, read at the attention seam), written into the
residual stream as ``v_h W_O[h]`` and read through the unembedding (:mod:`headscope.circuits.ov`).
Rank ``token_k``'s own logit among the ordinary vocabulary from the **bottom**::

    copy_suppression@k = share of positions whose own-token logit is among the k lowest
                         (chance k / vocab)

``k`` = :data:`headscope.catalog.COPYING_K`, as ``copying`` uses for the highest, and the
same control (``null``): the logit of the token ``L // 2`` further along the first copy
(cyclically), read from the same output, among the ``k`` lowest. A head that lowers the tokens it
attends to scores far above both; one that lowers tokens of ``R`` in general scores high on the
control too. Beside it, a scan can put the head's exact effect on the text loss (mean ablation,
:func:`headscope.effects.ablation.exact_effects`). Label "copy-suppression head" at >= 0.5 (as
``copying``'s threshold). Interval: a bootstrap over sequences.

``copy_suppression_ranks(..., top=True)`` ranks from the top instead: that is ``copying`` computed
through the seam (a cross-check of :mod:`headscope.circuits.copying` on models without biases).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from headscope.catalog import CENSUS, COPYING_K
from headscope.circuits.copying import null_columns
from headscope.circuits.ov import head_logits, output_gains, readout, values
from headscope.errors import HeadscopeError
from headscope.result import Probe
from headscope.uncertainty import bootstrap

INFO = CENSUS["copy_suppression"]


def copy_suppression_ranks(
    model,
    probe: Probe,
    readout_kind: str = "unembedding",
    max_sequences: int = 16,
    batch_size: int = 4,
    top: bool = False,
) -> tuple[Tensor, int]:
    """``([sequence, L, layer, head, 2] ranks, vocab)``: at each first-copy position, how many
    ordinary tokens have a strictly lower logit (``top``: strictly higher) than the own token
    (``[..., 0]``) and than the control token (``[..., 1]``); 0 = the lowest (highest)."""
    if probe.repeat_len is None:
        raise HeadscopeError("copy suppression needs a repeat probe (headscope.repeat_probe).")
    U, centre = readout(model, readout_kind)
    vocab = model.ordinary_vocab()
    vocab = (
        vocab[vocab < U.shape[1]].sort().values
    )  # [V] ordinary tokens, as copying restricts them
    U = U[:, vocab]  # [d_model, V]
    W_O = model.output_weights()  # [layer, head, d_head, d_model]
    gains = output_gains(model)
    L, n_seq = probe.repeat_len, min(max_sequences, len(probe))
    out = torch.zeros(n_seq, L, model.n_layers, model.n_heads, 2, dtype=torch.long)
    for start in range(0, n_seq, batch_size):
        tokens = torch.tensor(probe.sequences[start : min(n_seq, start + batch_size)])  # [b, pos]
        b = len(tokens)
        cols = torch.searchsorted(
            vocab, tokens[:, 1 : L + 1].contiguous()
        )  # [b, L]: columns of the first copy's tokens
        if not torch.equal(vocab[cols.clamp(max=len(vocab) - 1)], tokens[:, 1 : L + 1]):
            raise HeadscopeError("The repeat probe holds tokens outside the ordinary vocabulary.")
        both = torch.stack([cols, null_columns(cols)], -1).reshape(
            b * L, 2
        )  # [b*L, 2]: own, control
        vals = values(model, tokens, range(model.n_layers))  # {layer: [b, head, pos, d_head]}
        for layer in range(model.n_layers):
            gain = None if gains is None else gains[layer]
            for h in range(model.n_heads):
                z = vals[layer][:, h, 1 : L + 1].reshape(b * L, -1)  # [b*L, d_head]
                logits = head_logits(z, W_O[layer, h], U, gain, centre)  # [b*L, V]
                own = logits.gather(1, both)  # [b*L, 2]
                beat = (
                    (logits[:, None, :] > own[:, :, None])
                    if top
                    else (logits[:, None, :] < own[:, :, None])
                )
                out[start : start + b, :, layer, h] = beat.sum(-1).view(b, L, 2)
    return out, len(vocab)


@dataclass
class CopySuppressionScores:
    score: Float[Tensor, "layer head"]
    null: Float[Tensor, "layer head"]  # the control token among the k lowest
    chance: float  # k / vocab
    count: int  # positions
    ci_low: Float[Tensor, "layer head"]
    ci_high: Float[Tensor, "layer head"]
    seq_total: Float[Tensor, "sequence layer head"]
    seq_count: Float[Tensor, " sequence"]


def copy_suppression_scores(
    model,
    probe: Probe,
    k: int = COPYING_K,
    readout_kind: str = "unembedding",
    max_sequences: int = 16,
    resamples: int = 1000,
    seed: int = 0,
) -> CopySuppressionScores:
    """copy_suppression@k of every head on the first ``max_sequences`` sequences of a repeat
    probe."""
    ranks, vocab = copy_suppression_ranks(model, probe, readout_kind, max_sequences)
    hits = (ranks < k).double()  # [sequence, L, layer, head, 2]
    seq_total = hits[..., 0].sum(1)  # [sequence, layer, head]
    seq_count = torch.full((ranks.shape[0],), float(ranks.shape[1]), dtype=torch.float64)
    boot = bootstrap(seq_total, seq_count, resamples=resamples, seed=seed)
    n = float(seq_count.sum())
    return CopySuppressionScores(
        seq_total.sum(0) / n,
        hits[..., 1].sum((0, 1)) / n,
        k / vocab,
        int(n),
        boot.ci_low,
        boot.ci_high,
        seq_total,
        seq_count,
    )
