"""Every named score a scores table may hold, and what it means: data, not code.

A run's ``scores.csv`` holds pattern metrics (:mod:`headscope.metrics`), and, when effects were
asked for, causal effects (``effect_*``, ``attribution_*``: :mod:`headscope.effects`) and circuit
scores (``copying``, ``value_sink``: :mod:`headscope.circuits`). The report, the figures, the page,
``compare`` and the CLI's checks ask :func:`describe` what a name means (its definition, label and
threshold, whether low scores are the notable ones, why it may be NaN) without importing the code
that computes it, so re-plotting an old run or refusing a misspelt name loads no torch.

This table is also where a built-in pattern metric is registered: its entry names the module that
implements it (``impl``), and :mod:`headscope.metrics` registers exactly these, in this order (a
metric a user registers at run time is described by its own
:class:`~headscope.metrics.base.Metric`).

>>> describe("induction").label, describe("effect_repeat_loss").label, describe("copying").label
('induction head', 'matters for copying', 'copying head')
>>> describe("Induction").name, describe("no_such_score") is None
('induction', True)
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace

from headscope.errors import HeadscopeError, did_you_mean
from headscope.result import ScoreInfo

_NEEDLE_NAN = "no needle probe (scan with --long-context)"

#: The built-in pattern metrics, in registry order (``impl``: the module and attribute that computes
# it).
PATTERN: dict[str, ScoreInfo] = {
    i.name: i
    for i in [
        ScoreInfo(
            "previous_token",
            "text",
            "mean of A[q, q-1] over queries 1 <= q <= n-1",
            "previous-token head",
            0.5,
            impl="headscope.metrics.previous_token:METRIC",
        ),
        ScoreInfo(
            "next_token",
            "text",
            "mean of A[q, q+1] over queries 0 <= q <= n-2 (NaN on causal models)",
            "next-token head",
            0.5,
            nan_reason="causal model: the mask hides every later token, so A[q, q+1] is 0 by "
            "construction",
            impl="headscope.metrics.next_token:METRIC",
        ),
        ScoreInfo(
            "sink",
            "text",
            "mean of A[q, 0] over queries 1 <= q <= n-1",
            "sink head",
            0.5,
            impl="headscope.metrics.sink:METRIC",
        ),
        ScoreInfo(
            "separator",
            "text",
            "mean attention mass on visible separator keys k >= 1, over queries that see one",
            "separator head",
            0.5,
            impl="headscope.metrics.separator:METRIC",
        ),
        ScoreInfo(
            "punctuation",
            "text",
            "mean attention mass on visible punctuation keys k >= 1, over queries that see one",
            "punctuation head",
            0.5,
            impl="headscope.metrics.punctuation:METRIC",
        ),
        ScoreInfo(
            "entropy",
            "text",
            "mean of -sum_k A[q,k] ln A[q,k] (nats) over queries 1 <= q <= n-1",
            "focused head",
            0.3,
            below=True,
            unit="nats",
            impl="headscope.metrics.entropy:METRIC",
        ),
        ScoreInfo(
            "induction",
            "repeat",
            "on BOS+R+R (|R|=L): mean of A[q, q-L+1] over queries L+1 <= q <= 2L",
            "induction head",
            0.4,
            impl="headscope.metrics.induction:METRIC",
        ),
        ScoreInfo(
            "duplicate_token",
            "repeat",
            "on BOS+R+R (|R|=L): mean of A[q, q-L] over queries L+1 <= q <= 2L",
            "duplicate-token head",
            0.4,
            impl="headscope.metrics.duplicate_token:METRIC",
        ),
        # long-context metrics: scanned when named (or with --long-context), never by default
        ScoreInfo(
            "streaming",
            "text",
            "mean over queries q >= s + w of the mass on keys k < s (sinks) and q - w < k <= q "
            "(window); s = 4, w = 64 unless set",
            "streaming head",
            0.9,
            nan_reason="encoder: no KV cache to keep, or no query lies past the sinks and the "
            "window (use longer text)",
            default=False,
            impl="headscope.metrics.streaming:METRIC",
        ),
        ScoreInfo(
            "retrieval",
            "needle",
            "share of needle answer queries whose arg-max key is the needle token being copied",
            "retrieval head",
            0.1,
            nan_reason=_NEEDLE_NAN,
            default=False,
            impl="headscope.metrics.retrieval:METRIC",
        ),
        ScoreInfo(
            "retrieval_soft",
            "needle",
            "mean A[q, k] over needle answer queries q, k = the needle token being copied",
            "",
            float("nan"),
            nan_reason=_NEEDLE_NAN,
            default=False,
            impl="headscope.metrics.retrieval:SOFT",
        ),
        # the head census (docs/census.md): scanned when named, never by default
        ScoreInfo(
            "rare_word",
            "text",
            "share of text queries whose arg-max key is the least frequent token it can see "
            "(unigram counts of the bundled prose; position 0, the query and special tokens not "
            "counted; ties: any of them)",
            "rare-word head",
            0.5,
            default=False,
            chance="1 / (keys counted), averaged over the queries",
            impl="headscope.metrics.rare_word:METRIC",
        ),
    ]
}

COPYING_K = 50  # copying@k: the own-token logit must be among the k highest (0.1% of a 49k vocab)

#: Scores read from a head's circuit (``--effects``): each ``impl`` names the function a scan runs,
#: ``scan_score(model, probes by name, batch_size, progress) -> scores or None`` (None: the score
#: does not apply to this model or these probes). A new one is one module and one entry here.
CIRCUIT: dict[str, ScoreInfo] = {
    i.name: i
    for i in [
        ScoreInfo(
            "copying",
            "repeat",
            f"copying@{COPYING_K}: share of first-copy positions of the repeat probe whose own "
            f"token's logit is among the {COPYING_K} highest through the head's OV circuit (W_V "
            "W_O, final norm, W_U)",
            "copying head",
            0.5,
            nan_reason="encoders have no unembedding to read the OV circuit through",
            impl="headscope.circuits.copying:scan_score",
        ),
        ScoreInfo(
            "value_sink",
            "text",
            "mean over queries 1 <= q <= n-1 of A[q,0]||f(x_0)|| / sum_k A[q,k]||f(x_k)||, "
            "f(x_k) = v_k W_O^h "
            "(Kobayashi et al. 2020): position 0's share of the head's output, not of its weight",
            "sink head (by norm)",
            0.5,
            nan_reason="no single chance: a uniform head's value-weighted share depends on its "
            "value norms",
            impl="headscope.circuits.value_weighted:scan_score",
        ),
    ]
}


def _effect(
    name: str, probe: str, definition: str, label: str, threshold: float, unit: str
) -> list[ScoreInfo]:
    out = [ScoreInfo(f"effect_{name}", probe, definition, label, threshold, unit=unit)]
    # a first-order estimate exists for losses only (an embedding has no gradient signal)
    if unit == "nats":
        out.append(
            ScoreInfo(
                f"attribution_{name}",
                probe,
                "attribution-patching estimate (first order) of " + definition,
                "",
                float("inf"),
                unit=unit,
            )
        )
    return out


#: Causal effects (``--effects``): ``effect_<target>`` (exact where the run says so) and, for
# losses, : ``attribution_<target>`` (first-order estimates, never labelled).
EFFECTS: dict[str, ScoreInfo] = {
    i.name: i
    for i in [
        *_effect(
            "repeat_loss",
            "repeat",
            "change in mean next-token loss (nats) of the second copy of R (targets "
            "L+2..2L) when the head is ablated",
            "matters for copying",
            0.25,
            "nats",
        ),
        *_effect(
            "text_loss",
            "text",
            "change in mean next-token loss (nats) over positions 1..n-1 of the text probe "
            "when the head is ablated",
            "matters for next-token prediction",
            0.05,
            "nats",
        ),
        *_effect(
            "embedding",
            "text",
            "mean over text sequences of 1 - cos(e, e_ablated), e = mean-pooled last hidden state",
            "moves the embedding",
            0.01,
            "1 - cos",
        ),
    ]
}

SYNTAX_MARGIN = 0.15  # a syntax head beats the best fixed offset by this much (accuracy, 0..1)
#: Where the census's syntax rows are told apart: ``syntax_<relation>.d2h`` / ``.h2d``.
SYNTAX_NAME = re.compile(r"^syntax_(?P<relation>[A-Za-z_:]+)\.(?P<direction>d2h|h2d)$")
_ENCODER_NAN = (
    "encoders have no trained unembedding (the *_embeddings rows read the input embeddings instead)"
)

#: The census's parts, in the order they run (``--parts``; each one module of
#: :mod:`headscope.census`, registered there in this order).
CENSUS_PARTS = ("syntax", "noop", "successor", "copy_suppression", "rare_word")

#: The head census (``headscope census``; docs/census.md): every score its ``scores.csv``
#: holds. Syntax rows are named per relation (:func:`census_info`); ``rare_word`` is a pattern
#: metric (:data:`PATTERN`). Chance is said in words here; each row holds its value.
CENSUS: dict[str, ScoreInfo] = {
    i.name: i
    for i in [
        ScoreInfo(
            "syntax.d2h",
            "syntax",
            "share of the words with relation r whose most-attended other word is their syntactic "
            "head (Clark et al. 2019; word maps: to a word = sum over its tokens, from = mean; "
            "decoders: only pairs whose head word is earlier; SILVER parses); null = the best "
            "fixed offset's accuracy",
            "syntax head",
            SYNTAX_MARGIN,
            chance="1 / candidate words per pair (a head picking one uniformly), averaged over "
            "the pairs",
        ),
        ScoreInfo(
            "syntax.h2d",
            "syntax",
            "share of the words with relation r that their syntactic head attends to most among "
            "the other words (Clark's head -> dependent direction; decoders: only pairs whose "
            "head word is later); null = the best fixed offset's accuracy",
            "syntax head",
            SYNTAX_MARGIN,
            chance="1 / candidate words per pair, averaged over the pairs",
        ),
        ScoreInfo(
            "noop_weight",
            "text",
            "the head's attention on the keys the no-op test removes: position 0 (decoders, as "
            "sink) or [SEP] at k >= 1 (encoders, as separator), over the queries that see them",
            "",
            float("nan"),
            chance="a uniform head's mass on those keys",
        ),
        ScoreInfo(
            "effect_noop_text_loss",
            "text",
            "change in mean next-token loss (nats, positions 1..n-1 of the text probe) when the "
            "head's attention to position 0 is removed and its row renormalised (a row that sees "
            "only position 0 is left as it was)",
            "position 0 is no no-op",
            0.05,
            unit="nats",
            chance="0 (no effect)",
        ),
        ScoreInfo(
            "effect_noop_embedding",
            "text",
            "mean over text sequences of 1 - cos(e, e'), e the mean-pooled last hidden state, "
            "when the head's attention to [SEP] (k >= 1) is removed and its row renormalised",
            "[SEP] is no no-op",
            0.01,
            unit="1 - cos",
            chance="0 (no effect)",
        ),
        ScoreInfo(
            "successor",
            "ordinal",
            "share of (t, succ t) pairs of the ordinal sets (digits, number words, ordinals, "
            "days, months, letters; single tokens only) whose top logit within the set, through "
            "the head's OV circuit on t's effective embedding (residual after block 0) and the "
            "unembedding, is succ t (Gould et al. 2023); null = the same against shuffled "
            "successor maps",
            "successor head",
            0.4,
            nan_reason=_ENCODER_NAN,
            chance="1 / |set|, averaged over the pairs",
        ),
        ScoreInfo(
            "successor_embeddings",
            "ordinal",
            "successor, read through the input embeddings (W_E^T) instead of an unembedding: an "
            "encoder's only readout (not an unembedding)",
            "",
            float("nan"),
            chance="1 / |set|, averaged over the pairs",
        ),
        ScoreInfo(
            "copy_suppression",
            "repeat",
            "share of first-copy positions of the repeat probe whose own token's logit is among "
            f"the {COPYING_K} lowest of the vocabulary through the head's OV circuit (McDougall et "
            "al. 2023; the "
            "mirror of copying); null = the same for another token of R (copying's control)",
            "copy-suppression head",
            0.5,
            nan_reason=_ENCODER_NAN,
            chance=f"{COPYING_K} / vocabulary",
        ),
        ScoreInfo(
            "copy_suppression_embeddings",
            "repeat",
            "copy_suppression, read through the input embeddings (W_E^T) instead of an "
            "unembedding: an encoder's only readout (not an unembedding)",
            "",
            float("nan"),
            chance=f"{COPYING_K} / vocabulary",
        ),
    ]
}


def census_info(name: str) -> ScoreInfo | None:
    """The census's description of ``name``; a syntax row (``syntax_nsubj.d2h``) gets its
    direction's entry, named after the row and with the relation in its definition."""
    m = SYNTAX_NAME.match(str(name))
    if m is None:
        return CENSUS.get(str(name))
    info = CENSUS[f"syntax.{m['direction']}"]
    return replace(
        info,
        name=str(name),
        definition=info.definition.replace("relation r", f"relation {m['relation']}"),
    )


