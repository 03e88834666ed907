"""Every named score a scores table may hold, and what it means.

A run's ``scores.csv`` holds pattern metrics (:mod:`headscope.metrics`), and, when effects were
asked for, causal effects (``effect_*``, ``attribution_*``: :mod:`headscope.effects`) and circuit
scores (``copying``, ``value_sink``: :mod:`headscope.circuits`). The report, the figures and
``compare`` ask :func:`describe` what a name means: its definition, its label and threshold,
whether low scores are the notable ones, and why it may be NaN.

>>> describe("induction").label, describe("effect_repeat_loss").label, describe("copying").label
('induction head', 'matters for copying', 'copying head')
>>> describe("no_such_score") is None
True
"""

from __future__ import annotations

from headscope.circuits.copying import COPYING
from headscope.circuits.value_weighted import VALUE_SINK
from headscope.effects.targets import TARGETS
from headscope.errors import HeadscopeError, did_you_mean
from headscope.metrics import REGISTRY


def _others() -> dict:
    out = {COPYING.name: COPYING, VALUE_SINK.name: VALUE_SINK}
    for t in TARGETS.values():
        out[t.info().name] = t.info()
        if t.output == "logits":  # a first-order estimate exists for losses only
            out[t.attribution_info().name] = t.attribution_info()
    return out


def describe(name: str):
    """The :class:`~headscope.metrics.Metric` or :class:`~headscope.result.ScoreInfo` named ``name``, or None."""
    return REGISTRY.get(name) or _others().get(name)


def is_below(name: str) -> bool:
    """Whether a score's notable heads are its lowest (entropy), not its highest."""
    info = describe(name)
    return bool(info is not None and info.below)


def names() -> list[str]:
    """Every score name, pattern metrics first."""
    return list(REGISTRY) + list(_others())


def check_score_name(name: str):
    """The description of ``name``, or one line with a did-you-mean."""
    info = describe(name)
    if info is None:
        raise HeadscopeError(f"Unknown metric '{name}'.{did_you_mean(name, names())} Known: {', '.join(names())}.")
    return info
