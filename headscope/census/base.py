"""What the census's parts share: the context they run in (the model, the settings, the probes,
what earlier parts found), the rows of ``scores.csv`` a score becomes, and the per-sequence sums
behind the no-op and ablation rows (``noop_sequences.csv``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import Tensor

from headscope.result import Probe, head_name


@dataclass
class Context:
    """What the parts share: the model, the settings, the probes, and what they found."""

    model: object
    settings: object  # the run's CensusSettings (headscope.apps.settings)
    text: Probe
    repeat: Probe
    say: Callable[[str], None]
    summary: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # file name -> table to write
    files: dict[str, Callable] = field(default_factory=dict)  # file name -> write(path)
    ablation: dict | None = None  # the whole-head mean ablation, computed once
    sequences: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)  # SEQUENCES_FILE


# ------------------------------------------------------------------------------ rows


def rows(
    model,
    metric: str,
    probe: str,
    score: Tensor,
    chance,
    n: int,
    label: str = "",
    passes: Callable[[float, float], bool] | None = None,
    null: Tensor | None = None,
    ci: tuple[Tensor, Tensor] | None = None,
    extra: dict | None = None,
) -> list[dict]:
    """One row per head: the scan's columns, then ``null``, ``ci_low``, ``ci_high`` (and ``extra``).
    ``chance`` is one number or one per layer; ``passes(score, null)`` decides the label."""
    out = []
    for layer in range(model.n_layers):
        for h in range(model.n_heads):
            s = float(score[layer, h])
            c = float(chance[layer] if isinstance(chance, Tensor) and chance.dim() == 1 else chance)
            nl = float(null[layer, h]) if null is not None else float("nan")
            row = {
                "model": model.name,
                "metric": metric,
                "probe": probe,
                "layer": layer,
                "head": h,
                "head_name": head_name(layer, h),
                "score": s,
                "chance": c,
                "n": int(n),
                "label": label if passes is not None and s == s and passes(s, nl) else "",
                "null": nl,
                "ci_low": float(ci[0][layer, h]) if ci is not None else float("nan"),
                "ci_high": float(ci[1][layer, h]) if ci is not None else float("nan"),
            }
            for k, v in (extra or {}).items():
                row[k] = float(v[layer, h])
            out.append(row)
    return out


def labelled_rows(model, info, score, chance, n, null=None, ci=None, extra=None) -> list[dict]:
    """:func:`rows` of a named score: its name, probe, label and threshold (``>=``) read from
    ``info`` (a catalog entry or a metric)."""
    passes = lambda s, _null: s >= info.threshold  # noqa: E731
    return rows(model, info.name, info.probe, score, chance, n, info.label, passes, null, ci, extra)


SEQUENCES_FILE = "noop_sequences.csv"


def per_sequence_table(parts: dict[str, tuple[Tensor, Tensor]]) -> pd.DataFrame:
    """``noop_sequences.csv``: per metric, sequence and head, the sums a pooled score is made of
    (``score = sum total / sum count`` over the sequences), so that any statistic of the heads'
    scores (a layer's mean, a median ratio of two metrics) can be resampled by sequence."""
    frames = []
    for metric, (total, count) in parts.items():
        n, n_layers, n_heads = total.shape
        seq, layer, head = torch.meshgrid(
            torch.arange(n), torch.arange(n_layers), torch.arange(n_heads), indexing="ij"
        )
        frames.append(
            pd.DataFrame(
                {
                    "metric": metric,
                    "sequence": seq.flatten().numpy(),
                    "layer": layer.flatten().numpy(),
                    "head": head.flatten().numpy(),
                    "total": total.double().flatten().numpy(),
                    "count": count.double()[:, None, None].expand(total.shape).flatten().numpy(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def pooled(sums: dict, n_seq: int, model) -> tuple[Tensor, Tensor]:
    """``{(layer, head): (sums [seq], counts [seq])}`` -> ``(totals [seq, layer, head], counts
    [seq])``."""
    tot = torch.zeros(n_seq, model.n_layers, model.n_heads, dtype=torch.float64)
    cnt = torch.zeros(n_seq, dtype=torch.float64)
    for (layer, h), (s, c) in sums.items():
        tot[:, layer, h], cnt = s, c
    return tot, cnt