#: ``headscope icl`` (docs/icl.md): the function-vector score; ``fv.<task>`` rows are each task's
#: part (:func:`describe` names them from this entry).
ICL: dict[str, ScoreInfo] = {
    "fv": ScoreInfo(
        "fv",
        "icl",
        "function-vector score (Todd et al. 2024): the rise in the probability of the answer's "
        "first token when the head's output at the last position of a prompt whose "
        "demonstrations' labels are shuffled is set to its mean over clean few-shot prompts of "
        "the task; averaged over prompts (AIE), then over tasks",
        "",
        float("nan"),
        unit="probability",
        chance="0: a head that carries nothing of the task",
    ),
}

BUILT_IN: dict[str, ScoreInfo] = {**PATTERN, **CIRCUIT, **EFFECTS, **CENSUS, **ICL}


def _registered() -> dict:
    """Metrics registered at run time (only when :mod:`headscope.metrics` is already loaded: this
    module never imports the code that computes a score)."""
    metrics = sys.modules.get("headscope.metrics.base")
    return getattr(metrics, "REGISTRY", {}) if metrics is not None else {}


def describe(name: str):
    """What the score called ``name`` means (a :class:`~headscope.result.ScoreInfo`, or the
    registered :class:`~headscope.metrics.base.Metric`), or None. Names match without case."""
    key = str(name).lower()
    if key.startswith("fv."):
        return replace(ICL["fv"], name=str(name), definition=ICL["fv"].definition.replace(
            "; averaged over prompts (AIE), then over tasks", f" {key[3:]}; averaged over prompts"
        ))  # fmt: skip
    return (
        BUILT_IN.get(key) or _registered().get(name) or _registered().get(key) or census_info(name)
    )


