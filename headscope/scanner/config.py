"""A scan's settings: one frozen object, checked once when it is made, that flows down.

:class:`ScanSettings` is a :class:`~headscope.settings.Settings` (the one base; ``ScanConfig`` is
its older name). The ``headscope scan`` command builds its options from these fields (name, type,
default and help text: :func:`headscope.cli.options.config_options`), builds a
:class:`ScanSettings` from what was typed and hands it on; the probes, the scan, the effects and
the run directory read it. So a new setting is one field here, with its help text, plus the code
that uses it.

Every check that needs neither the model nor a file runs when the object is made (a
``ScanSettings`` that exists is valid, and ``dataclasses.replace`` checks again); checks that need
the model (its context length) or a file (the prompts) run where the probes are built. Names are
matched without case (``--metrics Induction``). Messages name a setting the way both callers know
it: ``n_prompts (--n-prompts)``.

>>> ScanSettings().repeat_len, ScanSettings().engine, ScanSettings(metrics=("Induction",)).metrics
(50, 'auto', ('induction',))
>>> ScanSettings(n_prompts=0)
Traceback (most recent call last):
...
headscope.errors.HeadscopeError: n_prompts (--n-prompts) must be at least 1, got 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from headscope.catalog import check_score_name, describe, pattern_names
from headscope.effects.settings import ABLATIONS, MODES, EffectSettings
from headscope.engines.registry import AUTO, get_engine
from headscope.errors import HeadscopeError, at_least, did_you_mean, setting
from headscope.models.placement import check_device_map
from headscope.probes.pairs import JOINS
from headscope.result import METRIC_NAME
from headscope.scale.options import check_options
from headscope.settings import Placement, Resampling, check_choice, opt

LONG_SEQ_LEN = 2048  # the long-context view's length when --seq-len is not given
# sequences per probe when --n-prompts is not given (fewer if a prompts file holds fewer)
N_PROMPTS = 64


@dataclass(frozen=True)
class ScanSettings(Resampling, Placement):
    """Everything a scan is run with: probes, metrics, labels, engine, effects, intervals, where the
    model runs, scale-out. The model and the output folder are given beside it."""

    # ---------------------------------------------------------------- the probes
    n_prompts: int | None = opt(
        None,
        "Sequences per probe: text pairs taken from the corpus, and repeat sequences. "
        f"[default: {N_PROMPTS}, or every pair of a --prompts file that holds fewer]",
    )
    repeat_len: int = opt(50, "L of the repeat probe BOS+R+R.")
    seed: int = opt(0, "Seed of the repeat probe, its positional null and the bootstrap.")
    seq_len: int | None = opt(
        None,
        "Make every sequence this many tokens: long real prose (never repeated inside a "
        "sequence; with --prompts, your pairs packed), R as long as fits.",
    )
    prompts: str | None = opt(
        None,
        "Segment pairs, one 'A<TAB>B' a line (UTF-8; blank lines and lines starting "
        "with # are skipped). [default: the built-in corpus]",
        kind="path",
    )
    text_join: str = opt(
        "plain",
        "How a text pair becomes one sequence: plain (encoders [CLS] A [SEP] B [SEP], "
        "decoders BOS A SEP B) or chat (an instruct model's chat template: A the user turn, "
        "B the assistant's).",
        choices=JOINS,
    )
    token_types: bool = opt(
        False,
        "Feed encoder pairs their segment ids (0 for [CLS] A [SEP], 1 for B [SEP]). "
        "[default: all zero]",
    )
    long_context: bool = opt(
        False,
        "Also streaming (sink + window mass) and retrieval (needle copy-paste) on long "
        f"real prose (--seq-len, default {LONG_SEQ_LEN}) and a needle probe.",
    )
    sinks: int = opt(4, "Sink tokens of the streaming band (with --long-context).")
    window: int = opt(64, "Recent tokens of the streaming band (with --long-context).")
    needle_tokens: int = opt(8, "K random tokens in the needle probe (with --long-context).")
    # ---------------------------------------------------------------- what is scored
    metrics: tuple | None = opt(
        None,
        "Comma-separated metrics to compute (see `headscope metrics`). [default: all "
        "but the long-context ones, which --long-context adds]",
        kind="csv",
    )
    thresholds: Mapping[str, float] = opt(
        {},
        "Override a label threshold (repeatable).",
        flag="--threshold",
        kind="thresholds",
        metavar="METRIC=VALUE",
    )
    engine: str = opt(
        AUTO,
        "How attention is read: auto takes the first engine that can run (see `headscope "
        "engines`).",
        choices="engines",
    )
    batch_size: int | None = opt(
        None, "Sequences per forward pass. [default: auto, from the length and free memory]"
    )
    null: bool = opt(
        True, "Score the repeat metrics again on sequences with no repetition (the `null` column)."
    )
    examples: bool = opt(
        True, "Keep the strongest heads' patterns on one example per probe, for report.html."
    )
    # ---------------------------------------------------------------- causal effects
    effects: str | None = opt(
        None,
        "Also measure each head's causal effect (ablation) and its circuit scores. "
        "MODE: auto (the default: attribution for every head, exact ablation where it "
        "counts), attribution, exact, both.",
        flag_value="auto",
        metavar="[MODE]",
        choices=MODES,
    )
    ablation: str = opt(
        "mean",
        "What an ablated head's output becomes: mean (over the probe) or zero.",
        choices=ABLATIONS,
    )
    effects_sequences: int | None = opt(
        16,
        "Effects and circuit scores use the first N sequences of each probe "
        "(from Python, None: all of them).",
    )
    effects_batch_size: int | None = opt(
        None, "Sequences per effects forward. [default: up to 8, fewer when long]"
    )
    # ---------------------------------------------------------------- intervals
    bootstrap: int = opt(
        1000,
        "Resamples of the sequences for every score's interval and every label's stability "
        "(0: none).",
    )
    # ---------------------------------------------------------------- where the model runs
    device_map: str | None = opt(
        None,
        "A model bigger than one device: let accelerate place its layers across the GPUs (and "
        "CPU, offloading what fits nowhere): auto, balanced, balanced_low_0 or sequential. "
        "Blocked and fused engines; not with --ray or --effects.",
    )
    max_memory: Mapping | None = opt(
        None,
        "With --device-map: memory per device, e.g. 0=20GiB,1=20GiB,cpu=60GiB.",
        kind="memory",
        metavar="DEV=SIZE,...",
    )
    dtype: str | None = opt(
        None,
        "Model weights dtype: float32, bfloat16 or float16. [default: float32] Patterns are "
        "scored in float32.",
    )
    # ---------------------------------------------------------------- scale-out
    ray: str | None = opt(
        None,
        "Shard the scan's batches over Ray actors (same scores): a local instance, or the "
        "cluster at ADDRESS (HOST:PORT from `ray start --head`, auto, ray://HOST:10001). "
        "Needs the ray extra.",
        flag_value="local",
        metavar="[ADDRESS]",
    )
    workers: int | None = opt(None, "Ray actors, one model replica each. [default: 1]")

    def normalise(self) -> None:
        super().normalise()
        _normalise(self)

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        super().check()
        for name in (
            "n_prompts",
            "repeat_len",
            "batch_size",
            "seq_len",
            "effects_sequences",
            "effects_batch_size",
            "workers",
        ):
            at_least(name, getattr(self, name))
        check_choice("text_join", self.text_join, JOINS)
        if self.long_context or (self.sinks, self.window, self.needle_tokens) != (4, 64, 8):
            check_long(
                self.long_seq_len(), self.sinks, self.window, self.needle_tokens, self.long_context
            )
        if self.seq_len is not None and (self.text_join != "plain" or self.token_types):
            raise HeadscopeError(
                f"{setting('text_join')} chat and {setting('token_types')} shape the pair probe; "
                f"{setting('seq_len')} packs text instead. Use one or the other."
            )
        if self.engine != AUTO:
            # one line with a did-you-mean (the registry imports no engine to list them)
            get_engine(self.engine)
        self._check_metrics()
        if self.effects is not None:
            self.effect_settings()  # the mode and the ablation, one line each
        elif self.ablation != "mean":
            raise HeadscopeError(
                f"{setting('ablation')} {self.ablation!r} only applies with --effects."
            )
        elif self.effects_batch_size is not None:
            raise HeadscopeError(f"{setting('effects_batch_size')} only applies with --effects.")
        for name, value in self.thresholds.items():
            check_score_name(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise HeadscopeError(f"Threshold for {name} must be a number, got {value!r}.")
        check_device_map(self.device_map, self.max_memory)
        if self.device_map is not None:
            if self.ray is not None:
                raise HeadscopeError(
                    "--device-map with --ray is not supported: each Ray actor "
                    "holds a whole replica; scan a device-mapped model in one process."
                )
            if self.effects is not None:
                raise HeadscopeError(
                    "--effects with --device-map is not supported (circuit scores read the weights "
                    "directly, which a device map may have offloaded); scan without --effects."
                )
            if self.device != "auto":
                raise HeadscopeError(
                    f"--device {self.device} and --device-map both place the "
                    "model; give one of them."
                )
        check_options(self.ray, self.workers, self.effects is not None)

    def _check_metrics(self) -> None:
        if self.metrics is None:
            return
        if not self.metrics:
            raise HeadscopeError(
                f"{setting('metrics')} is empty; give names such as induction,sink."
            )
        known = pattern_names()
        for m in self.metrics:
            name = m if isinstance(m, str) else getattr(m, "name", None)
            if not isinstance(name, str):
                raise HeadscopeError(
                    f"{setting('metrics')} holds metric names or Metric objects, not {m!r}."
                )
            if not METRIC_NAME.match(name):  # a metric names a file of the run (<metric>.png)
                fixed = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).lstrip(".-") or "metric"
                raise HeadscopeError(
                    f"Metric name '{name}' is not allowed: use letters, digits, "
                    f"'_', '.' and '-' (it names the run's {name}.png), e.g. '{fixed}'."
                )
            if isinstance(m, str) and name not in known:
                raise HeadscopeError(
                    f"Unknown metric '{name}'.{did_you_mean(name, known)} Known: "
                    f"{', '.join(known)}."
                )

    # ------------------------------------------------------------------ what follows from the
    # settings
    def long_seq_len(self) -> int:
        """The context length of the long-context view: ``seq_len``, else 2048."""
        return self.seq_len if self.seq_len is not None else LONG_SEQ_LEN

    def metric_objects(self) -> list:
        """The chosen :class:`~headscope.metrics.base.Metric` objects, in registry order when all
        (with ``long_context``, the long-context metrics too)."""
        from headscope.metrics import REGISTRY, default_metrics, get_metric

        if self.metrics is None:
            return list(REGISTRY.values()) if self.long_context else default_metrics()
        return [get_metric(m) if isinstance(m, str) else m for m in self.metrics]

    def effect_settings(self) -> EffectSettings | None:
        """The :class:`~headscope.effects.settings.EffectSettings` these settings ask for (None: no
        effects)."""
        if self.effects is None:
            return None
        return EffectSettings(
            mode=self.effects,
            ablation=self.ablation,
            batch_size=self.effects_batch_size,
            n_sequences=self.effects_sequences,
        ).validate()

    def probe_names(self) -> list[str]:
        """The probes the chosen metrics need, text first."""
        needed = {m.probe for m in self.metric_objects()}
        return [p for p in ("text", "repeat", "needle") if p in needed]

    @classmethod
    def configure(cls, config=None, settings=None) -> ScanSettings:
        """``config`` with ``settings`` (keyword settings of the Python API) applied, checked once.

        Older spellings still work: ``band=(sinks, window)``, ``bootstrap_seed`` (the ``seed``),
        and ``effects=EffectSettings(...)`` (its mode, ablation, sequences and batch size)."""
        settings = dict(settings or {})
        if "band" in settings:
            settings["sinks"], settings["window"] = settings.pop("band")
        if "bootstrap_seed" in settings:
            settings["seed"] = settings.pop("bootstrap_seed")
        effects = settings.get("effects")
        if isinstance(effects, EffectSettings):
            effects.validate()
            settings.update(
                effects=effects.mode,
                ablation=effects.ablation,
                effects_sequences=effects.n_sequences,
                effects_batch_size=effects.batch_size,
            )
        return super().configure(config, settings)


ScanConfig = ScanSettings  # the name it had (``headscope.ScanConfig``)


def _normalise(config: ScanSettings) -> None:
    """Names matched without case; sequences made tuples (the object is frozen and hashable)."""

    def put(name, value):
        object.__setattr__(config, name, value)

    for name in ("text_join", "engine", "ablation", "effects"):
        value = getattr(config, name)
        if isinstance(value, str):
            put(name, value.strip().lower())
    if config.metrics is not None:
        ms = config.metrics.split(",") if isinstance(config.metrics, str) else config.metrics
        put(
            "metrics",
            tuple(
                _canonical(m) if isinstance(m, str) else m
                for m in ms
                if not (isinstance(m, str) and not m.strip())
            ),
        )
    put("thresholds", {_canonical(str(k)): v for k, v in dict(config.thresholds).items()})


def _canonical(name: str) -> str:
    """A score name as the catalog spells it (``Induction`` -> ``induction``); unknown names
    unchanged."""
    info = describe(name.strip())
    return info.name if info is not None else name.strip()


def check_long(
    seq_len: int, sinks: int, window: int, needle_tokens: int, long_context: bool = True
) -> None:
    """Sink, window and needle sizes that fit the context, or one line saying what does.

    >>> check_long(2048, 4, 64, 8)
    >>> check_long(64, 4, 64, 8)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    headscope.errors.HeadscopeError: sinks (--sinks) 4 + window (--window) 64 keep every key of a
    64-token sequence; use a window below 60 or a longer --seq-len.
    """
    if not long_context:
        raise HeadscopeError(
            f"{setting('sinks')}, {setting('window')} and {setting('needle_tokens')} set up the "
            "long-context view; add --long-context."
        )
    at_least("sinks", sinks, 0)
    at_least("window", window)
    at_least("needle_tokens", needle_tokens)
    if sinks + window >= seq_len:
        raise HeadscopeError(
            f"{setting('sinks')} {sinks} + {setting('window')} {window} keep every key of a "
            f"{seq_len}-token sequence; use a window below {max(1, seq_len - sinks)} or a longer "
            "--seq-len."
        )
    if 2 * needle_tokens + 24 > seq_len:  # the needle twice, its question, and a haystack
        raise HeadscopeError(
            f"A needle of {needle_tokens} tokens does not fit a {seq_len}-token sequence; use "
            f"{setting('needle_tokens')} at most {max(1, (seq_len - 24) // 2)} or "
            "a longer --seq-len."
        )


def parse_thresholds(items: Sequence[str]) -> dict[str, float]:
    """``["induction=0.6", ...]`` -> ``{"induction": 0.6}``; one clear line for a malformed item.

    >>> parse_thresholds(["induction=0.6"])
    {'induction': 0.6}
    """
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise HeadscopeError(
                f"Threshold '{item}' must look like METRIC=VALUE, e.g. induction=0.5."
            )
        info = check_score_name(name.strip())
        try:
            out[info.name] = float(value)
        except ValueError:
            raise HeadscopeError(f"Threshold '{item}': '{value}' is not a number.") from None
    return out
