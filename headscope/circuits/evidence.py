"""What the head classes are judged on besides path effects (:mod:`headscope.circuits.classes`):
attention between two named positions of a task's prompts, and the scan scores of every head.

* :func:`attention_between`: each head's attention from one named position of a task (IOI's
  ``END``) to another (``IO``) on the clean prompts, per pair, computed with
  :func:`~headscope.effects.stages.attend` (the patching engines' attention);
* :func:`scores_evidence`: the scores the classes read (:data:`SCAN_EVIDENCE`), one row per head,
  from a scan's table (``headscope.apps.circuit.scan_evidence`` measures them when no scan is
  given).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from headscope.effects.patching import Batch, run_cached

PATTERN_METRICS = ("induction", "duplicate_token", "previous_token")
SCAN_EVIDENCE = (*PATTERN_METRICS, "copying", "copy_suppression")


def attention_between(
    model, batches: Sequence[Batch], n_pairs: int, query: str, key: str, prompt: str = "clean"
) -> Float[Tensor, "pair layer head"]:
    """Per pair, every head's attention weight from position ``query`` to position ``key``."""
    out = torch.full((n_pairs, model.n_layers, model.n_heads), torch.nan, dtype=torch.float64)
    for batch in batches:
        run = run_cached(model, batch, prompt, "logit_diff", ("pattern",))
        rows = torch.arange(len(batch.index))
        q, k = batch.positions[query], batch.positions[key]
        for layer, acts in run.acts.items():
            pat = acts["pattern"]  # [b, head, query, key]
            out[batch.index, layer] = pat[rows, :, q, k].double().cpu()
    return out


def scores_evidence(scores: pd.DataFrame) -> pd.DataFrame:
    """The :data:`SCAN_EVIDENCE` columns a scan's ``scores.csv`` has, one row per head (the pattern
    rows; a metric the scan lacks is left out, i.e. NaN in the classes)."""
    sub = scores[scores["metric"].isin(SCAN_EVIDENCE)]
    wide = sub.pivot_table(
        index=["layer", "head"], columns="metric", values="score", aggfunc="first"
    )
    return wide.reset_index().rename_axis(columns=None)
