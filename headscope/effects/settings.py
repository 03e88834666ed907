"""How effects are estimated: the mode and the ablation, checked in one line each; the words of
counterfactual patching (what is patched, which way, how). Light: no torch, so a scan's or a
patching run's settings can be checked before anything heavy loads."""

from __future__ import annotations

from dataclasses import dataclass

from headscope.errors import HeadscopeError, did_you_mean, setting
from headscope.result import Probe
from headscope.settings import Settings

#: auto: attribution for every head, exact ablation where it counts; the others as named.
MODES = ("auto", "attribution", "exact", "both")
#: What an ablated head's output becomes: its mean over the probe, or zero.
ABLATIONS = ("mean", "zero")

#: Patching (:mod:`headscope.effects.patching`): a head's output z, query, key, value, pattern.
PATCH_ACTIVATIONS = ("z", "q", "k", "v", "pattern")
#: denoising: clean activation into the corrupt run; noising: corrupt into clean.
PATCH_DIRECTIONS = ("denoising", "noising")
#: k/v on grouped-query models: the KV head (its whole group) or what one query head reads.
PATCH_KV_MODES = ("group", "head")
#: auto: attribution for every head, exact patching for the top ones; the others as named.
PATCH_ESTIMATORS = ("auto", "exact", "attribution", "both")


@dataclass(frozen=True)
class EffectSettings(Settings):
    """How effects are estimated: the mode (see the module docstring) and the ablation value (a
    scan's ``--effects`` settings: :meth:`~headscope.scanner.config.ScanSettings.effect_settings`).
    """

    mode: str = "auto"
    ablation: str = "mean"
    batch_size: int | None = None  # sequences per forward (None: up to 8, fewer for long sequences)
    n_sequences: int | None = 16  # the first N sequences of each probe (None: all of them)

    def check(self) -> None:
        super().check()
        if self.mode not in MODES:
            raise HeadscopeError(
                f"Unknown effects mode '{self.mode}'.{did_you_mean(self.mode, MODES)} "
                f"Use one of {', '.join(MODES)}."
            )
        if self.ablation not in ABLATIONS:
            raise HeadscopeError(
                f"Unknown ablation '{self.ablation}'.{did_you_mean(self.ablation, ABLATIONS)} "
                f"Use one of {', '.join(ABLATIONS)}."
            )
        if self.batch_size is not None and self.batch_size < 1:
            raise HeadscopeError(
                f"{setting('effects_batch_size')} must be at least 1, got {self.batch_size}."
            )
        if self.n_sequences is not None and self.n_sequences < 1:
            raise HeadscopeError(
                f"{setting('effects_sequences')} must be at least 1, got {self.n_sequences}."
            )

    def validate(self) -> EffectSettings:
        """The settings, checked (they are checked when made: kept for older callers)."""
        return self

    def subset(self, probe: Probe) -> Probe:
        """The sequences of ``probe`` effects are measured on."""
        if self.n_sequences is None or self.n_sequences >= len(probe):
            return probe
        return Probe(
            probe.name, probe.sequences[: self.n_sequences], probe.repeat_len, probe.settings
        )
