"""What the head classes are judged on besides path effects (:mod:`headscope.circuits.classes`):
attention between two named positions of a task's prompts, and the scan scores of every head.

* :func:`attention_between`: each head's attention from one named position of a task (IOI's
  ``END``) to another (``IO``) on the clean prompts, per pair, computed with
  :func:`~headscope.effects.stages.attend` (the patching engines' attention);
* :func:`scan_evidence`: the ``induction``, ``duplicate_token`` and ``previous_token`` pattern
  scores of a default scan, and the OV-circuit ``copying`` and ``copy_suppression`` scores on its
  repeat probe (:mod:`headscope.circuits.copying`, :mod:`headscope.circuits.copy_suppression`),
  as one ``[layer x head]`` table; or the same read from a scan's ``scores.csv``.
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


def scan_evidence(model, seed: int = 0, n_sequences: int = 16, say=None) -> pd.DataFrame:
    """``layer, head`` and the :data:`SCAN_EVIDENCE` scores of every head, measured now: a scan of
    the pattern metrics on default probes (``n_sequences`` each), and the copying scores on its
    repeat probe."""
    from headscope.circuits.copy_suppression import copy_suppression_scores
    from headscope.circuits.copying import copying_scores
    from headscope.scanner.runner import default_probes, scan

    say = say or (lambda _m: None)
    say(f"circuit: pattern and copying scores of every head ({n_sequences} sequences per probe)")
    probes = default_probes(model, n_prompts=n_sequences, seed=seed, metrics=PATTERN_METRICS)
    result = scan(model, probes, metrics=PATTERN_METRICS, seed=seed, bootstrap=0, null=False)
    table = scores_evidence(result.scores)
    repeat = next(p for p in probes if p.name == "repeat")
    copying = copying_scores(model, repeat, max_sequences=n_sequences).score
    suppression = copy_suppression_scores(model, repeat, max_sequences=n_sequences, resamples=50)
    table["copying"] = copying[table["layer"], table["head"]].numpy()
    table["copy_suppression"] = suppression.score[table["layer"], table["head"]].numpy()
    return table


def scores_evidence(scores: pd.DataFrame) -> pd.DataFrame:
    """The :data:`SCAN_EVIDENCE` columns a scan's ``scores.csv`` has, one row per head (the pattern
    rows; a metric the scan lacks is left out, i.e. NaN in the classes)."""
    sub = scores[scores["metric"].isin(SCAN_EVIDENCE)]
    wide = sub.pivot_table(
        index=["layer", "head"], columns="metric", values="score", aggfunc="first"
    )
    return wide.reset_index().rename_axis(columns=None)
