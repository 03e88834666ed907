"""Copying: how much a head's OV circuit raises the logit of the token it attends to.

An induction head does two things. Its QK circuit finds the token after the earlier copy of the
current token (prefix matching: the ``induction`` metric), and its OV circuit copies the token it
finds into the output. This module scores the copying half, two ways.

**On real inputs** (:func:`ov_copying`, the one the notebooks use to name heads, and the
``copying`` rows of a scan run with effects): defined, and computed, in
:mod:`headscope.circuits.copying`, re-exported here.

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

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

# The scan's copying score lives in circuits.copying; what it is built on is re-exported here.
from headscope.circuits.copying import (
    COPYING_K,
    COPYING_THRESHOLD,
    HeadWeights,
    attention_inputs,  # noqa: F401
    copying_ranks,
    expand_kv_heads,  # noqa: F401
    head_weights,  # noqa: F401
    own_token_ranks,  # noqa: F401
)
from headscope.errors import HeadscopeError
from headscope.result import head_name

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
            # [d_head, d_head]
            small = w.W_O[layer, head].double() @ ue @ w.W_V[layer, head].double()
            rows.append(
                {
                    "model": w.model,
                    "layer": layer,
                    "head": head,
                    "head_name": f"L{layer}H{head}",
                    "eigen_copying": _eig_score(small),
                }
            )
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
    induction score. The copying table's interval (``ci_low``, ``ci_high`` of :func:`ov_copying`),
    control (``null``) and ``median_rank`` travel with each head; the interval is renamed
    ``{column}_low`` / ``{column}_high``.
    """
    from headscope.metrics import get_metric

    t = get_metric("induction").threshold if induction_threshold is None else induction_threshold
    ind = scores[scores["metric"] == "induction"][["layer", "head", "score"]]
    if ind.empty:
        raise HeadscopeError("The scores table has no 'induction' rows; scan a repeat probe first.")
    if column not in copying.columns:
        raise HeadscopeError(
            f"The copying table has no column '{column}'; it has {', '.join(copying.columns)}."
        )
    keep = ["model", "layer", "head", "head_name", column] + [
        c for c in ("ci_low", "ci_high", "median_rank", "null") if c in copying.columns
    ]
    # the copying interval travels with its head, named for its score (induction has its own)
    named = {"ci_low": f"{column}_low", "ci_high": f"{column}_high"}
    out = (
        copying[keep]
        .rename(columns=named)
        .merge(ind.rename(columns={"score": "induction"}), on=["layer", "head"], how="inner")
    )
    out["prefix_matching"] = out["induction"] >= t
    out["copies"] = out[column] >= copying_threshold
    out["induction_head"] = out["prefix_matching"] & out["copies"]
    out = out.sort_values(["induction_head", "induction"], ascending=[False, False], kind="stable")
    cols = (
        ["model", "head_name", "layer", "head", "induction", column]
        + [named.get(c, c) for c in keep[5:]]
        + ["prefix_matching", "copies", "induction_head"]
    )
    return out.reset_index(drop=True)[cols]


# ------------------------------------------------------------------------------ on real inputs


def ov_copying(
    model,
    probe,
    heads: Sequence[tuple[int, int]] | None = None,
    k: int = COPYING_K,
    weights: HeadWeights | None = None,
    batch_size: int = 4,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Copying on real inputs, for ``heads`` (default: every head), on a repeat ``probe``.

    The attended positions are the first copy of ``R`` (positions ``1..L``). Returns one row per
    head: ``copying`` = copying@k (share of positions whose own-token logit is among the ``k``
    highest of the ordinary vocabulary), ``ci_low`` / ``ci_high`` its percentile interval from
    resampling the probe's sequences (``resamples`` times at ``level``, seeded; positions of one
    sequence stay together), ``median_rank`` (0 = highest), ``null`` = copying@k of another token
    of ``R`` read from the same output (the control, :func:`null_columns`), ``n`` positions and
    ``chance`` = ``k / vocab``. Cost: about ``2 * n * d_model * vocab`` flops per head.
    """
    from headscope.uncertainty import bootstrap

    ranks, vocab = copying_ranks(model, probe, heads, weights, batch_size, null=True)
    L = probe.repeat_len
    # [sequence, head, 1]: hits per sequence, what the interval resamples
    hits = torch.stack([(r[..., 0] < k).double().sum(1) for r in ranks.values()], 1)[..., None]
    counts = torch.full((len(probe),), float(L), dtype=torch.float64)
    spread = bootstrap(hits, counts, None, resamples, level, seed) if resamples else None
    rows = []
    for i, ((layer, head), r) in enumerate(ranks.items()):
        own, other = r[..., 0].flatten(), r[..., 1].flatten()
        rows.append(
            {
                "model": model.name,
                "layer": layer,
                "head": head,
                "head_name": head_name(layer, head),
                "copying": float((own < k).float().mean()),
                "ci_low": float(spread.ci_low[i, 0]) if spread else float("nan"),
                "ci_high": float(spread.ci_high[i, 0]) if spread else float("nan"),
                "median_rank": float(own.float().median()),
                "null": float((other < k).float().mean()),
                "n": len(own),
                "k": k,
                "chance": k / vocab,
            }
        )
    return pd.DataFrame(rows)