def is_below(name: str) -> bool:
    """Whether a score's notable heads are its lowest (entropy), not its highest."""
    info = describe(name)
    return bool(info is not None and info.below)


def names() -> list[str]:
    """Every score name, pattern metrics first (then any registered at run time)."""
    return (
        list(PATTERN)
        + [n for n in _registered() if n not in BUILT_IN]
        + list(CIRCUIT)
        + list(EFFECTS)
    )


def pattern_names() -> list[str]:
    """Every pattern metric a scan can compute: the built-in ones and any registered at run time."""
    return list(PATTERN) + [n for n in _registered() if n not in BUILT_IN]


def check_score_name(name: str):
    """The description of ``name``, or one line with a did-you-mean."""
    info = describe(name)
    if info is None:
        raise HeadscopeError(
            f"Unknown metric '{name}'.{did_you_mean(name, names())} Known: {', '.join(names())}."
        )
    return info


# ------------------------------------------------------------------------------ IOI head classes

#: The IOI head classes (``headscope circuit``, :mod:`headscope.circuits.classes`), in the order of
#: the diagram's rows, top to bottom.
CIRCUIT_CLASSES = (
    "name_mover",
    "negative_name_mover",
    "s_inhibition",
    "induction",
    "duplicate_token",
    "previous_token",
)
#: The evidence columns of ``classes.csv``, in the order a reader meets them (each ``path_*`` and
#: ``direct``/``end_to_io`` with its interval, :func:`interval_columns`).
CLASS_EVIDENCE = (
    "direct_effect",
    "direct_ci_low",
    "direct_ci_high",
    "end_to_io",
    "end_to_io_ci_low",
    "end_to_io_ci_high",
    "copying",
    "copy_suppression",
    "path_to_name_movers_q",
    "path_to_name_movers_q_ci_low",
    "path_to_name_movers_q_ci_high",
    "induction",
    "duplicate_token",
    "path_to_s_inhibition_v",
    "path_to_s_inhibition_v_ci_low",
    "path_to_s_inhibition_v_ci_high",
    "previous_token",
    "path_to_induction_k",
    "path_to_induction_k_ci_low",
    "path_to_induction_k_ci_high",
)


def interval_columns(column: str) -> tuple[str, str]:
    """The names of the interval beside an evidence column of ``classes.csv`` (``direct_effect``
    keeps its shorter ``direct_ci_low`` / ``direct_ci_high``).

    >>> interval_columns("end_to_io")
    ('end_to_io_ci_low', 'end_to_io_ci_high')
    """
    stem = "direct" if column == "direct_effect" else column
    return f"{stem}_ci_low", f"{stem}_ci_high"
