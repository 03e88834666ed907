"""What attention costs as the context grows: the article's arithmetic beside measured time.

``n`` tokens make ``n^2`` scores per head and layer, so the score grid is what limits long
contexts, while at short ones the weights (``2 n_params`` FLOPs per token) dominate. The article
argues this with a table for Llama 3.1 8B; this module recomputes that table for any shape
(:func:`cost_table`, :func:`format_bytes`) and measures the real thing on a loaded model
(:func:`time_scan`, :func:`time_one_layer`), so a notebook can say how large the quadratic part is
in practice. Times come from :func:`lib.timing.best_time` and are split into
``a + b n + c n^2`` by :func:`lib.timing.fit_quadratic`, the same timer and fit the
benchmarks use; :func:`with_fit` and :func:`timing_figure` show the fit next to the measurements.
Figures are ``matplotlib.figure.Figure`` objects, never pyplot state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

from lib.timing import best_time, fit_quadratic

# ---------------------------------------------------------------------------- counted


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
    (halved when ``causal_half``: the mask skips about half the pairs); ``weight_flops = 2 n_params
    n``; and per generated token with a KV cache, ``attn_flops_per_token = 4 n d_head n_layers
    n_heads`` against ``2 n_params``.

    >>> t = cost_table([131072], d_head=128, n_layers=32, n_heads=32, n_params=8e9)
    >>> print(f'{t.loc[0, "scores"]:.3g} scores, '
    ...       f'attention/weights = {t.loc[0, "attn_to_weights"]:.2f}')
    1.72e+10 scores, attention/weights = 2.15
    """
    n = np.asarray(lengths, dtype=np.float64)  # [length]
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


# ---------------------------------------------------------------------------- measured


def time_scan(
    model, repeat_lens: Sequence[int], seed: int = 0, repeats: int = 1, budget_s: float = math.inf
) -> pd.DataFrame:
    """Wall time of ``headscope.scan`` with one repeat-probe sequence of each length.

    Each sequence is ``BOS + R + R`` (``n = 2L + 1`` tokens for a decoder); the time is the
    :func:`~lib.timing.best_time` of up to ``repeats`` runs (fewer once a length has
    used ``budget_s`` seconds: short lengths get every repeat, long ones may get one), after one
    untimed warm-up scan at the shortest length. ``engine`` is what the scan reported using (when it
    reports one).
    """
    from headscope.probes.pairs import repeat_probe
    from headscope.scanner.runner import scan

    meta: dict = {}

    def run(probe):
        meta.update(scan(model, [probe]).metadata)

    def probe_of(length):
        return repeat_probe(model, length, n_sequences=1, seed=seed)

    run(probe_of(min(repeat_lens)))  # warm-up: first-call allocations, lazy loading
    rows = []
    for length in repeat_lens:
        probe = probe_of(length)
        seconds = best_time(lambda probe=probe: run(probe), repeats, budget_s)
        rows.append(
            {
                "repeat_len": length,
                "n": len(probe.sequences[0]),
                "seconds": seconds,
                "engine": meta.get("engine"),
            }
        )
    return pd.DataFrame(rows)


def time_one_layer(
    model, lengths: Sequence[int], layer: int = 0, seed: int = 0, repeats: int = 3
) -> pd.DataFrame:
    """Wall time of a forward that stops at ``layer``'s pattern (``model.run_patterns``), per
    length.

    Tokens are seeded random ordinary ids; the time is the
    :func:`~lib.timing.best_time` of ``repeats`` runs after one warm-up.
    """
    gen = torch.Generator().manual_seed(seed)
    vocab = model.ordinary_vocab()  # [vocab]

    def run(n):
        ids = vocab[torch.randint(len(vocab), (1, n), generator=gen)]  # [1, n]
        model.run_patterns(
            ids, torch.ones_like(ids, dtype=torch.bool), lambda _layer, _p: None, layers=[layer]
        )

    run(min(lengths))  # warm-up
    return pd.DataFrame(
        [{"n": n, "seconds": best_time(lambda n=n: run(n), repeats)} for n in lengths]
    )


# ---------------------------------------------------------------------------- the fit, shown


def with_fit(table: pd.DataFrame, fit: dict[str, float]) -> pd.DataFrame:
    """``table`` (columns ``n``, ``seconds``) plus the fit's prediction and the quadratic term's
    share.

    ``fit`` is :func:`lib.timing.fit_quadratic`'s ``{a, b, c}``.

    >>> t = with_fit(
    ...     pd.DataFrame({"n": [10, 100], "seconds": [1.1, 2.0]}), {"a": 1.0, "b": 0.0, "c": 1e-4}
    ... )
    >>> t["fit_seconds"].round(4).tolist(), t["quadratic_share"].round(3).tolist()
    ([1.01, 2.0], [0.01, 0.5])
    """
    t = table.copy()
    n = t["n"].astype(float)
    t["fit_seconds"] = fit["a"] + fit["b"] * n + fit["c"] * n**2
    t["quadratic_seconds"] = fit["c"] * n**2
    t["quadratic_share"] = t["quadratic_seconds"] / t["fit_seconds"]
    return t


