"""The tidy table of a path-patching run: one row per (sender, receiver, estimator), the effect read
like patching's (:func:`headscope.effects.patch_table.ratio_effects`: noising, the share of the
clean-corrupt gap destroyed; denoising, the share restored), with percentile intervals over pairs
(one bootstrap draw shared by every row) and the raw metric change ``delta`` beside it.

Columns (:data:`PATH_COLUMNS`): ``receiver`` is ``logits``, a head's input (``L9H1.q@END``) or a
group's name; ``receiver_layer`` is ``n_layers`` for logits (right of every head, where a diagram
draws it) and the lowest member's layer for a group, ``receiver_head`` -1 for logits and groups.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import torch
from torch import Tensor

from headscope.circuits.path_patching import Receiver, ReceiverGroup
from headscope.effects.patch_table import ratio_effects
from headscope.uncertainty import LEVEL, RESAMPLES

PATH_COLUMNS = [
    "task",
    "direction",
    "sender",
    "sender_layer",
    "sender_head",
    "receiver",
    "receiver_kind",
    "receiver_layer",
    "receiver_head",
    "receiver_position",
    "effect",
    "ci_low",
    "ci_high",
    "delta",
    "delta_ci_low",
    "delta_ci_high",
    "estimator",
    "freeze_mlps",
    "n_pairs",
]


def path_table(
    task: str,
    direction: str,
    n_layers: int,
    m_clean: Tensor,
    m_corrupt: Tensor,
    estimates: Mapping[str, Mapping[tuple, Tensor]],
    freeze_mlps: bool,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> pd.DataFrame:
    """Rows for every path of ``estimates = {estimator: {(sender, receiver): m_patched [pair]}}``
    (``attribution``: the patched metric is ``m_base + estimate``, as patching's tables write it).
    """
    keys, rows = [], []
    for est, by_path in estimates.items():
        for (s, r), m in by_path.items():
            keys.append((est, s, r))
            rows.append(m.double())
    if not rows:
        return pd.DataFrame(columns=PATH_COLUMNS)
    matrix = torch.stack(rows)  # [row, pair]
    denoise = torch.full((len(rows),), direction == "denoising")
    stats = ratio_effects(m_clean, m_corrupt, matrix, denoise, resamples, level, seed)
    out = []
    for i, (est, (la, h), r) in enumerate(keys):
        group = isinstance(r, ReceiverGroup)
        logits = not group and r.kind == "logits"
        out.append(
            {
                "task": task,
                "direction": direction,
                "sender": f"L{la}H{h}",
                "sender_layer": la,
                "sender_head": h,
                "receiver": r.name,
                "receiver_kind": r.kind,
                "receiver_layer": n_layers if logits else r.layer,
                "receiver_head": -1 if logits or group else r.head,
                "receiver_position": _position(r),
                "effect": stats["effect"][i],
                "ci_low": stats["ci_low"][i],
                "ci_high": stats["ci_high"][i],
                "delta": stats["delta"][i],
                "delta_ci_low": stats["delta_ci_low"][i],
                "delta_ci_high": stats["delta_ci_high"][i],
                "estimator": est,
                "freeze_mlps": bool(freeze_mlps),
                "n_pairs": int(matrix.shape[1]),
            }
        )
    return pd.DataFrame(out, columns=PATH_COLUMNS)


def _position(r: Receiver | ReceiverGroup) -> str:
    if isinstance(r, ReceiverGroup):
        return ",".join(dict.fromkeys(m.position for m in r.members))
    return "last" if r.kind == "logits" else r.position
