"""Induction heads on the repeated-random-token probe: the stripe, the loss drop, the length sweep.

On ``BOS + R + R`` (``|R| = L`` random ordinary tokens) nothing predicts the first copy of ``R``,
and everything predicts the second, if the model can look back: find the earlier copy of the current
token and read the token after it. An induction head's pattern shows this as a stripe ``L - 1``
below the diagonal, and the model's loss collapses on the second copy (Olsson et al. 2022).

>>> import torch
>>> repeat_loss_summary(torch.tensor([[9.0, 9, 9, 9, 1, 1, 1, 1]]), repeat_len=4)
{'first_copy': 9.0, 'second_copy': 1.0, 'difference': -8.0}
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from matplotlib.figure import Figure
from torch import Tensor

from headscope.errors import HeadscopeError

# ------------------------------------------------------------------------------ one head's pattern


def sequence_pattern(
    model, ids: Sequence[int], layer: int, head: int
) -> Float[np.ndarray, "query key"]:
    """Head ``(layer, head)``'s post-softmax pattern on one token-id sequence, ``[query, key]``."""
    if not (0 <= layer < model.n_layers and 0 <= head < model.n_heads):
        raise HeadscopeError(
            f"Head L{layer}H{head} does not exist: the model has {model.n_layers} "
            "layers "
            f"x {model.n_heads} heads."
        )
    tokens = torch.tensor([list(ids)], dtype=torch.long)  # [1, pos]
    kept: dict[str, np.ndarray] = {}

    def on_pattern(_layer: int, pattern: Tensor) -> None:  # [batch=1, head, query, key]
        kept["p"] = pattern[0, head].float().cpu().numpy().copy()

    model.run_patterns(
        tokens, torch.ones_like(tokens, dtype=torch.bool), on_pattern, layers=[layer]
    )
    return kept["p"]


def offset_weights(pattern: np.ndarray, repeat_len: int) -> pd.DataFrame:
    """For each second-copy query ``q = L+1..2L``: its attention on the keys that matter.

    Columns: ``query``, ``induction`` = A[q, q-L+1], ``duplicate`` = A[q, q-L],
    ``previous`` = A[q, q-1], ``first`` = A[q, 0].
    """
    L = repeat_len
    q = np.arange(L + 1, 2 * L + 1)
    return pd.DataFrame(
        {
            "query": q,
            "induction": pattern[q, q - L + 1],
            "duplicate": pattern[q, q - L],
            "previous": pattern[q, q - 1],
            "first": pattern[q, 0],
        }
    )