def growth(table: pd.DataFrame) -> pd.DataFrame:
    """How time grows with ``n``, read off the measurements without a model of the cost.

    Per row (from the second on): ``n_ratio`` and ``time_ratio`` against the previous row, and the
    local exponent ``slope = log(time_ratio) / log(n_ratio)`` (1: linear, 2: quadratic).

    >>> growth(pd.DataFrame({"n": [10, 20, 40], "seconds": [1.0, 2.0, 8.0]}))["slope"].tolist()
    [nan, 1.0, 2.0]
    """
    t = table[["n", "seconds"]].astype(float).reset_index(drop=True)
    out = table.reset_index(drop=True).copy()
    out["n_ratio"] = t["n"] / t["n"].shift()
    out["time_ratio"] = t["seconds"] / t["seconds"].shift()
    out["slope"] = np.log(out["time_ratio"]) / np.log(out["n_ratio"])
    return out


def fit_spread(n: Sequence[float], seconds: Sequence[float]) -> dict[str, float]:
    """How far to trust the ``a + b n + c n^2`` split of measured times.

    Fits all points (:func:`~lib.timing.fit_quadratic`), then again leaving each
    point out in turn, and reports at the largest ``n``: the quadratic term's share of the fitted
    time (``share``) and its range over the leave-one-out fits (``share_min``, ``share_max``), plus
    the full fit's largest relative residual ``max_residual = max |fit / measured - 1|``. Needs 4
    points or more.

    >>> n = [100, 200, 400, 800]
    >>> f = fit_spread(n, [1 + 0.01 * x + 1e-5 * x * x for x in n])      # exactly quadratic
    >>> (round(f["share"], 4), round(f["share_min"], 4), round(f["share_max"], 4),
    ...  round(f["max_residual"], 6))
    (0.4156, 0.4156, 0.4156, 0.0)
    """
    x = np.asarray(n, dtype=np.float64)  # [point]
    y = np.asarray(seconds, dtype=np.float64)  # [point]
    if len(x) < 4:
        raise ValueError(
            "fit_spread needs at least 4 points (3 coefficients and one to leave "
            f"out); got {len(x)}."
        )
    top = x.max()

    def share(fit):
        total = fit["a"] + fit["b"] * top + fit["c"] * top**2
        return float(fit["c"] * top**2 / total) if total > 0 else math.nan

    full = fit_quadratic(x, y)
    pred = full["a"] + full["b"] * x + full["c"] * x**2  # [point]
    loo = [share(fit_quadratic(np.delete(x, i), np.delete(y, i))) for i in range(len(x))]
    return {
        "share": share(full),
        "share_min": float(np.min(loo)),
        "share_max": float(np.max(loo)),
        "max_residual": float(np.max(np.abs(pred / y - 1))),
        "n": float(top),
    }


def timing_figure(
    panels: Sequence[tuple[str, pd.DataFrame, dict[str, float]]],
    title: str,
    repeats: int | None = None,
) -> Figure:
    """One panel per ``(label, table, fit)``: measured seconds vs ``n`` (each the best of
    up to ``repeats`` runs, when given), the fit over the measured range, and its split into
    ``a + bn`` and ``c n^2``, drawn only when no term sits at its bound 0 (a term at the bound
    means the fit wanted a negative one, so the split is not determined; the panel says so)."""
    fig = Figure(figsize=(5.2 * len(panels), 4.0), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    what = f"measured (best of up to {repeats} runs)" if repeats else "measured"
    for ax, (label, table, fit) in zip(axes, panels, strict=True):
        n = table["n"].to_numpy(dtype=float)  # [length]
        grid = np.linspace(n.min(), n.max(), 200)  # [200]: the measured range, no extrapolation
        ax.plot(n, table["seconds"], "o", color="C0", label=what)
        ax.plot(
            grid,
            fit["a"] + fit["b"] * grid + fit["c"] * grid**2,
            "-",
            color="C0",
            label=f"fit a + bn + cn²\nc = {fit['c']:.2e} s/token²",
        )
        at_bound = [t for t in "abc" if fit[t] == 0]
        if at_bound:
            ax.text(
                0.03,
                0.97,
                f"split not determined: {', '.join(at_bound)} at its bound 0\n(the fit wanted a "
                "negative term), so a + bn and cn² are not drawn",
                transform=ax.transAxes,
                va="top",
                fontsize=7,
                color="0.3",
            )
        else:
            ax.plot(grid, fit["c"] * grid**2, "--", color="C3", label="quadratic term cn²")
            ax.plot(grid, fit["a"] + fit["b"] * grid, ":", color="C2", label="a + bn")
        ax.set_xlabel("context length n (tokens)")
        ax.set_ylabel("seconds")
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    return fig
