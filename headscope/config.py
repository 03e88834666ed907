"""A scan's settings: their defaults and their checks, in one place for the CLI and for Python.

The CLI takes its option defaults from :class:`ScanConfig` and hands the values back to it; every
check a user can fail lives in :meth:`ScanConfig.validate` (those that need no model) or in the
probe builders (those that need the model's context length). Messages name the setting the way
both callers know it: ``n_prompts (--n-prompts)``.

>>> ScanConfig().n_prompts, ScanConfig().repeat_len, ScanConfig().engine
(64, 50, 'auto')
>>> ScanConfig(n_prompts=0).validate()
Traceback (most recent call last):
...
headscope.errors.HeadscopeError: n_prompts (--n-prompts) must be at least 1, got 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from headscope.errors import HeadscopeError, at_least, setting


@dataclass(frozen=True)
class ScanConfig:
    """What to scan with: probes, metrics, labels and engine. Model, device and output are separate."""

    n_prompts: int = 64  # sequences per probe: text pairs from the corpus, and repeat sequences
    repeat_len: int = 50  # L of the repeat probe BOS + R + R
    seed: int = 0  # seeds the repeat probe, its positional null and the bootstrap
    seq_len: int | None = None  # every sequence this many tokens (text packed, R as long as fits)
    prompts: str | None = None  # segment pairs file; None = the built-in corpus
    text_join: str = "plain"  # how a pair becomes one sequence: "plain" or "chat" (an instruct model's turns)
    token_types: bool = False  # feed encoder pairs their segment ids (default: all zero, as before)
    metrics: tuple[str, ...] | None = None  # None = every registered metric
    thresholds: Mapping[str, float] = field(default_factory=dict)  # label thresholds by metric
    batch_size: int | None = None  # None = from the length and free memory
    engine: str = "auto"
    effects: str | None = None  # None = pattern scores only; else a mode of headscope.effects.MODES
    ablation: str = "mean"  # how an ablated head is replaced: "mean" or "zero"
    effects_sequences: int = 16  # effects are measured on the first N sequences of each probe
    bootstrap: int = 1000  # resamples of the sequences for intervals and label stability (0: none)
    ci: float = 0.95  # the intervals' coverage
    #: Long-context view: also the streaming and retrieval metrics, on long prose (--seq-len,
    #: default 2048) and a needle probe at several depths.
    long_context: bool = False
    sinks: int = 4  # the streaming metric's sink + window band (a StreamingLLM cache)
    window: int = 64
    needle_tokens: int = 8  # K of the needle probe

    def validate(self) -> ScanConfig:
        """Every check that needs no model; returns ``self`` so calls chain."""
        at_least("n_prompts", self.n_prompts)
        at_least("repeat_len", self.repeat_len)
        at_least("batch_size", self.batch_size)
        at_least("seq_len", self.seq_len)
        from headscope.uncertainty import check as check_bootstrap

        check_bootstrap(self.bootstrap, self.ci)
        from headscope.probes import JOINS

        if self.text_join not in JOINS:
            from headscope.errors import did_you_mean

            raise HeadscopeError(f"Unknown {setting('text_join')} '{self.text_join}'."
                                 f"{did_you_mean(self.text_join, JOINS)} Use one of {', '.join(JOINS)}.")
        if self.long_context or self.sinks != 4 or self.window != 64 or self.needle_tokens != 8:
            check_long(self.long_seq_len(), self.sinks, self.window, self.needle_tokens, self.long_context)
        if self.seq_len is not None and (self.text_join != "plain" or self.token_types):
            raise HeadscopeError(f"{setting('text_join')} chat and {setting('token_types')} shape the pair probe; "
                                 f"{setting('seq_len')} packs text instead. Use one or the other.")
        from headscope.engines import AUTO, get_engine

        if self.engine != AUTO:
            get_engine(self.engine)
        chosen = self.metric_objects()
        if self.effects is not None or self.ablation != "mean":
            self.effect_settings(required=False)
        for name, value in self.thresholds.items():
            _score(name)
            if not isinstance(value, (int, float)) or value != value:
                raise HeadscopeError(f"Threshold for {name} must be a number, got {value!r}.")
        if any(m.probe == "text" for m in chosen):
            from headscope.probes import load_pairs

            pairs = load_pairs(self.prompts)
            if self.seq_len is None and self.n_prompts > len(pairs):
                where = "the prompts file" if self.prompts else "the built-in corpus"
                raise HeadscopeError(f"{setting('n_prompts')} {self.n_prompts} asks for more pairs than {where} "
                                     f"holds ({len(pairs)}); use at most {len(pairs)}.")
        return self

    def long_seq_len(self) -> int:
        """The context length of the long-context view: ``seq_len``, else 2048."""
        return self.seq_len if self.seq_len is not None else LONG_SEQ_LEN

    def metric_objects(self) -> list:
        """The chosen :class:`~headscope.metrics.Metric` objects, in registry order when all
        (with ``long_context``, the long-context metrics too)."""
        from headscope.metrics import REGISTRY, default_metrics

        if self.metrics is None:
            return list(REGISTRY.values()) if self.long_context else default_metrics()
        names = [m.strip() for m in self.metrics if m.strip()]
        if not names:
            raise HeadscopeError(f"{setting('metrics')} is empty; give names such as induction,sink.")
        return [self._metric(n) for n in names]

    def effect_settings(self, required: bool = True):
        """The :class:`~headscope.effects.EffectSettings` these settings ask for (None: no effects)."""
        from headscope.effects import EffectSettings

        if self.effects is None:
            if self.ablation != "mean" and not required:
                raise HeadscopeError(f"{setting('ablation')} {self.ablation!r} only applies with --effects.")
            return None
        return EffectSettings(mode=self.effects, ablation=self.ablation,
                              n_sequences=self.effects_sequences).validate()

    def probe_names(self) -> list[str]:
        """The probes the chosen metrics need, text first."""
        needed = {m.probe for m in self.metric_objects()}
        return [p for p in ("text", "repeat", "needle") if p in needed]

    def record(self) -> dict:
        """The settings as saved in ``metadata.json``."""
        out = asdict(self)
        out["thresholds"] = dict(self.thresholds)
        out["metrics"] = list(self.metrics) if self.metrics is not None else None
        return out

    @staticmethod
    def _metric(name: str):
        from headscope.metrics import get_metric

        return get_metric(name)


LONG_SEQ_LEN = 2048  # the long-context view's length when --seq-len is not given


def check_long(seq_len: int, sinks: int, window: int, needle_tokens: int, long_context: bool = True) -> None:
    """Sink, window and needle sizes that fit the context, or one line saying what does.

    >>> check_long(2048, 4, 64, 8)
    >>> check_long(64, 4, 64, 8)
    Traceback (most recent call last):
    headscope.errors.HeadscopeError: sinks (--sinks) 4 + window (--window) 64 keep every key of a 64-token sequence; use a window below 60 or a longer --seq-len.
    """
    if not long_context:
        raise HeadscopeError(f"{setting('sinks')}, {setting('window')} and {setting('needle_tokens')} set up the "
                             "long-context view; add --long-context.")
    at_least("sinks", sinks, 0)
    at_least("window", window)
    at_least("needle_tokens", needle_tokens)
    if sinks + window >= seq_len:
        raise HeadscopeError(f"{setting('sinks')} {sinks} + {setting('window')} {window} keep every key of a "
                             f"{seq_len}-token sequence; use a window below {max(1, seq_len - sinks)} or a longer "
                             "--seq-len.")
    if 2 * needle_tokens + 24 > seq_len:  # the needle twice, its question, and a haystack
        raise HeadscopeError(f"A needle of {needle_tokens} tokens does not fit a {seq_len}-token sequence; use "
                             f"{setting('needle_tokens')} at most {max(1, (seq_len - 24) // 2)} or a longer --seq-len.")


def parse_thresholds(items: Sequence[str]) -> dict[str, float]:
    """``["induction=0.6", ...]`` -> ``{"induction": 0.6}``; one clear line for a malformed item.

    >>> parse_thresholds(["induction=0.6"])
    {'induction': 0.6}
    """
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise HeadscopeError(f"Threshold '{item}' must look like METRIC=VALUE, e.g. induction=0.5.")
        _score(name.strip())
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise HeadscopeError(f"Threshold '{item}': '{value}' is not a number.") from None
    return out


def _score(name: str):
    from headscope.catalog import check_score_name

    return check_score_name(name)
