"""Where the top heads look, on one example of each probe: the patterns a run's report draws.

A scan keeps, for a few heads (the strongest of each labelled behaviour, at most :data:`MAX_HEADS`),
their whole attention pattern on the first sequence of each scored probe, cut to its first
:data:`MAX_TOKENS` tokens (the cut sequence is what the model runs on). They are saved with the run
(``views.npz``), so ``report.html`` shows them interactively without the model.

Patterns come from the same attention seam as the scores: the blocked engine's exact
``softmax(q k^T)`` blocks (what the fused engine scores), or the hooks engine's ``hook_pattern``
when the scan read the model's own attention (soft-capping and the like).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from headscope.errors import HeadscopeError
from headscope.metrics import REGISTRY
from headscope.result import Probe, display_token

# a view longer than this is cut (and says so): 128 x 128 cells per head stay readable
MAX_TOKENS = 128
MAX_HEADS = 8


def pick_heads(scores: pd.DataFrame, k: int = MAX_HEADS) -> list[tuple[int, int]]:
    """The strongest head of each labelled pattern behaviour (lowest for entropy), distinct, in the
    table's metric order, at most ``k``; behaviours whose scores are all NaN give none."""
    heads: list[tuple[int, int]] = []
    for metric in scores["metric"].unique():
        info = REGISTRY.get(metric)
        sub = scores[(scores["metric"] == metric) & scores["score"].notna()]
        if info is None or not info.label or sub.empty:
            continue
        top = sub.loc[sub["score"].idxmin() if info.below else sub["score"].idxmax()]
        head = (int(top["layer"]), int(top["head"]))
        if head not in heads:
            heads.append(head)
    return heads[:k]


def example_patterns(
    model,
    probes: Sequence[Probe],
    heads: Sequence[tuple[int, int]],
    engine: str = "blocked",
    max_tokens: int = MAX_TOKENS,
    interventions: Sequence = (),
) -> list[dict]:
    """One record per probe (controls left out): ``probe``, ``token_ids`` (cut), ``tokens`` (their
    display strings), ``n_full`` (the sequence's own length) and ``pattern`` ``[head, query, key]``
    (float32, in ``heads``' order).

    ``engine``: ``blocked`` (exact softmax of q k^T, any device) or ``hooks`` (the model's own
    attention, through transformer-lens); the scan passes the kind it used, and its
    ``interventions``."""
    from headscope.engines.extract import pad_batch, pattern_batch
    from headscope.engines.registry import get_engine

    if not heads:
        return []
    eng = get_engine("hooks" if engine == "hooks" else "blocked")
    layers = sorted({layer for layer, _ in heads})
    out = []
    for probe in probes:
        if probe.settings.get("null_of") or not probe.sequences:
            continue
        ids = [int(t) for t in probe.sequences[0][:max_tokens]]
        n = len(ids)
        tokens, mask, lengths = pad_batch([ids], model.pad_id)  # [1, n] each
        kept = {layer: np.zeros((model.n_heads, n, n), dtype=np.float32) for layer in layers}

        def on_rows(layer: int, rows, q_start: int, kept=kept) -> None:
            p = rows.pattern[0].float().cpu().numpy()  # [head, query block, keys seen]
            kept[layer][:, q_start : q_start + p.shape[1], : p.shape[2]] = p

        extra = {"interventions": interventions} if interventions else {}
        if probe.token_types is not None:
            extra["token_types"] = torch.tensor(
                [probe.token_types[0][:max_tokens]], dtype=torch.long
            )
        batch = pattern_batch(model, probe, tokens, mask, lengths)
        eng.run(model, tokens, mask, batch.to(model.device), on_rows, layers=layers, **extra)
        pattern = np.stack([kept[layer][head] for layer, head in heads])  # [head, query, key]
        if not np.isfinite(pattern).all():
            raise HeadscopeError(
                f"The {probe.name} example's attention has non-finite weights; no view is kept."
            )
        out.append(
            {
                "probe": probe.name,
                "token_ids": ids,
                "tokens": [display_token(t) for t in model.str_tokens(ids)],
                "n_full": len(probe.sequences[0]),
                "pattern": pattern,
            }
        )
    return out
