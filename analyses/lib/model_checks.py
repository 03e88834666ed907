"""From-scratch attention held against a real model: the same numbers, or a named difference.

Every score headscope reports is read from a model's post-softmax attention pattern. These checks
say that pattern is the textbook formula and nothing more: the model's own queries, keys and values
fed to :func:`~lib.attention_math.attention` give back its pattern and head outputs
(:func:`recompute_check`), earlier rows are untouched when a token is appended, which is what a KV
cache relies on (:func:`prefix_check`), and positions, not the formula, are what make attention
depend on word order (:func:`permutation_table`).

Everything a model gives comes through :class:`headscope.models.model.Model`
(:meth:`~headscope.models.model.Model.attention_activations`,
:meth:`~headscope.models.model.Model.run_patterns`), so nothing here knows a hook name.
Grouped-query models: query head ``h`` reads KV head ``h // (n_heads // n_kv_heads)``
(:func:`~lib.attention_math.repeat_kv`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from lib.attention_math import attention, permutation_gap, repeat_kv


def recompute_layer(
    acts: dict[str, Tensor], causal: bool
) -> tuple[Float[Tensor, "head query d_head"], Float[Tensor, "head query key"]]:
    """Redo one layer's attention from its captured queries, keys and values: (z, pattern).

    ``acts`` is one layer of :meth:`~headscope.models.model.Model.attention_activations`. Uses the
    post-rotary ``rot_q``/``rot_k`` when the model has them, shares KV heads across query heads
    (:func:`~lib.attention_math.repeat_kv`) and scales by ``1 / sqrt(d_head)``.

    >>> gen = torch.Generator().manual_seed(0)
    >>> q = torch.randn(4, 5, 8, generator=gen)         # 4 query heads, 5 positions, d_head 8
    >>> k, v = torch.randn(2, 2, 5, 8, generator=gen)   # 2 KV heads each
    >>> z, pattern = recompute_layer({"q": q, "k": k, "v": v}, causal=True)
    >>> tuple(z.shape), tuple(pattern.shape), bool(pattern[:, 0, 1:].eq(0).all())
    ((4, 5, 8), (4, 5, 5), True)
    """
    q = acts.get("rot_q", acts["q"])  # [head, pos, d_head]
    # [kv_head, pos, d_head] -> [head, pos, d_head]
    k = repeat_kv(acts.get("rot_k", acts["k"]), q.shape[0])
    v = repeat_kv(acts["v"], q.shape[0])  # [head, pos, d_head]
    return attention(q, k, v, causal=causal)  # [head, query, d_head], [head, query, key]


def recompute_check(model, ids: Sequence[int], layers: Sequence[int] | None = None) -> pd.DataFrame:
    """For each layer: max |from-scratch - model| of the pattern and of the head outputs ``z``.

    One forward of ``ids``; one row per layer: ``layer``, ``pattern_max_abs_diff``,
    ``z_max_abs_diff``, ``max_row_sum_err`` (how far the model's rows are from summing to 1).
    """
    layers = list(range(model.n_layers)) if layers is None else list(layers)
    acts = model.attention_activations(ids, layers)
    rows = []
    for layer in layers:
        # [head, query, d_head], [head, query, key]
        z, w = recompute_layer(acts[layer], model.causal)
        rows.append(
            {
                "layer": layer,
                "pattern_max_abs_diff": (w - acts[layer]["pattern"]).abs().max().item(),
                "z_max_abs_diff": (z - acts[layer]["z"]).abs().max().item(),
                "max_row_sum_err": (acts[layer]["pattern"].sum(-1) - 1).abs().max().item(),
            }
        )
    return pd.DataFrame(rows)


def all_patterns(model, ids: Sequence[int]) -> dict[int, Float[Tensor, "head query key"]]:
    """Every layer's pattern for one sequence (``model.run_patterns``), float32 on the CPU."""
    out: dict[int, Tensor] = {}
    tokens = torch.tensor([list(ids)], dtype=torch.long)  # [1, pos]

    def keep(layer: int, pattern: Tensor) -> None:  # [batch=1, head, query, key]
        out[layer] = pattern[0].detach().float().cpu().clone()  # [head, query, key]

    model.run_patterns(tokens, torch.ones_like(tokens, dtype=torch.bool), keep)
    return out


def prefix_check(model, ids: Sequence[int]) -> pd.DataFrame:
    """The KV-cache property on a real model: appending a token leaves earlier rows unchanged.

    Runs ``ids[:-1]`` and ``ids``; per layer, ``prefix_max_abs_diff`` = max |pattern(ids)[:, :n-1,
    :n-1] - pattern(ids[:-1])| over all heads, and ``new_key_max_weight`` = the largest weight any
    earlier row puts on the new token (exactly 0 under a causal mask). Meaningful for causal models;
    for an encoder every row changes.
    """
    full = all_patterns(model, ids)  # {layer: [head, n+1, n+1]}
    prefix = all_patterns(model, list(ids)[:-1])  # {layer: [head, n, n]}
    n = len(ids) - 1
    rows = []
    for layer in sorted(full):
        rows.append(
            {
                "layer": layer,
                "prefix_max_abs_diff": (full[layer][:, :n, :n] - prefix[layer]).abs().max().item(),
                # earlier rows, the new column
                "new_key_max_weight": full[layer][:, :n, n].abs().max().item(),
            }
        )
    return pd.DataFrame(rows)


def permutation_table(
    model, ids: Sequence[int], perm: Sequence[int], layer: int = 0
) -> pd.DataFrame:
    """Does shuffling the tokens just shuffle attention? Four ways of computing one layer.

    ``perm`` reorders ``ids`` (``ids[perm[i]]`` goes to position ``i``); keep position 0 (BOS)
    fixed. Rows, each with the output and weight gaps of
    :func:`~lib.attention_math.permutation_gap` (max over heads):

    * ``queries, before positions``: the model's own pre-rotary ``q`` (output gap only);
    * ``from scratch, no positions, no mask``: attention on the model's pre-rotary q, k, v;
    * ``from scratch, RoPE, no mask``: the same with the rotated ``rot_q``/``rot_k`` (rotary
      models);
    * ``the model (positions + mask)``: the model's own ``z`` and pattern.
    """
    perm = list(perm)
    a = model.attention_activations(ids, [layer])[layer]
    b = model.attention_activations([ids[i] for i in perm], [layer])[layer]
    n_heads = a["q"].shape[0]
    idx = torch.tensor(perm)  # [pos]

    def row(name: str, gaps: tuple[float, float]) -> dict:
        return {"computation": name, "output_gap": gaps[0], "weights_gap": gaps[1]}

    def scratch(x: dict[str, Tensor], rotary: bool) -> tuple[Tensor, Tensor]:
        # [head, pos, d], [kv_head, pos, d]
        q, k = (x["rot_q"], x["rot_k"]) if rotary else (x["q"], x["k"])
        return attention(q, repeat_kv(k, n_heads), repeat_kv(x["v"], n_heads))  # no mask

    rows = [
        row("queries, before positions", ((b["q"] - a["q"][:, idx]).abs().max().item(), math.nan)),
        row(
            "from scratch, no positions, no mask",
            permutation_gap(*scratch(a, False), *scratch(b, False), perm),
        ),
    ]
    if "rot_q" in a:
        rows.append(
            row(
                "from scratch, RoPE, no mask",
                permutation_gap(*scratch(a, True), *scratch(b, True), perm),
            )
        )
    rows.append(
        row(
            "the model (positions + mask)",
            permutation_gap(a["z"], a["pattern"], b["z"], b["pattern"], perm),
        )
    )
    return pd.DataFrame(rows)
