"""The result schema: what a scan returns and a run directory holds, and the version that writes
it. A leaf: no headscope imports.

Every module that reads or writes results (report, plots, rundir, compare, runner, cli) depends on
this one, and this one depends on nothing above it (only :mod:`headscope.errors`), so the layers
stay one-way::

    result  <-  report  <-  plots  <-  rundir  <-  runner  <-  cli

The primary table is long, one row per (metric, layer, head), with the columns :data:`COLUMNS`::

    model, metric, probe, layer, head, head_name, score, chance, n, label

>>> head_name(17, 4)
'L17H4'
>>> (model_slug("HuggingFaceTB/SmolLM2-135M"), model_slug("/tmp/my model/"),
...  model_slug("gpt2@refs/pr/3"))
('SmolLM2-135M', 'my-model', 'gpt2-refs-pr-3')
>>> fmt(0.87961), fmt(float("nan"))
('0.880', 'NaN')
"""

from __future__ import annotations

import math
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - pandas loads where a table is made, not to read a constant
    import pandas as pd

from headscope.errors import HeadscopeError

#: Columns of ``scores.csv`` (and of ``ScanResult.scores``), in order.
COLUMNS = [
    "model",
    "metric",
    "probe",
    "layer",
    "head",
    "head_name",
    "score",
    "chance",
    "n",
    "label",
]
#: How floats are written to ``scores.csv``: 8 significant digits round-trip every score we report.
FLOAT_FORMAT = "%.8g"
#: What a metric's name may look like (it names files: ``<metric>.png``).
METRIC_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
#: The probe name of the repeat probe's positional null (sequences with no repetition, scored at
#: the repeat metrics' positions): saved apart, in ``controls.jsonl``.
NULL_PROBE = "repeat_null"
#: ``metadata.json`` key that marks a folder as a headscope run (see :mod:`headscope.rundir.store`).
RUN_FORMAT = "headscope-run/1"
#: headscope's version, in this one place (the build reads it; every run records it), here so that
#: any layer can read it without climbing to the package's facade.
__version__ = "0.1.0"


@dataclass(frozen=True)
class ScoreInfo:
    """What a named score in a table means (:mod:`headscope.catalog` holds one per built-in score):
    the report, the figures, the page and ``compare`` describe rows with it."""

    name: str  # the metric column value, e.g. "effect_repeat_loss"
    probe: str
    definition: str
    label: str  # given to a head whose score passes the threshold ("" = never labelled)
    threshold: float
    below: bool = False  # label heads at or below the threshold
    nan_reason: str | None = None
    unit: str = ""
    # pattern metrics: scanned when no metrics are named (long-context ones are not)
    default: bool = True
    impl: str = ""  # built-in pattern metrics: "module:attribute" of the Metric that computes it
    chance: str = ""  # census scores: what chance means for it, in words (the rows hold its value)

    def passes(self, score: float, threshold: float | None = None) -> bool:
        t = self.threshold if threshold is None else threshold
        if not self.label or score != score:
            return False
        return score <= t if self.below else score >= t


@dataclass
class Probe:
    """A named list of token-id sequences, with the settings that made it (saved in
    ``tokens.jsonl``)."""

    name: str  # "text" or "repeat"
    sequences: list[list[int]]
    repeat_len: int | None = None  # L of BOS + R + R
    settings: dict = field(default_factory=dict)
    # segment ids of encoder pairs, when fed (else all zero)
    token_types: list[list[int]] | None = None
    #: The needle probe's layout per sequence: ``{"needle_start", "answer_start", "k", "depth"}``
    #: (the K needle tokens sit at needle_start.., and are given again from answer_start).
    needles: list[dict] | None = None

    def targets(self, i: int) -> dict[int, int]:
        """The needle probe's answer queries of sequence ``i``: query position -> the key position
        of the needle token its next token copies."""
        if not self.needles:
            return {}
        nd = self.needles[i]
        return {nd["answer_start"] + j - 1: nd["needle_start"] + j for j in range(nd["k"])}

    def __len__(self) -> int:
        return len(self.sequences)


