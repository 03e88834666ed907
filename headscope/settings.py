"""The one settings base: every command's settings are a frozen dataclass derived from
:class:`Settings`, one field per setting, checked once when the object is made.

A field is declared with :func:`opt`: its default, its help text and how the command line spells
it (:mod:`headscope.cli.options` builds the command's options from the fields, so ``--help`` can
never disagree with the settings, and a new setting is one field). The base gives every command
the same four things: :meth:`Settings.record` (what ``metadata.json`` saves),
:meth:`Settings.changed` (what differs from the defaults), :meth:`Settings.names` and
:meth:`Settings.configure` (the Python API's keyword settings, unknown names refused with a
did-you-mean). Field groups several commands share are declared once here: where the model runs
(:class:`Placement`) and the intervals (:class:`Resampling`).

Naming: ``<Command>Settings`` (``ScanSettings``, ``PatchSettings``, ``CircuitSettings``,
``CensusSettings``, ``PlanSettings``); messages name a setting the way both callers know it,
``n_pairs (--n-pairs)``. Nothing here imports torch: ``--help`` and refusals stay instant.

>>> @dataclass(frozen=True)
... class Demo(Resampling):
...     n: int = opt(3, "How many.")
>>> Demo(n=5).changed()
{'n': 5}
>>> Demo.configure(None, {"nn": 1})
Traceback (most recent call last):
...
headscope.errors.HeadscopeError: Unknown setting 'nn'. Did you mean: n? Settings: bootstrap, ci, n.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from headscope.errors import HeadscopeError, at_least, did_you_mean, setting
from headscope.uncertainty import check as check_bootstrap

#: The dtypes a model's weights may be loaded in.
DTYPE_NAMES = ("float32", "bfloat16", "float16")


def opt(default, help: str, **cli):
    """A setting: its default, its help text, and how the CLI spells it (``cli`` keys: ``flag``
    the option's name, ``kind`` (``csv``, ``floats``, ``thresholds``, ``memory``, ``path``),
    ``flag_value`` (an option whose value may be left out), ``metavar``, ``choices`` shown in the
    help)."""
    meta = {"help": help, **cli}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


def check_dtype(dtype: str | None) -> None:
    """Refuse an unknown dtype name in one line (None: the model's own, or float32)."""
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise HeadscopeError(
            f"Unknown dtype '{dtype}'.{did_you_mean(dtype, DTYPE_NAMES)} "
            f"Use one of {', '.join(DTYPE_NAMES)}."
        )


def check_choice(name: str, value, allowed: Sequence[str]) -> None:
    """One line for a value outside ``allowed``, naming the setting and the nearest choice."""
    if value not in allowed:
        raise HeadscopeError(
            f"Unknown {setting(name)} '{value}'.{did_you_mean(str(value), allowed)} "
            f"Use one of {', '.join(allowed)}."
        )


def as_tuple(value) -> tuple | None:
    """A comma-separated string or a sequence as a tuple of stripped, distinct, non-empty items
    (None stays None).

    >>> as_tuple(" z, v ,z,"), as_tuple(None)
    (('z', 'v'), None)
    """
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(dict.fromkeys(str(v).strip() for v in items if str(v).strip()))


@dataclass(frozen=True)
class Settings:
    """The base of every command's settings (see the module docstring)."""

    def __post_init__(self) -> None:
        self.normalise()
        self.check()

    def normalise(self) -> None:
        """Put typed values in their canonical form (names lower-cased, lists as tuples)."""

    def check(self) -> None:
        """Refuse a bad value in one line (a subclass adds its own checks, calling this)."""

    def put(self, name: str, value) -> None:
        """Set a field while normalising (the object is frozen once made)."""
        object.__setattr__(self, name, value)

    def record(self) -> dict:
        """The settings as ``metadata.json`` saves them (tuples as lists, mappings as dicts)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):  # a metric given as an object is saved by its name
                value = [v if isinstance(v, (str, int, float)) else v.name for v in value]
            elif isinstance(value, Mapping):
                value = {str(k): v for k, v in value.items()}
            out[f.name] = value
        return out

    def changed(self) -> dict:
        """The recorded settings that differ from their defaults (what a reader wants first)."""
        default = type(self)().record()
        return {k: v for k, v in self.record().items() if v != default[k]}

    @classmethod
    def names(cls) -> list[str]:
        """Every field's name, in order (what the command has an option for)."""
        return [f.name for f in fields(cls)]

    @classmethod
    def configure(cls, config=None, settings: Mapping | None = None):
        """``config`` (default: the defaults) with the keyword ``settings`` of the Python API
        applied, checked once; an unknown name is refused in one line."""
        settings = dict(settings or {})
        names = cls.names()
        unknown = [k for k in settings if k not in names]
        if unknown:
            raise HeadscopeError(
                f"Unknown setting '{unknown[0]}'.{did_you_mean(unknown[0], names)} "
                f"Settings: {', '.join(names)}."
            )
        settings = {k: (tuple(v) if isinstance(v, list) else v) for k, v in settings.items()}
        if config is None:
            return cls(**settings)
        return replace(config, **settings) if settings else config


# ------------------------------------------------------------------------------ shared groups


@dataclass(frozen=True)
class Resampling(Settings):
    """The bootstrap behind every interval."""

    bootstrap: int = opt(1000, "Resamples for every interval (0: none).")
    ci: float = opt(0.95, "Coverage of the intervals.")

    def check(self) -> None:
        super().check()
        check_bootstrap(self.bootstrap, self.ci)


@dataclass(frozen=True)
class Placement(Settings):
    """Where the model runs."""

    device: str = opt("auto", "auto, cpu, cuda, cuda:N or mps.")
    dtype: str | None = opt(
        None, "Model weights dtype: float32, bfloat16 or float16. [default: float32]"
    )
    threads: int | None = opt(None, "CPU threads for torch. [default: torch's choice]")

    def check(self) -> None:
        super().check()
        check_dtype(self.dtype)
        at_least("threads", self.threads)
