"""Copying: how much a head's OV circuit raises the logit of the token it attends to.

An induction head does two things. Its QK circuit finds the token after the earlier copy of the
current token (prefix matching: the ``induction`` metric), and its OV circuit copies the token it
finds into the output. This module scores the copying half, two ways.

**On real inputs** (:func:`ov_copying`, the one the notebooks use to name heads). Run the model on a
probe and, for head ``h`` of layer ``l``, take the attention input ``x_k`` at every position ``k``
of the first copy of ``R`` (the post-norm residual stream that ``W_V`` multiplies, captured with a
hook). Suppose the head attended to ``k`` alone; its output would be ``x_k W_V[h // g] W_O[h]``.
Read that through the unembedding, with the final norm's weight folded in
(``diag(gamma_final) W_U``), and ask where the logit of ``token_k`` itself ranks among all ordinary
tokens::

    copying@k = share of positions whose own-token logit is among the k highest     (chance k / vocab)

Approximations, all standard for direct logit attribution: the head's output is read straight
through to the logits, not through the later layers; the final norm's division by the RMS of the
residual stream is dropped (one positive factor per position: it changes no rank); value and output
biases (GPT-2) are dropped (they do not depend on the attended token). Grouped-query attention:
query head ``h`` reads key/value head ``h // g``, ``g = n_heads / n_kv_heads`` (SmolLM2-135M: 9
query heads share 3 KV heads, ``g = 3``), the ``repeat_interleave`` layout of Hugging Face's
``repeat_kv``.

**From the weights alone** (:func:`eigen_copying_scores`, Olsson et al. 2022 / Elhage et al. 2021).
Replace ``x_k`` by each token's bare embedding through the layer's norm, ``N1(W_E)``, so that
``M_h = N1(W_E) W_V W_O diag(gamma) W_U`` is a ``[vocab, vocab]`` matrix, and summarise it by its
eigenvalues: ``sum(lambda) / sum(|lambda|)`` in ``[-1, 1]``; +1 when every eigenvalue is positive
(the head copies), -1 when all are negative (it suppresses). ``M_h`` has rank at most ``d_head``
and its non-zero eigenvalues are those of the ``[d_head, d_head]`` matrix
``W_O diag(gamma) W_U N1(W_E) W_V``, so a head costs one 64 x 64 eigen-decomposition. This is exact
for one-layer attention-only models; in a deep model a middle layer reads far more than the bare
token embedding, and the two scores can disagree (they do on SmolLM2-135M: see the notebook
``analyses/02_induction_heads.ipynb``).

>>> import torch
>>> eye = torch.eye(4)
>>> ov_copying_score(eye, eye, eye, eye)          # M = I: every eigenvalue is +1
1.0
>>> ov_copying_score(eye, eye, -eye, eye)         # M = -I: the head suppresses what it reads
-1.0
>>> own_token_ranks(eye, torch.arange(4), eye, eye, eye)     # each token's own logit is the highest
tensor([0, 0, 0, 0])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from headscope.errors import HeadscopeError

COPYING_K = 50  # copying@k: the own-token logit must be among the k highest (0.1% of a 49k vocab)
COPYING_THRESHOLD = 0.5  # a head copies when at least half of the attended tokens pass copying@k


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
            raise HeadscopeError("Some token ids are not ordinary tokens of this model (special or added tokens).")
        return col


def expand_kv_heads(w: Tensor, n_heads: int) -> Tensor:
    """``[layer, n_kv, ...]`` -> ``[layer, n_heads, ...]``: query head ``h`` gets KV head ``h // g``.

    >>> expand_kv_heads(torch.arange(3.0).view(1, 3), 9)
    tensor([[0., 0., 0., 1., 1., 1., 2., 2., 2.]])
    """
    n_kv = w.shape[1]
    if n_heads % n_kv:
        raise HeadscopeError(f"{n_heads} query heads cannot share {n_kv} key/value heads evenly.")
    return w.repeat_interleave(n_heads // n_kv, dim=1)


def head_weights(model) -> HeadWeights:
    """``W_E``, ``W_V``, ``W_O``, ``W_U`` and the norm weights of a decoder (:meth:`Model.circuit_weights`),
    restricted to its ordinary tokens, with the final norm's weight folded into the unembedding.

    Needs a pre-norm decoder (a norm before each attention layer, one before the unembedding).
    """
    cw = model.circuit_weights()  # raises one line for encoders
    ids = model.ordinary_vocab()
    ids = ids[(ids < cw.W_E.shape[0]) & (ids < cw.W_U.shape[1])].sort().values
    return HeadWeights(model=model.name, token_ids=ids, embed=cw.W_E[ids],
                       W_V=expand_kv_heads(cw.W_V, model.n_heads), W_O=cw.W_O, ln1=cw.ln1,
                       unembed=cw.ln_final[:, None] * cw.W_U[:, ids], centre=not cw.rms, eps=cw.eps)


# ------------------------------------------------------------------------------ on real inputs


def attention_inputs(model, tokens: Int[Tensor, "batch pos"], layers: Sequence[int]) -> dict[int, Tensor]:
    """The post-norm input of each wanted layer's attention, ``{layer: [batch, pos, d_model]}``
    (what ``W_V`` multiplies; :meth:`headscope.models.Model.attention_inputs`)."""
    return model.attention_inputs(tokens, layers)


def own_token_ranks(
    x: Float[Tensor, "n d_model"],
    columns: Int[Tensor, " n"],
    W_V: Float[Tensor, "d_model d_head"],
    W_O: Float[Tensor, "d_head d_model"],
    unembed: Float[Tensor, "d_model vocab"],
    chunk: int = 256,
) -> Int[Tensor, " n"]:
    """Rank of each input's own logit under one head's OV circuit (0 = the highest logit).

    Row ``i`` of ``x`` is an attention input holding token ``columns[i]`` (a column of
    ``unembed``); the head's output ``x_i W_V W_O`` is read through ``unembed``.
    """
    d_model, d_head = W_V.shape
    # Few inputs: read each through W_V W_O then unembed. Many: fold W_O into unembed once.
    fold = d_head * d_model + len(x) * d_head < len(x) * d_model
    ov_u = W_O @ unembed if fold else None  # [d_head, vocab]
    ranks = []
    for start in range(0, len(x), chunk):
        z = x[start:start + chunk] @ W_V  # [n_chunk, d_head]
        logits = z @ ov_u if fold else (z @ W_O) @ unembed  # [n_chunk, vocab]
        own = logits.gather(1, columns[start:start + chunk, None])  # [n_chunk, 1]
        ranks.append((logits > own).sum(1))  # how many tokens beat the attended one
    return torch.cat(ranks)


def ov_copying(
    model,
    probe,
    heads: Sequence[tuple[int, int]] | None = None,
    k: int = COPYING_K,
    weights: HeadWeights | None = None,
    batch_size: int = 4,
) -> pd.DataFrame:
    """Copying on real inputs, for ``heads`` (default: every head), on a repeat ``probe``.

    The attended positions are the first copy of ``R`` (positions ``1..L``). Returns one row per
    head: ``copying`` = copying@k (share of positions whose own-token logit is among the ``k``
    highest of the ordinary vocabulary), ``median_rank`` (0 = highest), ``n`` positions and
    ``chance`` = ``k / vocab``. Cost: about ``2 * n * d_model * vocab`` flops per head.
    """
    if probe.repeat_len is None:
        raise HeadscopeError("ov_copying needs a repeat probe (headscope.repeat_probe).")
    w = head_weights(model) if weights is None else weights
    heads = [(la, h) for la in range(w.n_layers) for h in range(w.n_heads)] if heads is None else list(heads)
    L = probe.repeat_len
    layers = sorted({layer for layer, _ in heads})
    xs: dict[int, list[Tensor]] = {layer: [] for layer in layers}
    cols = []
    for start in range(0, len(probe), batch_size):
        tokens = torch.tensor(probe.sequences[start:start + batch_size], dtype=torch.long)  # [batch, pos]
        got = attention_inputs(model, tokens, layers)
        for layer in layers:
            xs[layer].append(got[layer][:, 1:L + 1].reshape(-1, got[layer].shape[-1]))  # [batch*L, d_model]
        cols.append(w.columns(tokens[:, 1:L + 1].reshape(-1)))
    columns = torch.cat(cols)  # [n]
    rows = []
    for layer, head in heads:
        x = torch.cat(xs[layer])  # [n, d_model]
        ranks = own_token_ranks(x, columns, w.W_V[layer, head], w.W_O[layer, head], w.unembed)
        rows.append({"model": model.name, "layer": layer, "head": head, "head_name": f"L{layer}H{head}",
                     "copying": float((ranks < k).float().mean()), "median_rank": float(ranks.float().median()),
                     "n": len(ranks), "k": k, "chance": k / len(w.token_ids)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ weights only


def ov_copying_score(
    embed: Float[Tensor, "vocab d_model"],
    W_V: Float[Tensor, "d_model d_head"],
    W_O: Float[Tensor, "d_head d_model"],
    unembed: Float[Tensor, "d_model vocab"],
) -> float:
    """``sum(lambda) / sum(|lambda|)`` over the eigenvalues of ``embed W_V W_O unembed``.

    Computed on the small ``[d_head, d_head]`` matrix ``W_O unembed embed W_V``, which has the same
    non-zero eigenvalues.
    """
    small = W_O.double() @ (unembed.double() @ embed.double()) @ W_V.double()  # [d_head, d_head]
    return _eig_score(small)


def _eig_score(small: Tensor) -> float:
    lam = torch.linalg.eigvals(small)  # complex [d_head]
    total = float(lam.abs().sum())
    return float(lam.real.sum()) / total if total > 0 else float("nan")


def _unit(w: HeadWeights) -> Tensor:
    """The embeddings as the norm leaves them before its weight: ``[vocab, d_model]``."""
    e = w.embed.double()
    if w.centre:
        e = e - e.mean(-1, keepdim=True)
    return e * torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + w.eps)


def eigen_copying_scores(w: HeadWeights) -> pd.DataFrame:
    """Olsson et al.'s weights-only copying score of every head (see the module docstring).

    One row per head: model, layer, head, head_name, ``eigen_copying`` in ``[-1, 1]``.
    """
    base = w.unembed.double() @ _unit(w)  # [d_model, d_model]: U . (normalised W_E)
    rows = []
    for layer in range(w.n_layers):
        ue = base * w.ln1[layer].double()[None, :]  # [d_model, d_model]: U . N1(W_E)
        for head in range(w.n_heads):
            small = w.W_O[layer, head].double() @ ue @ w.W_V[layer, head].double()  # [d_head, d_head]
            rows.append({"model": w.model, "layer": layer, "head": head,
                         "head_name": f"L{layer}H{head}", "eigen_copying": _eig_score(small)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ both halves


def induction_copying_heads(
    scores: pd.DataFrame,
    copying: pd.DataFrame,
    induction_threshold: float | None = None,
    copying_threshold: float = COPYING_THRESHOLD,
    column: str = "copying",
) -> pd.DataFrame:
    """Heads that both prefix-match (``induction`` score) and copy (``copying[column]``).

    ``induction_threshold`` defaults to the induction metric's label threshold. One row per head of
    ``copying``, with both scores and three flags; heads that do both come first, then by
    induction score.
    """
    from headscope.metrics import get_metric

    t = get_metric("induction").threshold if induction_threshold is None else induction_threshold
    ind = scores[scores["metric"] == "induction"][["layer", "head", "score"]]
    if ind.empty:
        raise HeadscopeError("The scores table has no 'induction' rows; scan a repeat probe first.")
    if column not in copying.columns:
        raise HeadscopeError(f"The copying table has no column '{column}'; it has {', '.join(copying.columns)}.")
    keep = ["model", "layer", "head", "head_name", column] + [c for c in ("median_rank",) if c in copying.columns]
    out = copying[keep].merge(ind.rename(columns={"score": "induction"}), on=["layer", "head"], how="inner")
    out["prefix_matching"] = out["induction"] >= t
    out["copies"] = out[column] >= copying_threshold
    out["induction_head"] = out["prefix_matching"] & out["copies"]
    out = out.sort_values(["induction_head", "induction"], ascending=[False, False], kind="stable")
    cols = ["model", "head_name", "layer", "head", "induction", column] + keep[5:] + [
        "prefix_matching", "copies", "induction_head"]
    return out.reset_index(drop=True)[cols]
