"""Causal effects: what happens to the model without each head.

A pattern score says where a head looks; an effect says whether that matters. For every head,
:func:`head_effects` measures the change in a target (:mod:`headscope.effects.targets`) when the
head is ablated, with two estimators on the same attention seam:

* ``exact``: one ablated forward per head (:mod:`headscope.effects.ablation`), the truth;
* ``attribution``: a first-order estimate for all heads from one forward and one backward
  (:mod:`headscope.effects.attribution`), always labelled as such.

Modes: ``exact`` and ``attribution`` run one estimator on every head, ``both`` runs both on every
head, and ``auto`` (the default) runs attribution on every head and exact ablation on the heads
that matter: the top heads by |attribution| and by each pattern score of the same probe. Each
effect row says which estimator it comes from (the ``estimator`` column of ``scores.csv``).
Encoders' embedding target has no first-order signal, so encoders get exact effects for every head.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from headscope.effects.ablation import exact_effects, head_means
from headscope.effects.attribution import attribution_effects
from headscope.effects.settings import ABLATIONS, MODES, EffectSettings
from headscope.effects.targets import TARGETS, Target, targets_for
from headscope.engines.extract import auto_batch_size
from headscope.errors import HeadscopeError
from headscope.result import Probe, ScoreInfo, timed

# auto: exact ablation for this share of heads, by |attribution| (at least 10)
TOP_BY_ATTRIBUTION = 0.1
TOP_BY_PATTERN = 3  # auto: ... and for the top heads of each pattern score of the same probe
DEFAULT_SETTINGS = EffectSettings()  # frozen, so one shared instance is a safe default


@dataclass
class EffectScores:
    """One target's effects for every head: ``[layer, head]`` scores and which estimator gave
    each."""

    metric: ScoreInfo
    # effect sums (pooled effect x count); NaN where not computed
    total: Float[Tensor, "layer head"]
    count: float
    estimator: np.ndarray = field(repr=False)  # [layer, head] of "exact" / "attribution" / ""
    chance_total: float = 0.0  # no effect
    #: the same per sequence (what a bootstrap over sequences resamples); NaN where not computed
    seq_total: Float[Tensor, "sequence layer head"] | None = field(default=None, repr=False)
    seq_count: Float[Tensor, " sequence"] | None = field(default=None, repr=False)

    @property
    def score(self) -> Float[Tensor, "layer head"]:
        return self.total / self.count if self.count else torch.full_like(self.total, torch.nan)

    @property
    def chance(self) -> float:
        return 0.0


def check_model(model, mode: str) -> list[Target]:
    """The targets ``model``'s effects are measured on, or one line saying why it cannot have
    them."""
    if not model.attention_interface:
        raise HeadscopeError(
            f"{model.name}: effects ablate heads at the attention seam, which "
            "this model's attention does not go through (a transformer-lens bridge, or a class "
            "transformers will not switch); load it by name or folder."
        )
    targets = targets_for(model)
    if model.causal and model.hf.get_output_embeddings() is None:
        raise HeadscopeError(
            f"{model.name} has no unembedding (LM head), and its effects are "
            "changes in next-token loss; load it with its LM head (a *ForCausalLM / *LMHeadModel)."
        )
    if mode == "attribution" and all(t.output != "logits" for t in targets):
        raise HeadscopeError(
            f"{model.name} is an encoder: its effect is the change of its sentence embedding, "
            "which attribution cannot estimate (zero to first order); use --effects exact."
        )
    return targets


def head_effects(
    model,
    probes: Sequence[Probe],
    settings: EffectSettings = DEFAULT_SETTINGS,
    pattern: Sequence | None = None,
    say: Callable[[str], None] | None = None,
    timings: dict[str, float] | None = None,
) -> list[EffectScores]:
    """Every head's effect on each target whose probe is in ``probes`` (see the module docstring).

    ``pattern`` (the scan's pattern results, :func:`choose_heads`) chooses, in ``auto`` mode,
    which heads also get exact ablation beside their attribution estimate. ``timings`` (a dict)
    receives the seconds each step took.
    """
    timings = {} if timings is None else timings
    settings.validate()
    say = say or (lambda _msg: None)
    targets = check_model(model, settings.mode)
    by_probe = {p.name: settings.subset(p) for p in probes}
    results = []
    for target in targets:
        probe = by_probe.get(target.probe)
        if probe is None:
            say(f"effects: no {target.probe} probe in this scan, so no {target.name} effects")
            continue
        batch_size = settings.batch_size or batch_size_for(model, probe)
        all_heads = [(la, h) for la in range(model.n_layers) for h in range(model.n_heads)]
        attribution, counts, values = None, None, (None if settings.ablation == "mean" else 0.0)
        if settings.mode in ("auto", "attribution", "both") and target.output == "logits":
            say(f"effects: attribution for {len(all_heads)} heads on {target.name}")
            with timed(timings, f"attribution_{target.name}_s"):
                attribution, counts, means = attribution_effects(
                    model, probe, target, values, batch_size
                )
                values = means if values is None else values  # the same pass gave the means
        if values is None:
            with timed(timings, f"means_{target.name}_s"):
                values = head_means(model, probe, batch_size)
        if settings.mode in ("exact", "both") or attribution is None:
            exact_heads = all_heads
        elif settings.mode == "auto":
            exact_heads = choose_heads(attribution.sum(0), pattern, target.probe)
        else:
            exact_heads = []
        exact = {}
        if exact_heads:
            say(
                f"effects: exact {settings.ablation}-ablation of {len(exact_heads)} heads on "
                f"{target.name}"
            )
            with timed(timings, f"exact_{target.name}_s"):
                exact = exact_effects(model, probe, target, exact_heads, values, batch_size)
        results.extend(_tables(model, target, attribution, counts, exact))
    return results


def batch_size_for(model, probe: Probe) -> int:
    """Sequences per effects forward: up to 8, fewer when sequences are long (backward passes keep
    every activation)."""
    return max(1, min(8, auto_batch_size(model, max(len(s) for s in probe.sequences))))


def choose_heads(
    attribution: Tensor, pattern: Sequence | None, probe: str
) -> list[tuple[int, int]]:
    """``auto``: the heads that get exact ablation: the top by |attribution| and by each pattern
    score measured on ``probe`` (``pattern``: the scan's per-score results, each with ``metric``
    and a ``[layer, head]`` ``score``; lowest first for ``below`` metrics, e.g. entropy; ties go
    to the lower (layer, head)), in layer order."""
    n_layers, n_heads = attribution.shape
    k = max(10, math.ceil(TOP_BY_ATTRIBUTION * n_layers * n_heads))
    flat = attribution.abs().flatten().argsort(descending=True)[:k]
    chosen = {(int(i) // n_heads, int(i) % n_heads) for i in flat}
    for res in pattern or ():
        if res.metric.probe != probe:
            continue
        score = np.asarray(res.score, dtype=np.float64).reshape(-1)
        rows = np.flatnonzero(~np.isnan(score))
        key = score[rows] if res.metric.below else -score[rows]
        top = rows[np.argsort(key, kind="stable")[:TOP_BY_PATTERN]]
        chosen |= {(int(i) // n_heads, int(i) % n_heads) for i in top}
    return sorted(chosen)


def _tables(
    model, target: Target, attribution: Tensor | None, counts: Tensor | None, exact: dict
) -> list[EffectScores]:
    """``effect_<target>`` (exact where computed, else the attribution estimate) and, when both
    estimators ran, ``attribution_<target>`` for every head; per sequence and pooled."""
    shape = (model.n_layers, model.n_heads)
    if exact:
        counts = next(iter(exact.values()))[1]  # [sequence]: the same target tokens for every head
    n = len(counts)
    seq = torch.full((n, *shape), torch.nan, dtype=torch.float64)  # [sequence, layer, head]
    estimator = np.full(shape, "", dtype=object)
    if attribution is not None:
        seq = attribution.clone()
        estimator[:] = "attribution"
    for (layer, head), (s, _) in exact.items():
        seq[:, layer, head] = s
        estimator[layer, head] = "exact"
    count = float(counts.sum())
    out = [
        EffectScores(target.info(), seq.sum(0), count, estimator, seq_total=seq, seq_count=counts)
    ]
    if attribution is not None and exact:
        out.append(
            EffectScores(
                target.attribution_info(),
                attribution.sum(0),
                count,
                np.full(shape, "attribution", dtype=object),
                seq_total=attribution,
                seq_count=counts,
            )
        )
    return out


__all__ = [
    "MODES",
    "ABLATIONS",
    "TARGETS",
    "EffectScores",
    "EffectSettings",
    "head_effects",
    "choose_heads",
]