@dataclass
class ScanResult:
    """A scan's tidy table plus everything needed to reproduce it."""

    model_name: str
    scores: pd.DataFrame  # long format: one row per (metric, layer, head), columns COLUMNS
    probes: list[Probe]
    metadata: dict = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    #: Per-sequence sums and counts of each score (what its bootstrap resampled): name ->
    #: ``{"probe": str, "total": array [sequence, layer, head], "count": array [sequence]}``.
    per_sequence: dict = field(default_factory=dict)
    #: The strongest heads' patterns on one example of each probe, for the report
    #: (:mod:`headscope.scanner.examples`): ``{"heads": [(layer, head)], "examples": [{"probe",
    # "token_ids", : "n_full", "pattern" [head, query, key]}]}``; empty when not kept.
    views: dict = field(default_factory=dict)


@dataclass(frozen=True)
class HeadPattern:
    """One head's pattern on one sequence, with what is needed to label it."""

    model: str  # the model name as typed
    layer: int
    head: int
    text: str
    token_ids: list[int]
    tokens: list[str]  # display strings (see :func:`display_token`)
    pattern: object  # numpy [query, key], float32, post-softmax
    causal: bool

    @property
    def head_name(self) -> str:
        return head_name(self.layer, self.head)


def head_name(layer: int, head: int) -> str:
    """The ecosystem's name of a head: ``L{layer}H{head}``, both 0-based."""
    return f"L{int(layer)}H{int(head)}"


def model_slug(name: str) -> str:
    """A file-name-safe short name of a model (a local folder's name, an ``org/name`` repo's name).

    ``.`` and ``..`` name the folder they point to (never a hidden or parent path); a hub
    revision stays in the name (``gpt2@refs/pr/3`` -> ``gpt2-refs-pr-3``)."""
    model, at, revision = name.rpartition("@")
    if at and model and not Path(name).exists():
        return (
            f"{model_slug(model)}-{re.sub(r'[^A-Za-z0-9._-]+', '-', revision).strip('-.')}".rstrip(
                "-"
            )
        )
    base = Path(name).name
    if base in ("", ".", "..") and Path(name).exists():
        base = Path(name).resolve().name
    # never a hidden name
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", base or name).strip("-").lstrip(".")
    return slug if slug.strip(".-") else "model"


def display_token(s: str) -> str:
    """A token as a label: spaces shown as ``␣``, newlines as ``↵``, other control characters
    escaped.

    >>> display_token(" bank"), display_token("\\n"), display_token("")
    ('␣bank', '↵', '∅')
    """
    if s == "":
        return "∅"
    s = s.replace(" ", "␣").replace("\n", "↵").replace("\r", "\\r").replace("\t", "\\t")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in s)


def fmt(x: float | None, digits: int = 3) -> str:
    """A score for text: ``digits`` decimals, ``NaN`` for a missing value."""
    return "NaN" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def matrix(scores: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The ``layer x head`` matrix of one metric (rows = layers, columns = heads).

    >>> import pandas as pd
    >>> t = pd.DataFrame(
    ...     {"metric": ["sink"] * 2, "layer": [0, 0], "head": [0, 1], "score": [0.5, 1.0]}
    ... )
    >>> matrix(t, "sink").to_numpy().tolist()
    [[0.5, 1.0]]
    """
    sub = scores[scores["metric"] == metric]
    if sub.empty:
        raise HeadscopeError(
            f"No rows for metric '{metric}'; this table has: "
            f"{', '.join(scores['metric'].unique())}."
        )
    return sub.pivot(index="layer", columns="head", values="score")


@contextmanager
def timed(timings: dict[str, float], key: str):
    """Record the seconds the ``with`` block took as ``timings[key]`` (to the millisecond)."""
    t0 = time.perf_counter()
    yield
    timings[key] = round(time.perf_counter() - t0, 3)


@contextmanager
def progress(total: int, label: str, say, steps: int = 10):
    """A progress meter for one long step: yields ``tick(n)`` (n more of ``total`` done), which
    tells ``say`` ``"label: done/total"`` about every ``1/steps`` of the way, and at the end.

    >>> lines = []
    >>> with progress(4, "eap", lines.append, steps=2) as tick:
    ...     for _ in range(4):
    ...         tick(1)
    >>> lines
    ['eap: 0/4', 'eap: 2/4', 'eap: 4/4']
    """
    state = {"done": 0, "told": 0}
    every = max(1, total // max(1, steps))
    say(f"{label}: 0/{total}")

    def tick(n: int = 1) -> None:
        state["done"] += n
        if state["done"] - state["told"] >= every and state["done"] < total:
            state["told"] = state["done"]
            say(f"{label}: {state['done']}/{total}")

    yield tick
    say(f"{label}: {total}/{total}")
