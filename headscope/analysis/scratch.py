"""Attention from scratch, and the checks that tie it to a real model (notebook 03).

The seed article builds single-head attention by hand: ``softmax(Q K^T / sqrt(d_k)) V``, with an
optional causal mask. This module holds that function and everything notebook
``analyses/03_attention_from_scratch.ipynb`` needs around it:

* the article's four-token example ("The river bank flooded") and :func:`attention` itself;
* :func:`layer_activations`, which reads one layer's queries, keys, values, pattern and head outputs
  out of a real model, so :func:`recompute_check` can redo the layer with :func:`attention` and
  compare (grouped-query models: query head ``h`` reads KV head ``h // (n_heads // n_kv_heads)``);
* the sqrt(d_k) argument as seeded simulations (:func:`dot_product_stats`, :func:`peak_stats`);
* the KV-cache property (:func:`prefix_check`) and the missing sense of order (:func:`permutation_gap`,
  :func:`permutation_table`);
* the cost of the score grid (:func:`cost_table`) next to measured time (:func:`time_scan`,
  :func:`time_one_layer`, :func:`fit_quadratic`, :func:`timing_figure`).

Hook names are transformer-lens 4.x ``TransformerBridge`` names and live only in
:func:`layer_activations`. Randomness always comes from a seeded ``torch.Generator``; figures are
``matplotlib.figure.Figure`` objects, never pyplot state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from matplotlib.figure import Figure
from torch import Tensor

from headscope.errors import HeadscopeError

# ---------------------------------------------------------------------------- the article's example

ARTICLE_TOKENS = ("The", "river", "bank", "flooded")
ARTICLE_FEATURES = ("water", "place noun", "grammar word")


def article_example(dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    """The article's token vectors ``X`` and weights ``WQ``, ``WK``, ``WV`` (its numpy code).

    ``X`` is ``[token, feature]`` with features (water, place noun, grammar word); each weight
    matrix maps those 3 features to 2 numbers, so ``d_k = 2``.

    >>> ex = article_example()
    >>> (ex["X"] @ ex["WQ"])[2].tolist()                # the query of "bank"
    [2.0, 0.0]
    """
    def t(rows):
        return torch.tensor(rows, dtype=dtype)

    return {
        "X": t([[0, 0, 1], [1, 0, 0], [0, 1, 0], [1, 0, 1]]),  # The, river, bank, flooded
        "WQ": t([[1, 0], [2, 0], [0, 1]]),
        "WK": t([[2, 0], [0, 1], [0, 1]]),
        "WV": t([[1, 0], [0, 1], [0, 0]]),
    }


# ---------------------------------------------------------------------------- attention itself


def causal_mask(n_query: int, n_key: int, device=None) -> Tensor:
    """``True`` where a query may NOT look: keys after it. ``[query, key]``.

    Queries are the last ``n_query`` of the ``n_key`` positions (a KV-cache step has
    ``n_query = 1``), so query ``i`` sits at position ``i + n_key - n_query``.

    >>> causal_mask(3, 3).int().tolist()
    [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    >>> causal_mask(1, 3).int().tolist()                # one new token sees everything
    [[0, 0, 0]]
    """
    if n_query > n_key:
        raise HeadscopeError(
            f"A causal mask needs at least as many keys as queries; got {n_query} queries, {n_key} keys."
        )
    return torch.ones(n_query, n_key, dtype=torch.bool, device=device).triu(n_key - n_query + 1)


def attention(
    Q: Float[Tensor, "... query d_k"],
    K: Float[Tensor, "... key d_k"],
    V: Float[Tensor, "... key d_v"],
    causal: bool = False,
    scale: float | None = None,
) -> tuple[Float[Tensor, "... query d_v"], Float[Tensor, "... query key"]]:
    """Scaled dot-product attention: ``softmax(Q K^T * scale [+ mask]) V``; returns (output, weights).

    ``scale`` defaults to ``1 / sqrt(d_k)`` (pass ``1.0`` for unscaled scores). With ``causal=True``
    every score of a later key is set to ``-inf`` before the softmax, so its weight is exactly 0.
    Leading dimensions (batch, head) broadcast.

    >>> ex = article_example()
    >>> Q, K, V = (ex["X"] @ ex[w] for w in ("WQ", "WK", "WV"))
    >>> out, w = attention(Q, K, V)
    >>> w[2].round(decimals=3).tolist(), out[2].round(decimals=3).tolist()   # "bank"
    ([0.028, 0.472, 0.028, 0.472], [0.944, 0.028])
    >>> out, w = attention(Q, K, V, causal=True)
    >>> out[2].round(decimals=3).tolist()
    [0.894, 0.053]
    """
    d_k = Q.shape[-1]
    scale = d_k**-0.5 if scale is None else scale
    scores = Q @ K.transpose(-2, -1) * scale  # [..., query, key]
    if causal:
        future = causal_mask(scores.shape[-2], scores.shape[-1], device=scores.device)
        scores = scores.masked_fill(future, float("-inf"))
    weights = scores.softmax(dim=-1)  # each row sums to 1
    return weights @ V, weights


def repeat_kv(x: Float[Tensor, "... kv_head pos d"], n_heads: int) -> Float[Tensor, "... head pos d"]:
    """Grouped-query attention: give each of ``n_heads`` query heads its KV head.

    Query head ``h`` uses KV head ``h // (n_heads // n_kv_heads)`` (consecutive query heads share).

    >>> kv = torch.arange(3.0).view(3, 1, 1)           # 3 KV heads, 1 position, d = 1
    >>> repeat_kv(kv, 9).flatten().tolist()
    [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    """
    n_kv = x.shape[-3]
    if n_heads % n_kv:
        raise HeadscopeError(f"{n_heads} query heads cannot share {n_kv} KV heads evenly.")
    return x.repeat_interleave(n_heads // n_kv, dim=-3)


def permutation_gap(
    out: Tensor, weights: Tensor, out_perm: Tensor, weights_perm: Tensor, perm: Sequence[int]
) -> tuple[float, float]:
    """How far attention on shuffled tokens is from the original, shuffled the same way.

    ``perm[i]`` is the original position of the token now at position ``i``. Returns
    ``(max |out_perm - out[perm]|, max |weights_perm - weights[perm][:, perm]|)``; both are 0 when
    attention is permutation-equivariant. ``out`` is ``[..., pos, d]``, weights ``[..., query, key]``.

    >>> ex = article_example()
    >>> perm = [2, 0, 3, 1]
    >>> a = attention(*(ex["X"] @ ex[w] for w in ("WQ", "WK", "WV")))
    >>> b = attention(*(ex["X"][perm] @ ex[w] for w in ("WQ", "WK", "WV")))
    >>> [round(gap, 12) for gap in permutation_gap(*a, *b, perm)]
    [0.0, 0.0]
    """
    idx = torch.as_tensor(list(perm), device=out.device)
    d_out = (out_perm - out[..., idx, :]).abs().max().item()
    d_w = (weights_perm - weights[..., idx, :][..., idx]).abs().max().item()
    return d_out, d_w


def softmax_slope(scores: Float[Tensor, "... key"]) -> Float[Tensor, ...]:
    """The largest entry of the softmax Jacobian ``dp_i/ds_j = p_i (delta_ij - p_j)``, in size.

    It is what a gradient through the softmax can be at most per unit of score; a near one-hot
    softmax has almost none. For a uniform row of ``n`` it is ``(1/n)(1 - 1/n)``.

    >>> softmax_slope(torch.zeros(4)).item()
    0.1875
    """
    p = scores.softmax(dim=-1)
    jac = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # [..., key, key]
    return jac.abs().amax(dim=(-2, -1))


# ---------------------------------------------------------------------------- why divide by sqrt(d_k)


def dot_product_stats(
    d_ks: Sequence[int], n_pairs: int = 200_000, seed: int = 0, chunk: int = 20_000
) -> pd.DataFrame:
    """Mean, variance and std of ``q . k`` for standard-normal ``q, k`` at each ``d_k``.

    Theory: mean 0, variance ``d_k``, std ``sqrt(d_k)``; dividing by ``sqrt(d_k)`` brings the std
    back to 1. One ``torch.Generator`` seeded with ``seed`` draws every pair; work goes in chunks
    of ``chunk`` pairs so memory stays small at large ``d_k``.

    >>> t = dot_product_stats([4, 64], n_pairs=20_000)
    >>> (t["var"] / t["d_k"]).round(1).tolist(), t["std_scaled"].round(1).tolist()
    ([1.0, 1.0], [1.0, 1.0])
    """
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for d_k in d_ks:
        dots = []
        for start in range(0, n_pairs, chunk):
            m = min(chunk, n_pairs - start)
            q = torch.randn(m, d_k, generator=gen, dtype=torch.float64)
            k = torch.randn(m, d_k, generator=gen, dtype=torch.float64)
            dots.append((q * k).sum(-1))  # [m]
        d = torch.cat(dots)
        rows.append({"d_k": d_k, "mean": d.mean().item(), "var": d.var().item(), "std": d.std().item(),
                     "sqrt_d_k": math.sqrt(d_k), "std_scaled": (d / math.sqrt(d_k)).std().item()})
    return pd.DataFrame(rows)


def peak_stats(
    d_k: int = 128, n_keys: int = 8, n_trials: int = 20_000, seed: int = 0,
    threshold: float = 0.99, chunk: int = 5_000,
) -> pd.DataFrame:
    """The article's simulation: how often softmax puts > ``threshold`` of its weight on one key.

    Each trial draws one standard-normal query and ``n_keys`` keys of size ``d_k`` and takes the
    softmax of the ``n_keys`` dot products, unscaled and divided by ``sqrt(d_k)``. One row per
    variant: ``frac_peaked`` (share of trials whose top weight exceeds ``threshold``), its binomial
    standard error, ``mean_top`` (the average top weight) and the mean :func:`softmax_slope`.
    The article (d_k = 128, 8 keys, 20,000 trials) reports 51% peaked unscaled, 0% scaled, and a
    top weight of 36% on average when scaled.

    >>> t = peak_stats(n_trials=2_000).set_index("scores")
    >>> bool(0.45 < t.loc["unscaled", "frac_peaked"] < 0.60), float(t.loc["scaled", "frac_peaked"])
    (True, 0.0)
    """
    gen = torch.Generator().manual_seed(seed)
    tops = {"unscaled": [], "scaled": []}
    slopes = {"unscaled": [], "scaled": []}
    for start in range(0, n_trials, chunk):
        m = min(chunk, n_trials - start)
        q = torch.randn(m, 1, d_k, generator=gen, dtype=torch.float64)
        k = torch.randn(m, n_keys, d_k, generator=gen, dtype=torch.float64)
        s = (q * k).sum(-1)  # [trial, key]
        for name, sc in (("unscaled", s), ("scaled", s / math.sqrt(d_k))):
            tops[name].append(sc.softmax(-1).amax(-1))
            slopes[name].append(softmax_slope(sc))
    rows = []
    for name in ("unscaled", "scaled"):
        top = torch.cat(tops[name])
        frac = (top > threshold).double().mean().item()
        rows.append({"scores": name, "d_k": d_k, "n_keys": n_keys, "n_trials": n_trials,
                     "frac_peaked": frac, "frac_peaked_se": math.sqrt(frac * (1 - frac) / n_trials),
                     "mean_top": top.mean().item(), "mean_slope": torch.cat(slopes[name]).mean().item()})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- a real model's layers

def layer_activations(model, ids: Sequence[int], layers: Sequence[int]) -> dict[int, dict[str, Tensor]]:
    """One forward of one sequence; each wanted layer's attention tensors, heads first
    (:meth:`headscope.models.Model.attention_activations`): ``q``/``z`` ``[head, pos, d_head]``,
    ``k``/``v`` (and ``rot_k``) ``[kv_head, pos, d_head]``, ``pattern`` ``[head, query, key]``."""
    return model.attention_activations(ids, layers)


def recompute_layer(acts: dict[str, Tensor], causal: bool) -> tuple[Tensor, Tensor]:
    """Redo one layer's attention from its captured queries, keys and values: (z, pattern).

    Uses the post-rotary ``rot_q``/``rot_k`` when the model has them, shares KV heads across query
    heads (:func:`repeat_kv`) and scales by ``1 / sqrt(d_head)``.
    """
    q = acts.get("rot_q", acts["q"])  # [head, pos, d_head]
    k = repeat_kv(acts.get("rot_k", acts["k"]), q.shape[0])
    v = repeat_kv(acts["v"], q.shape[0])
    return attention(q, k, v, causal=causal)


def recompute_check(model, ids: Sequence[int], layers: Sequence[int] | None = None) -> pd.DataFrame:
    """For each layer: max |from-scratch - model| of the pattern and of the head outputs ``z``.

    One row per layer: ``layer``, ``pattern_max_abs_diff``, ``z_max_abs_diff``, ``max_row_sum_err``
    (how far the model's rows are from summing to 1).
    """
    layers = list(range(model.n_layers)) if layers is None else list(layers)
    acts = layer_activations(model, ids, layers)
    rows = []
    for layer in layers:
        z, w = recompute_layer(acts[layer], model.causal)
        rows.append({
            "layer": layer,
            "pattern_max_abs_diff": (w - acts[layer]["pattern"]).abs().max().item(),
            "z_max_abs_diff": (z - acts[layer]["z"]).abs().max().item(),
            "max_row_sum_err": (acts[layer]["pattern"].sum(-1) - 1).abs().max().item(),
        })
    return pd.DataFrame(rows)


def all_patterns(model, ids: Sequence[int]) -> dict[int, Float[Tensor, "head query key"]]:
    """Every layer's pattern for one sequence (``model.run_patterns``), float32 on the CPU."""
    out: dict[int, Tensor] = {}
    tokens = torch.tensor([list(ids)], dtype=torch.long)

    def keep(layer: int, pattern: Tensor) -> None:
        out[layer] = pattern[0].detach().float().cpu().clone()

    model.run_patterns(tokens, torch.ones_like(tokens, dtype=torch.bool), keep)
    return out


def prefix_check(model, ids: Sequence[int]) -> pd.DataFrame:
    """The KV-cache property on a real model: appending a token leaves earlier rows unchanged.

    Runs ``ids[:-1]`` and ``ids``; per layer, ``prefix_max_abs_diff`` = max |pattern(ids)[:, :n-1,
    :n-1] - pattern(ids[:-1])| over all heads, and ``new_key_max_weight`` = the largest weight any
    earlier row puts on the new token (exactly 0 under a causal mask). Meaningful for causal models;
    for an encoder every row changes.
    """
    full = all_patterns(model, ids)
    prefix = all_patterns(model, list(ids)[:-1])
    n = len(ids) - 1
    rows = []
    for layer in sorted(full):
        rows.append({
            "layer": layer,
            "prefix_max_abs_diff": (full[layer][:, :n, :n] - prefix[layer]).abs().max().item(),
            "new_key_max_weight": full[layer][:, :n, n].abs().max().item(),
        })
    return pd.DataFrame(rows)


def permutation_table(model, ids: Sequence[int], perm: Sequence[int], layer: int = 0) -> pd.DataFrame:
    """Does shuffling the tokens just shuffle attention? Four ways of computing one layer.

    ``perm`` reorders ``ids`` (``ids[perm[i]]`` goes to position ``i``); keep position 0 (BOS)
    fixed. Rows, each with the output and weight gaps of :func:`permutation_gap` (max over heads):

    * ``queries, before positions``: the model's own pre-rotary ``q`` (output gap only);
    * ``from scratch, no positions, no mask``: :func:`attention` on the model's pre-rotary q, k, v;
    * ``from scratch, RoPE, no mask``: the same with the rotated ``rot_q``/``rot_k`` (rotary models);
    * ``the model (positions + mask)``: the model's own ``z`` and pattern.
    """
    perm = list(perm)
    a = layer_activations(model, ids, [layer])[layer]
    b = layer_activations(model, [ids[i] for i in perm], [layer])[layer]
    n_heads = a["q"].shape[0]
    idx = torch.tensor(perm)

    def row(name: str, gaps: tuple[float, float]) -> dict:
        return {"computation": name, "output_gap": gaps[0], "weights_gap": gaps[1]}

    def scratch(x: dict[str, Tensor], rotary: bool):
        q, k = (x["rot_q"], x["rot_k"]) if rotary else (x["q"], x["k"])
        return attention(q, repeat_kv(k, n_heads), repeat_kv(x["v"], n_heads))  # no mask

    rows = [row("queries, before positions", ((b["q"] - a["q"][:, idx]).abs().max().item(), math.nan)),
            row("from scratch, no positions, no mask",
                permutation_gap(*scratch(a, False), *scratch(b, False), perm))]
    if "rot_q" in a:
        rows.append(row("from scratch, RoPE, no mask", permutation_gap(*scratch(a, True), *scratch(b, True), perm)))
    rows.append(row("the model (positions + mask)", permutation_gap(a["z"], a["pattern"], b["z"], b["pattern"], perm)))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- cost


def format_bytes(n: float) -> str:
    """Decimal units, as the article writes them.

    >>> format_bytes(2 * 131072**2), format_bytes(2 * 4096**2)
    ('34.4 GB', '33.6 MB')
    """
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def cost_table(
    lengths: Sequence[int],
    d_head: int,
    n_layers: int = 1,
    n_heads: int = 1,
    n_params: float | None = None,
    bytes_per_score: int = 2,
    causal_half: bool = True,
) -> pd.DataFrame:
    """The article's cost arithmetic at each context length ``n``.

    Per head per layer: ``scores = n^2``, ``grid_bytes = n^2 * bytes_per_score``, and
    ``flops_per_head_layer = 4 n^2 d_head`` (``Q K^T`` and ``weights @ V``, 2 FLOPs per
    multiply-add each). For the whole model: ``attn_flops`` = that times ``n_layers * n_heads``
    (halved when ``causal_half``: the mask skips about half the pairs); ``weight_flops = 2 n_params n``;
    and per generated token with a KV cache, ``attn_flops_per_token = 4 n d_head n_layers n_heads``
    against ``2 n_params``.

    >>> t = cost_table([131072], d_head=128, n_layers=32, n_heads=32, n_params=8e9)
    >>> print(f'{t.loc[0, "scores"]:.3g} scores, attention/weights = {t.loc[0, "attn_to_weights"]:.2f}')
    1.72e+10 scores, attention/weights = 2.15
    """
    n = np.asarray(lengths, dtype=np.float64)
    grids = n_layers * n_heads
    t = pd.DataFrame({"n": np.asarray(lengths, dtype=np.int64)})
    t["scores"] = n**2
    t["grid_bytes"] = n**2 * bytes_per_score
    t["grid_size"] = [format_bytes(b) for b in t["grid_bytes"]]
    t["flops_per_head_layer"] = 4 * n**2 * d_head
    t["model_scores"] = n**2 * grids
    t["attn_flops"] = 4 * n**2 * d_head * grids * (0.5 if causal_half else 1.0)
    t["attn_flops_per_token"] = 4 * n * d_head * grids
    if n_params is not None:
        t["weight_flops"] = 2 * n_params * n
        t["attn_to_weights"] = t["attn_flops"] / t["weight_flops"]
        t["weight_flops_per_token"] = 2 * n_params
    return t


def _best_time(fn, repeats: int, budget_s: float = math.inf) -> float:
    """Best wall time of up to ``repeats`` calls; stop repeating once ``budget_s`` is spent."""
    best, spent = math.inf, 0.0
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent >= budget_s:
            break
    return best


def time_scan(
    model, repeat_lens: Sequence[int], seed: int = 0, repeats: int = 1, budget_s: float = math.inf
) -> pd.DataFrame:
    """Wall time of ``headscope.scan`` with one repeat-probe sequence of each length.

    Each sequence is ``BOS + R + R`` (``n = 2L + 1`` tokens for a decoder); the time is the best of
    up to ``repeats`` runs (fewer once a length has used ``budget_s`` seconds: short lengths get
    every repeat, long ones may get one), after one untimed warm-up scan at the shortest length. On
    a shared machine the best of several runs is the least disturbed. ``engine`` is what the scan
    reported using (when it reports one).
    """
    import headscope

    meta: dict = {}

    def run(probe):
        meta.update(headscope.scan(model, [probe]).metadata)

    def probe_of(length):
        return headscope.repeat_probe(model, length, n_sequences=1, seed=seed)

    run(probe_of(min(repeat_lens)))  # warm-up: first-call allocations, lazy loading
    rows = []
    for length in repeat_lens:
        probe = probe_of(length)
        seconds = _best_time(lambda probe=probe: run(probe), repeats, budget_s)
        rows.append({"repeat_len": length, "n": len(probe.sequences[0]), "seconds": seconds,
                     "engine": meta.get("engine")})
    return pd.DataFrame(rows)


def time_one_layer(model, lengths: Sequence[int], layer: int = 0, seed: int = 0, repeats: int = 3) -> pd.DataFrame:
    """Wall time of a forward that stops at ``layer``'s pattern (``model.run_patterns``), per length.

    Tokens are seeded random ordinary ids; time is the best of ``repeats`` after one warm-up.
    """
    gen = torch.Generator().manual_seed(seed)
    vocab = model.ordinary_vocab()

    def run(n):
        ids = vocab[torch.randint(len(vocab), (1, n), generator=gen)]  # [1, n]
        model.run_patterns(ids, torch.ones_like(ids, dtype=torch.bool), lambda _layer, _p: None, layers=[layer])

    run(min(lengths))
    return pd.DataFrame([{"n": n, "seconds": _best_time(lambda n=n: run(n), repeats)} for n in lengths])


def fit_quadratic(n: Sequence[float], seconds: Sequence[float]) -> dict[str, float]:
    """Fit ``t = a + b n + c n^2`` with ``a, b, c >= 0``, least squares on relative error.

    Relative error (each row divided by ``t``) keeps the short, fast runs from being ignored next to
    the long ones. The three parts are costs, so none may be negative: every subset of the terms is
    fitted and the best fit with no negative coefficient wins (exact non-negative least squares for
    three unknowns). Returns ``a, b, c`` and ``n_cross = b / c``, the length beyond which the
    quadratic term is the larger (``inf`` when ``c = 0``).

    >>> f = fit_quadratic([1, 2, 3, 4], [1 + 2 * x + 3 * x * x for x in [1, 2, 3, 4]])
    >>> [round(f[k], 6) for k in "abc"], round(f["n_cross"], 6)
    ([1.0, 2.0, 3.0], 0.666667)
    >>> f = fit_quadratic([1, 2, 3, 4], [5 - 0.1 * x + x * x for x in [1, 2, 3, 4]])
    >>> f["b"]                                         # a negative slope is not a cost
    0.0
    """
    x = np.asarray(n, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    design = np.stack([np.ones_like(x), x, x**2], axis=1) / y[:, None]  # [point, term]
    target = np.ones_like(y)
    best: tuple[float, np.ndarray] | None = None
    for mask in range(1, 8):  # every non-empty subset of {a, b, c}
        cols = [i for i in range(3) if mask >> i & 1]
        coef, *_ = np.linalg.lstsq(design[:, cols], target, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(3)
        full[cols] = coef
        err = float(np.sum((design @ full - target) ** 2))
        if best is None or err < best[0] - 1e-15:
            best = (err, full)
    assert best is not None  # a single term always fits with a positive coefficient
    a, b, c = (float(v) for v in best[1])
    return {"a": a, "b": b, "c": c, "n_cross": b / c if c > 0 else math.inf}


def with_fit(table: pd.DataFrame, fit: dict[str, float]) -> pd.DataFrame:
    """``table`` (columns ``n``, ``seconds``) plus the fit's prediction and the quadratic term's share."""
    t = table.copy()
    n = t["n"].astype(float)
    t["fit_seconds"] = fit["a"] + fit["b"] * n + fit["c"] * n**2
    t["quadratic_seconds"] = fit["c"] * n**2
    t["quadratic_share"] = t["quadratic_seconds"] / t["fit_seconds"]
    return t


def timing_figure(panels: Sequence[tuple[str, pd.DataFrame, dict[str, float]]], title: str) -> Figure:
    """One panel per ``(label, table, fit)``: measured seconds vs ``n``, the fit, and its ``c n^2``."""
    fig = Figure(figsize=(5.2 * len(panels), 4.0), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (label, table, fit) in zip(axes, panels, strict=True):
        n = table["n"].to_numpy(dtype=float)
        grid = np.linspace(0, n.max() * 1.05, 200)
        ax.plot(n, table["seconds"], "o", color="C0", label="measured")
        ax.plot(grid, fit["a"] + fit["b"] * grid + fit["c"] * grid**2, "-", color="C0",
                label=f"fit a + bn + cn²\nc = {fit['c']:.2e} s/token²")
        ax.plot(grid, fit["c"] * grid**2, "--", color="C3", label="quadratic term cn²")
        ax.plot(grid, fit["a"] + fit["b"] * grid, ":", color="C2", label="a + bn")
        ax.set_xlabel("context length n (tokens)")
        ax.set_ylabel("seconds")
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    return fig


def weights_figure(weights: Tensor, tokens: Sequence[str], title: str) -> Figure:
    """A ``[query, key]`` weights grid with its values written in, queries down, keys across."""
    w = weights.detach().cpu().double().numpy()
    fig = Figure(figsize=(0.9 * len(tokens) + 1.6, 0.8 * len(tokens) + 1.0), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(w, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(tokens)), tokens, rotation=45, ha="right")
    ax.set_yticks(range(len(tokens)), tokens)
    ax.set_xlabel("key (being asked)")
    ax.set_ylabel("query (asking)")
    for (i, j), v in np.ndenumerate(w):
        ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=8, color="black" if v > 0.6 else "white")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8)
    return fig
