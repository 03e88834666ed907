"""A KV-cache plan's settings: one frozen object checked when it is made (no torch here, so
``headscope kvplan --help`` and its refusals are instant); the command's options are its fields."""

from __future__ import annotations

from dataclasses import dataclass

from headscope.errors import HeadscopeError, at_least
from headscope.scanner.config import ScanConfig, check_long, opt


@dataclass(frozen=True)
class PlanSettings:
    """What a plan restricts and how it is verified."""

    budgets: tuple = opt(
        (0.25, 0.5, 0.75),
        "Shares of the heads to restrict to sinks + window, in 0..1.",
        kind="floats",
    )
    seeds: int = opt(3, "Random head sets per budget: the baseline the plan must beat.")
    sinks: int = opt(4, "First tokens a restricted head still sees (attention sinks).")
    window: int = opt(64, "Most recent tokens a restricted head still sees.")
    seq_len: int = opt(2048, "Length of the held-out texts and needles (and of a MODEL's scan).")
    n_texts: int = opt(2, "Held-out prose sequences the loss is measured on.", flag="--texts")
    depths: tuple = opt(
        (0.1, 0.3, 0.5, 0.7, 0.9), "Needle depths, fractions of the haystack.", kind="floats"
    )
    needles_per_depth: int = opt(
        2, "Needles at each depth (greedy decoding of each, all tokens right to count)."
    )
    needle_tokens: int = opt(8, "Random tokens in each needle.")
    scan_sequences: int = opt(
        8, "With a MODEL: long prose sequences its long-context scan reads to choose the heads."
    )
    scan_bootstrap: int = opt(
        200, "With a MODEL: bootstrap resamples of that scan (its scores' intervals)."
    )

    def __post_init__(self) -> None:
        for name in ("budgets", "depths"):
            value = getattr(self, name)
            if isinstance(value, (list, str)):
                object.__setattr__(
                    self,
                    name,
                    tuple(
                        float(x) for x in (value.split(",") if isinstance(value, str) else value)
                    ),
                )
        bad = [b for b in self.budgets if not (isinstance(b, (int, float)) and 0.0 <= b <= 1.0)]
        if bad or not self.budgets:
            raise HeadscopeError(
                "Budgets are fractions of the heads, in 0..1; got "
                f"{list(self.budgets)}. "
                "Use e.g. --budgets 0.25,0.5,0.75."
            )
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise HeadscopeError(
                "Depths are fractions of the haystack, in 0..1; got "
                f"{list(self.depths)}. "
                "Use e.g. --depths 0.1,0.5,0.9."
            )
        at_least("seeds", self.seeds, 0)
        at_least("texts", self.n_texts)
        at_least("needles_per_depth", self.needles_per_depth)
        at_least("scan_sequences", self.scan_sequences)
        at_least("scan_bootstrap", self.scan_bootstrap, 0)
        check_long(self.seq_len, self.sinks, self.window, self.needle_tokens)

    def scan_config(self) -> ScanConfig:
        """The long-context scan that chooses the heads, when the plan starts from a model."""
        return ScanConfig(
            long_context=True,
            seq_len=self.seq_len,
            sinks=self.sinks,
            window=self.window,
            needle_tokens=self.needle_tokens,
            metrics=("streaming", "retrieval", "retrieval_soft"),
            n_prompts=self.scan_sequences,
            bootstrap=self.scan_bootstrap,
        )

    def validate(self, n_ctx: int | None = None) -> PlanSettings:
        """The checks that need the model: the plan's length fits its context."""
        if n_ctx is not None and self.seq_len > n_ctx:
            raise HeadscopeError(
                f"--seq-len {self.seq_len} is longer than the model's context "
                f"({n_ctx}); use at most "
                f"{n_ctx}."
            )
        return self
