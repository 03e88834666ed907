"""Copying: how much a head's OV circuit raises the logit of the token it attends to (on real
inputs).

An induction head does two things. Its QK circuit finds the token after the earlier copy of the
current token (prefix matching: the ``induction`` metric), and its OV circuit copies the token it
finds into the output (Olsson et al. 2022). This module scores the copying half for every head of
a decoder with an unembedding, on the repeat probe, as the ``copying`` rows of a scan.

Run the model on the probe and, for head ``h`` of layer ``l``, take the attention input ``x_k`` at
every position ``k`` of the first copy of ``R`` (the post-norm residual stream that ``W_V``
multiplies). Suppose the head attended to ``k`` alone; its output would be
``x_k W_V[h // g] W_O[h]``. Read that through the unembedding, with the final norm's weight folded
in (``diag(gamma_final) W_U``; Gemma: its ``1 + w`` gains, and the post-attention norm's gain on
the head's output, :meth:`~headscope.models.model.Model.circuit_weights`), and ask where the logit
of ``token_k`` itself ranks among all ordinary tokens::

    copying@k = share of positions whose own-token logit is among the k highest  (chance k / vocab)

Its control (the ``null`` column of a scan) asks the same of another token of ``R``: the logit of
the token ``L // 2`` positions further along the first copy (cyclically), read from the same
output. ``k / vocab`` is the rate of a head whose logits ignore its input; the null is the rate of
a head that raises the tokens of ``R`` in general, or of the kind ``R`` is drawn from, without
copying the one it attends to. A copying head scores far above both.

Approximations, all standard for direct logit attribution: the head's output is read straight
through to the logits, not through the later layers; the final norm's division by the RMS of the
residual stream is dropped (one positive factor per position: it changes no rank); value and output
biases (GPT-2) are dropped (they do not depend on the attended token). Grouped-query attention:
query head ``h`` reads key/value head ``h // g``, ``g = n_heads / n_kv_heads``, the ``repeat_kv``
layout of Hugging Face's attention.

>>> import torch
>>> eye = torch.eye(4)
>>> own_token_ranks(eye, torch.arange(4), eye, eye, eye)     # each token's own logit is the highest
tensor([0, 0, 0, 0])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from headscope.catalog import CIRCUIT, COPYING_K
from headscope.errors import HeadscopeError
from headscope.result import Probe, ScoreInfo

# a head copies when half of the attended tokens pass copying@k
COPYING_THRESHOLD = CIRCUIT["copying"].threshold


# ------------------------------------------------------------------------------ weights


@dataclass(frozen=True)
class HeadWeights:
    """What every head's OV circuit needs, float32 on the CPU, with the vocabulary restricted.

    Columns of ``unembed`` (and rows of ``embed``) are the ordinary tokens ``token_ids``, in order.
    """

    model: str
    token_ids: Int[Tensor, " vocab"]  # ordinary tokens (no special or added tokens), sorted
    embed: Float[Tensor, "vocab d_model"]  # W_E rows of those tokens, before any norm
    W_V: Float[Tensor, "layer head d_model d_head"]  # expanded to query heads (GQA)
    W_O: Float[Tensor, "layer head d_head d_model"]
    ln1: Float[Tensor, "layer d_model"]  # each layer's pre-attention norm weight
    unembed: Float[Tensor, "d_model vocab"]  # diag(gamma_final) . W_U[:, token_ids]
    centre: bool = False  # LayerNorm (centre, then scale) rather than RMSNorm
    eps: float = 1e-5

    @property
    def n_layers(self) -> int:
        return self.W_V.shape[0]

    @property
    def n_heads(self) -> int:
        return self.W_V.shape[1]

    def columns(self, ids: Tensor) -> Tensor:
        """Column index in ``unembed`` of each token id in ``ids`` (all must be ordinary tokens)."""
        ids = torch.as_tensor(ids)
        col = torch.searchsorted(self.token_ids, ids).clamp(max=len(self.token_ids) - 1)
        if not torch.equal(self.token_ids[col], ids):
            raise HeadscopeError(
                "Some token ids are not ordinary tokens of this model (special or added tokens)."
            )
        return col


def expand_kv_heads(w: Tensor, n_heads: int) -> Tensor:
    """``[layer, n_kv, ...]`` -> ``[layer, n_heads, ...]``: query head ``h`` gets KV head ``h //
    g``.

    >>> expand_kv_heads(torch.arange(3.0).view(1, 3), 9)
    tensor([[0., 0., 0., 1., 1., 1., 2., 2., 2.]])
    """
    n_kv = w.shape[1]
    if n_heads % n_kv:
        raise HeadscopeError(f"{n_heads} query heads cannot share {n_kv} key/value heads evenly.")
    return w.repeat_interleave(n_heads // n_kv, dim=1)


def head_weights(model) -> HeadWeights:
    """``W_E``, ``W_V``, ``W_O``, ``W_U`` and the norm weights of a decoder
    (:meth:`Model.circuit_weights`), restricted to its ordinary tokens, with the final norm's weight
    folded into the unembedding.

    Needs a pre-norm decoder (a norm before each attention layer, one before the unembedding).
    """
    cw = model.circuit_weights()  # raises one line for encoders
    ids = model.ordinary_vocab()
    ids = ids[(ids < cw.W_E.shape[0]) & (ids < cw.W_U.shape[1])].sort().values
    # Gemma 2/3 normalise the attention output before the residual add: its gain joins W_O
    # [layer, head, d_head, d_model]
    W_O = cw.W_O if cw.post_attn is None else cw.W_O * cw.post_attn[:, None, None, :]
    return HeadWeights(
        model=model.name,
        token_ids=ids,
        embed=cw.W_E[ids],
        W_V=expand_kv_heads(cw.W_V, model.n_heads),
        W_O=W_O,
        ln1=cw.ln1,
        unembed=cw.ln_final[:, None] * cw.W_U[:, ids],
        centre=not cw.rms,
        eps=cw.eps,
    )


# ------------------------------------------------------------------------------ on real inputs


def attention_inputs(
    model, tokens: Int[Tensor, "batch pos"], layers: Sequence[int]
) -> dict[int, Tensor]:
    """The post-norm input of each wanted layer's attention, ``{layer: [batch, pos, d_model]}``
    (what ``W_V`` multiplies; :meth:`headscope.models.model.Model.attention_inputs`)."""
    return model.attention_inputs(tokens, layers)


def own_token_ranks(
    x: Float[Tensor, "n d_model"],
    columns: Int[Tensor, " n"] | Int[Tensor, "n c"],
    W_V: Float[Tensor, "d_model d_head"],
    W_O: Float[Tensor, "d_head d_model"],
    unembed: Float[Tensor, "d_model vocab"],
    chunk: int = 256,
) -> Int[Tensor, " n"] | Int[Tensor, "n c"]:
    """Rank of each input's own logit under one head's OV circuit (0 = the highest logit).

    Row ``i`` of ``x`` is an attention input holding token ``columns[i]`` (a column of
    ``unembed``); the head's output ``x_i W_V W_O`` is read through ``unembed``. With ``columns``
    ``[n, c]``, the ranks of ``c`` columns of each output (``[n, c]``).
    """
    flat = columns.dim() == 1
    columns = columns[:, None] if flat else columns  # [n, c]
    d_model, d_head = W_V.shape
    # Few inputs: read each through W_V W_O then unembed. Many: fold W_O into unembed once.
    fold = d_head * d_model + len(x) * d_head < len(x) * d_model
    ov_u = W_O @ unembed if fold else None  # [d_head, vocab]
    ranks = []
    for start in range(0, len(x), chunk):
        z = x[start : start + chunk] @ W_V  # [n_chunk, d_head]
        logits = z @ ov_u if fold else (z @ W_O) @ unembed  # [n_chunk, vocab]
        own = logits.gather(1, columns[start : start + chunk])  # [n_chunk, c]
        # [n_chunk, c]: tokens beating each
        ranks.append((logits[:, None, :] > own[:, :, None]).sum(2))
    out = torch.cat(ranks)
    return out[:, 0] if flat else out


def null_columns(columns: Int[Tensor, "sequence L"]) -> Int[Tensor, "sequence L"]:
    """The control's token for each first-copy position: the one ``L // 2`` further along ``R``,
    cyclically (another token of the same sequence; ``R``'s tokens are distinct).

    >>> null_columns(torch.tensor([[10, 11, 12, 13]]))
    tensor([[12, 13, 10, 11]])
    """
    return columns.roll(-(columns.shape[1] // 2), dims=1)


def copying_ranks(
    model,
    probe,
    heads: Sequence[tuple[int, int]] | None = None,
    weights: HeadWeights | None = None,
    batch_size: int = 4,
    null: bool = False,
    progress=None,
) -> tuple[dict[tuple[int, int], Tensor], int]:
    """Own-token ranks through each head's OV circuit at every first-copy position of a repeat
    ``probe``: ``({(layer, head): ranks [sequence, L]}, vocabulary size)``, sequences in the
    probe's order (0 = the highest logit). With ``null``, ranks ``[sequence, L, 2]``: the own
    token's, then the control token's (:func:`null_columns`). ``progress``: a ``tqdm``-like factory
    (one step per head: the ranking against the whole vocabulary is where the time goes)."""
    if probe.repeat_len is None:
        raise HeadscopeError("Copying needs a repeat probe (headscope.repeat_probe).")
    w = head_weights(model) if weights is None else weights
    heads = (
        [(la, h) for la in range(w.n_layers) for h in range(w.n_heads)]
        if heads is None
        else list(heads)
    )
    L = probe.repeat_len
    layers = sorted({layer for layer, _ in heads})
    xs: dict[int, list[Tensor]] = {layer: [] for layer in layers}
    cols = []
    for start in range(0, len(probe), batch_size):
        # [batch, pos]
        tokens = torch.tensor(probe.sequences[start : start + batch_size], dtype=torch.long)
        got = attention_inputs(model, tokens, layers)
        for layer in layers:
            # [batch*L, d_model]
            xs[layer].append(got[layer][:, 1 : L + 1].reshape(-1, got[layer].shape[-1]))
        cols.append(w.columns(tokens[:, 1 : L + 1].reshape(-1)))
    columns = torch.cat(cols)  # [sequence * L]
    if null:
        # [sequence * L, 2]
        columns = torch.stack([columns, null_columns(columns.view(-1, L)).reshape(-1)], 1)
    ranks = {}
    bar = progress(total=len(heads), desc="copying (OV circuit)") if progress is not None else None
    for layer, head in heads:
        x = torch.cat(xs[layer])  # [sequence * L, d_model]
        r = own_token_ranks(x, columns, w.W_V[layer, head], w.W_O[layer, head], w.unembed)
        ranks[(layer, head)] = r.reshape(len(probe), L, *r.shape[1:])  # [sequence, L(, 2)]
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return ranks, len(w.token_ids)


COPYING = CIRCUIT["copying"]


@dataclass
class CopyingScores:
    """The ``copying`` rows of a scan: ``[layer, head]`` scores, chance ``k / vocab``, positions
    counted, and the control (:func:`null_columns`) of every head."""

    metric: ScoreInfo
    score: Float[Tensor, "layer head"]
    count: float
    chance: float
    null: Float[Tensor, "layer head"] | None = None
    estimator: np.ndarray | None = None
    seq_total: Float[Tensor, "sequence layer head"] | None = None  # hits per sequence
    seq_count: Float[Tensor, " sequence"] | None = None  # positions per sequence


def copying_scores(
    model, probe: Probe, k: int = COPYING_K, max_sequences: int = 16, progress=None
) -> CopyingScores:
    """copying@k for every head on the first ``max_sequences`` sequences of a repeat ``probe``."""
    small = Probe(probe.name, probe.sequences[:max_sequences], probe.repeat_len, probe.settings)
    ranks, vocab = copying_ranks(model, small, null=True, progress=progress)
    n, L = len(small), small.repeat_len
    # [sequence, layer, head]
    hits = torch.zeros(n, model.n_layers, model.n_heads, dtype=torch.float64)
    null_hits = torch.zeros(model.n_layers, model.n_heads, dtype=torch.float64)
    for (layer, head), r in ranks.items():
        hits[:, layer, head] = (r[..., 0] < k).double().sum(1)
        null_hits[layer, head] = (r[..., 1] < k).double().sum()
    counts = torch.full((n,), float(L), dtype=torch.float64)
    return CopyingScores(
        COPYING,
        hits.sum(0) / counts.sum(),
        float(counts.sum()),
        k / vocab,
        null=null_hits / counts.sum(),
        seq_total=hits,
        seq_count=counts,
    )


def scan_score(model, probes: dict, batch_size: int, progress=None) -> CopyingScores | None:
    """A scan's ``copying`` (catalog ``impl``): decoders with an unembedding, on the repeat probe
    (None otherwise)."""
    probe = probes.get("repeat")
    if not model.causal or probe is None or model.hf.get_output_embeddings() is None:
        return None
    return copying_scores(model, probe, max_sequences=len(probe), progress=progress)