def stripe_figure(pattern: np.ndarray, repeat_len: int, title: str) -> Figure:
    """Left: the pattern, the two copies of R marked. Right: per query, where its attention goes."""
    L = repeat_len
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.25])
    im = ax.imshow(pattern, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    for pos in (0.5, L + 0.5):
        ax.axhline(pos, color="white", lw=0.6, ls=":")
        ax.axvline(pos, color="white", lw=0.6, ls=":")
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    ax.set_title(f"{title}\nstripe at key = query - {L - 1}", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8, label="attention weight")
    table = offset_weights(pattern, L)
    for col, style in (("induction", "-"), ("duplicate", "--"), ("previous", ":"), ("first", "-.")):
        ax2.plot(table["query"], table[col], style, label=col)
    # a head spreading its attention evenly over the q + 1 keys it sees puts 1 / (q + 1) on each
    ax2.plot(
        table["query"],
        1.0 / (table["query"] + 1.0),
        color="0.5",
        lw=1.0,
        ls=(0, (1, 1)),
        label="uniform attention, 1/(q+1) per key",
    )
    ax2.set_ylim(-0.02, 1.02)
    ax2.set_xlabel("query position (second copy of R)")
    ax2.set_ylabel("attention weight")
    ax2.set_title(
        "induction = A[q, q-L+1], duplicate = A[q, q-L],\nprevious = A[q, q-1], first = A[q, 0]",
        fontsize=9,
    )
    ax2.legend(fontsize=8, loc="center right")
    from matplotlib.lines import Line2D

    key = Line2D(
        [],
        [],
        color="0.3",
        lw=0.8,
        ls=":",
        label=f"left, dotted (white) lines: between BOS (position 0) and the first copy of R "
        f"(1-{L}), and where the second copy starts ({L + 1})",
    )
    fig.legend(handles=[key], loc="outside lower left", fontsize=8, frameon=False)
    return fig


# ------------------------------------------------------------------------------ the loss on each
# copy


def token_losses(model, probe, batch_size: int = 8) -> Float[Tensor, "sequence position"]:
    """Per-token cross-entropy (nats) of every sequence of ``probe``; column ``t`` predicts token
    ``t+1``.

    Sequences must all have the same length (a repeat probe's do). Column ``p - 1`` is the loss on
    the token at position ``p``.
    """
    lengths = {len(s) for s in probe.sequences}
    if len(lengths) != 1:
        raise HeadscopeError("token_losses needs sequences of one length (a repeat probe).")
    out = []
    for start in range(0, len(probe), batch_size):
        # [batch, pos]
        tokens = torch.tensor(probe.sequences[start : start + batch_size], dtype=torch.long)
        logits = model.logits(tokens).float().cpu()  # [batch, pos, vocab]
        logp = torch.log_softmax(logits[:, :-1], dim=-1)  # [batch, pos-1, vocab]
        out.append(-logp.gather(-1, tokens[:, 1:, None]).squeeze(-1))  # [batch, pos-1]
    return torch.cat(out)


def repeat_loss_summary(losses: Tensor, repeat_len: int) -> dict[str, float]:
    """Mean loss on the tokens of the first copy of R and of the second (positions 2..L, L+2..2L).

    ``losses`` is :func:`token_losses`' output (column ``p - 1`` = loss on position ``p``). The
    first token of each copy is left out: nothing before it predicts it (position 1 follows BOS;
    position L+1 follows the last token of the first copy). ``difference`` = second - first (Olsson
    et al.'s in-context-learning signature is a large negative value).
    """
    L = repeat_len
    first = losses[:, 1:L].mean()  # tokens at positions 2..L
    second = losses[:, L + 1 : 2 * L].mean()  # tokens at positions L+2..2L
    return {
        "first_copy": round(float(first), 4),
        "second_copy": round(float(second), 4),
        "difference": round(float(second - first), 4),
    }


def loss_figure(losses: Tensor, repeat_len: int, title: str) -> Figure:
    """Mean per-token loss against position (band: 25th-75th percentile over sequences)."""
    L = repeat_len
    x = np.arange(1, losses.shape[1] + 1)  # position of the predicted token
    arr = losses.numpy()
    fig = Figure(figsize=(8, 3.6), layout="constrained")
    ax = fig.add_subplot()
    ax.fill_between(
        x,
        np.percentile(arr, 25, axis=0),
        np.percentile(arr, 75, axis=0),
        alpha=0.25,
        label=f"25th-75th percentile over the {arr.shape[0]} sequences",
    )
    ax.plot(x, arr.mean(0), lw=1.5, label=f"mean over the {arr.shape[0]} sequences")
    ax.axvline(
        L + 0.5, color="grey", ls="--", lw=1, label=f"the second copy starts (position {L + 1})"
    )
    top = float(arr.mean(0).max())
    ax.text(L / 2, top, "first copy of R", ha="center", va="top", fontsize=9)
    ax.text(1.5 * L, top, "second copy of R", ha="center", va="top", fontsize=9)
    ax.set_xlabel("position of the predicted token")
    ax.set_ylabel("loss (nats)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="center right")
    return fig


# ------------------------------------------------------------------------------ the length sweep


def repeat_length_sweep(
    model,
    lengths: Sequence[int],
    n_sequences: int,
    seed: int = 0,
    batch_size: int = 8,
    metrics: Sequence[str] = ("induction",),
) -> pd.DataFrame:
    """Scan a repeat probe for each ``L`` in ``lengths``; the tidy scores with a ``repeat_len``
    column."""
    from headscope.probes.pairs import repeat_probe
    from headscope.scanner.runner import scan

    frames = []
    for L in lengths:
        probe = repeat_probe(model, repeat_len=int(L), n_sequences=n_sequences, seed=seed)
        result = scan(model, [probe], metrics=list(metrics), batch_size=batch_size)
        frames.append(result.scores.assign(repeat_len=int(L)))
    return pd.concat(frames, ignore_index=True)


def sweep_figure(
    sweep: pd.DataFrame,
    heads: Sequence[str],
    metric: str = "induction",
    n_sequences: int | None = None,
    threshold: float | None = None,
) -> Figure:
    """Score against repeat length for the named heads (bars: each score's 95% interval over the
    sequences, where the sweep has ``ci_low``/``ci_high``), the chance value (uniform head) and
    the label's cut (``threshold``, default the metric's). ``n_sequences``: sequences per length,
    for the title."""
    from headscope.catalog import describe

    sub = sweep[sweep["metric"] == metric]
    fig = Figure(figsize=(7, 4.3), layout="constrained")
    ax = fig.add_subplot()
    bars = {"ci_low", "ci_high"} <= set(sub.columns) and sub["ci_low"].notna().any()
    for name in heads:
        h = sub[sub["head_name"] == name].sort_values("repeat_len")
        if bars:
            err = np.clip(
                np.vstack([h["score"] - h["ci_low"], h["ci_high"] - h["score"]]), 0.0, None
            )
            ax.errorbar(h["repeat_len"], h["score"], yerr=err, marker="o", capsize=2, label=name)
        else:
            ax.plot(h["repeat_len"], h["score"], marker="o", label=name)
    ch = sub.groupby("repeat_len")["chance"].first()
    ax.plot(ch.index, ch.to_numpy(), color="grey", ls="--", label="chance (uniform attention)")
    info = describe(metric)
    cut = threshold if threshold is not None else getattr(info, "threshold", None)
    if cut is not None and np.isfinite(cut):
        ax.axhline(cut, color="black", ls=":", lw=1.0, label=f"label cut {cut:g}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(
        sorted(sub["repeat_len"].unique()), [str(v) for v in sorted(sub["repeat_len"].unique())]
    )
    ax.set_ylim(0, 1)
    ax.set_xlabel("repeat length L (tokens in R; log scale)")
    ax.set_ylabel(f"{metric} score")
    per = f"{n_sequences} sequences per L; " if n_sequences else ""
    spread = "bars: 95% interval over them" if bars else "point estimates, no interval"
    ax.set_title(f"{sub['model'].iloc[0]}: {metric} score against L ({per}{spread})", fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    return fig
