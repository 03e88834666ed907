"""Helpers of the patching notebook (``analyses/08_ioi_patching.ipynb``): attribution against exact
with intervals over pairs, where each head looks from the last position, whether its OV circuit
copies a name, and the heads Wang et al. (2022) name in GPT-2 small.

* :func:`agreement`: per slice of a :class:`~headscope.apps.patch.PatchResult` run with both
  estimators, the Spearman correlation of attribution and exact effects over heads and the overlap
  of their top 10 by |effect|, each with a bootstrap interval over pairs (the pairs are resampled,
  every effect recomputed from the per-pair metrics, the statistic recomputed);
* :func:`attention_from_end`: a head's attention from the last position (END) to named positions
  (IO, S1, S2), mean over pairs with its interval;
* :func:`name_copying`: does the head's OV circuit raise the logit of the name at a position? The
  attention input at that position (the real residual stream, after the layer's norm) through
  ``W_V W_O`` and the unembedding (final norm's weight folded in, as
  :mod:`headscope.circuits.copying` does): the share of pairs whose name is among the ``k``
  highest logits, with its interval;
* :data:`WANG_GPT2_SMALL`: the IOI circuit's head classes in GPT-2 small as the paper names them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from headscope.circuits.copying import head_weights, own_token_ranks
from headscope.effects.patching import make_batches, run_cached
from headscope.errors import HeadscopeError
from headscope.uncertainty import LEVEL, RESAMPLES, draw_weights

#: Wang et al. (2022), "Interpretability in the wild", arXiv:2211.00593, Figure 2 and section 3:
#: the IOI circuit of GPT-2 small (12 layers x 12 heads), head ``layer.head`` written ``L{l}H{h}``,
#: with where each class acts and what it does there.
WANG_GPT2_SMALL = {
    "name mover": (["L9H9", "L9H6", "L10H0"], "END", "attend to IO and copy it to the logits"),
    "negative name mover": (["L10H7", "L11H10"], "END", "attend to IO and write against it"),
    "backup name mover": (
        ["L9H0", "L9H7", "L10H1", "L10H2", "L10H6", "L10H10", "L11H2", "L11H9"],
        "END",
        "take over when the name movers are ablated",
    ),
    "S-inhibition": (
        ["L7H3", "L7H9", "L8H6", "L8H10"],
        "END",
        "attend to S2; stop the name movers attending to S",
    ),
    "induction": (["L5H5", "L5H8", "L5H9", "L6H9"], "S2", "attend from S2 to the token after S1"),
    "duplicate token": (["L0H1", "L0H10", "L3H0"], "S2", "attend from S2 to S1"),
    "previous token": (["L2H2", "L4H11"], "S1+1", "attend to the previous token"),
}


def wang_table() -> pd.DataFrame:
    """:data:`WANG_GPT2_SMALL` as a table, one row per class."""
    return pd.DataFrame(
        [
            {"class": k, "GPT-2 small heads": ", ".join(h), "acts at": at, "what it does": what}
            for k, (h, at, what) in WANG_GPT2_SMALL.items()
        ]
    )


def _ratio(
    w: torch.Tensor,
    clean: torch.Tensor,
    corrupt: torch.Tensor,
    patched: torch.Tensor,
    denoise: torch.Tensor,
) -> torch.Tensor:
    """Effects (ratio of means) of every row under pair weights ``w`` ``[resample, pair]``:
    ``[resample, row]``."""
    c, k = (w @ clean)[:, None], (w @ corrupt)[:, None]
    p = w @ patched.T  # [resample, row]
    gap = c - k
    return torch.where(denoise[None], p - k, c - p) / torch.where(gap == 0, torch.nan, gap)


def agreement(
    result,
    keys: Sequence[str] = ("activation", "kv_mode", "position", "direction"),
    top: int = 10,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> pd.DataFrame:
    """Attribution against exact, per slice ``keys`` of ``result`` (heads with both estimators):
    Spearman over heads and top-``top`` overlap by |effect|, each with a percentile interval over
    resampled pairs (one draw per resample, shared by every row)."""
    t = result.table.reset_index(drop=True)
    m = result.per_pair.get("m_patched")
    if m is None or len(m) != len(t):
        raise HeadscopeError(
            "agreement() needs a result of patch() (its per-pair metrics), not one read back."
        )
    clean, corrupt = result.per_pair["m_clean"].double(), result.per_pair["m_corrupt"].double()
    n = len(clean)
    w = torch.cat(
        [torch.full((1, n), 1.0 / n, dtype=torch.float64), draw_weights(n, resamples, seed) / n]
    )
    alpha = (1 - level) / 2
    rows = []
    for key, sub in t.groupby(list(keys), sort=False):
        sub = sub.assign(row=sub.index)  # the row of m_patched
        ex = sub[sub["estimator"] == "exact"].set_index("head_name")
        at = sub[sub["estimator"] == "attribution"].set_index("head_name")
        heads = [h for h in ex.index if h in at.index]
        if len(heads) < 3:
            continue
        i_ex, i_at = ex.loc[heads, "row"].to_numpy(), at.loc[heads, "row"].to_numpy()
        idx = torch.as_tensor(np.concatenate([i_ex, i_at]))
        denoise = torch.tensor([d == "denoising" for d in t.loc[idx.numpy(), "direction"]])
        eff = _ratio(w, clean, corrupt, m[idx].double(), denoise)  # [1 + resample, 2 * heads]
        e, a = eff[:, : len(heads)], eff[:, len(heads) :]
        rho = torch.tensor(
            [_spearman(x, y) for x, y in zip(e.numpy(), a.numpy(), strict=True)],
            dtype=torch.float64,
        )
        k = min(top, len(heads))
        overlap = torch.tensor(
            [
                len(set(np.argsort(-np.abs(x))[:k]) & set(np.argsort(-np.abs(y))[:k]))
                for x, y in zip(e.numpy(), a.numpy(), strict=True)
            ],
            dtype=torch.float64,
        )
        q = torch.tensor([alpha, 1 - alpha], dtype=torch.float64)
        r_lo, r_hi = torch.nanquantile(rho[1:], q) if resamples else (torch.nan, torch.nan)
        o_lo, o_hi = torch.quantile(overlap[1:], q) if resamples else (torch.nan, torch.nan)
        rows.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
                "heads": len(heads),
                "spearman": float(rho[0]),
                "spearman_ci_low": float(r_lo),
                "spearman_ci_high": float(r_hi),
                f"top{top}_overlap": int(overlap[0]),
                "overlap_ci_low": float(o_lo),
                "overlap_ci_high": float(o_hi),
                "max_abs_exact": float(np.nanmax(np.abs(e[0].numpy()))),
            }
        )
    return pd.DataFrame(rows)


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3:
        return float("nan")
    rx, ry = pd.Series(x[ok]).rank().to_numpy(), pd.Series(y[ok]).rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _interval(
    per_pair: torch.Tensor, resamples: int, level: float, seed: int
) -> tuple[float, float, float]:
    """Mean over pairs (dim 0) and its percentile interval."""
    n = per_pair.shape[0]
    mean = float(per_pair.double().mean())
    if not resamples:
        return mean, float("nan"), float("nan")
    boot = (draw_weights(n, resamples, seed) / n) @ per_pair.double()
    alpha = (1 - level) / 2
    lo, hi = torch.quantile(boot, torch.tensor([alpha, 1 - alpha], dtype=torch.float64))
    return mean, float(lo), float(hi)


def attention_from_end(
    model,
    tokens,
    heads: Sequence[tuple[int, int]],
    to: Sequence[str] = ("IO", "S1", "S2"),
    prompt: str = "clean",
    batch_size: int = 32,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> pd.DataFrame:
    """Each head's attention from the last position (END) to each named position in ``to``, on the
    ``prompt`` side of the tokenized task ``tokens``: mean over pairs with its interval."""
    missing = [p for p in to if p not in tokens.positions]
    if missing:
        raise HeadscopeError(
            f"The task has no position {missing[0]}; it has {', '.join(tokens.positions)}."
        )
    n = len(tokens)
    got = {(la, h, p): torch.zeros(n, dtype=torch.float64) for la, h in heads for p in to}
    for batch in make_batches(tokens, batch_size, model.pad_id):
        run = run_cached(model, batch, prompt, tokens.metric, ("pattern",))
        rows = torch.arange(len(batch.index))
        end = batch.lengths - 1
        for la, h in heads:
            pat = run.acts[la]["pattern"][:, h].double().cpu()  # [b, query, key]
            for p in to:
                got[(la, h, p)][batch.index] = pat[rows, end, batch.positions[p]]
    out = []
    for (la, h, p), x in got.items():
        mean, lo, hi = _interval(x, resamples, level, seed)
        out.append(
            {
                "head_name": f"L{la}H{h}",
                "layer": la,
                "head": h,
                "to": p,
                "attention": mean,
                "ci_low": lo,
                "ci_high": hi,
                "n_pairs": n,
            }
        )
    return pd.DataFrame(out)


def name_copying(
    model,
    tokens,
    heads: Sequence[tuple[int, int]],
    at: str = "IO",
    k: int = 5,
    batch_size: int = 16,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> pd.DataFrame:
    """Whether each head's OV circuit copies the name at position ``at`` of the clean prompts: the
    share of pairs whose token there is among the ``k`` highest logits of ``x W_V W_O`` read through
    the unembedding (``x``: the head's attention input at ``at``), with its interval, and the
    median rank (0 = highest). Chance is ``k / vocab`` (the ``chance`` column)."""
    w = head_weights(model)
    layers = sorted({la for la, _ in heads})
    xs: dict[int, list[torch.Tensor]] = {la: [] for la in layers}
    cols = []
    for start in range(0, len(tokens), batch_size):
        ids = tokens.clean[start : start + batch_size]
        n = max(len(c) for c in ids)
        t = torch.full((len(ids), n), model.pad_id, dtype=torch.long)
        for r, c in enumerate(ids):
            t[r, : len(c)] = torch.tensor(c)
        where = torch.tensor(tokens.positions[at][start : start + batch_size])
        got = model.attention_inputs(t, layers)  # causal: right padding changes nothing before it
        rows = torch.arange(len(ids))
        for la in layers:
            xs[la].append(got[la][rows, where].float().cpu())
        cols.append(w.columns(t[rows, where]))
    columns = torch.cat(cols)
    out = []
    for la, h in heads:
        ranks = own_token_ranks(torch.cat(xs[la]), columns, w.W_V[la, h], w.W_O[la, h], w.unembed)
        hit = (ranks < k).double()
        mean, lo, hi = _interval(hit, resamples, level, seed)
        out.append(
            {
                "head_name": f"L{la}H{h}",
                "layer": la,
                "head": h,
                "name_copying": mean,
                "ci_low": lo,
                "ci_high": hi,
                "median_rank": float(ranks.double().median()),
                "k": k,
                "chance": k / len(w.token_ids),
                "n_pairs": len(hit),
            }
        )
    return pd.DataFrame(out)
