"""The settings of the commands beyond ``scan``, each a :class:`~headscope.settings.Settings` (one
frozen object, checked when made; its fields are the command's options). Light: no torch, so
``--help`` and a refused setting are instant.

=================  ================================================================================
TaskSettings       what patch and circuit share: the task's pairs, the metric, intervals, placement
PatchSettings      ``headscope patch``: what is patched, where, which way, how estimated
CircuitSettings    ``headscope circuit``: receivers, senders, direction, composition, class rules
DiscoverSettings   ``headscope discover``: edge scores, exact edges, the faithfulness curve
CensusSettings     ``headscope census``: which parts, the syntax part's sentences, the nulls
PlanSettings       ``headscope kvplan``: budgets, the sink + window band, how a plan is verified
QKSettings         ``headscope qk``: which heads, which prompts, which query and key
IclSettings        ``headscope icl``: which in-context tasks, how many prompts, the ablations
=================  ================================================================================

>>> CensusSettings().parts[0], CensusSettings(parts="noop,rare_word").parts
('syntax', ('noop', 'rare_word'))
>>> CensusSettings(parts=("nope",))  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
headscope.errors.HeadscopeError: Unknown census part 'nope'. Did you mean: noop? Use any of syntax,
noop, successor, copy_suppression, rare_word.
"""

from __future__ import annotations

from dataclasses import dataclass

from headscope.catalog import CENSUS_PARTS
from headscope.effects.settings import (
    PATCH_ACTIVATIONS,
    PATCH_DIRECTIONS,
    PATCH_ESTIMATORS,
    PATCH_KV_MODES,
)
from headscope.errors import HeadscopeError, at_least, did_you_mean, setting
from headscope.probes.kits import N_PAIRS
from headscope.probes.tasks import METRICS
from headscope.scanner.config import ScanSettings, check_long
from headscope.settings import Placement, Resampling, as_tuple, check_choice, opt

# ------------------------------------------------------------------------------ patch and circuit


def template_indices(value) -> tuple[int, ...] | None:
    """A kit's ``templates`` setting (``"0,3"`` or a sequence) as indices, or one line."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(int(t) for t in items if str(t).strip())
    except (TypeError, ValueError):
        raise HeadscopeError(
            f"{setting('templates')} are template indices such as 0,3; got {value!r}."
        ) from None


@dataclass(frozen=True)
class TaskSettings(Resampling, Placement):
    """What a run on a task's prompt pairs is made with besides its own settings."""

    metric: str | None = opt(
        None,
        "Read at the last position: logit_diff (logit[answer] - logit[wrong]), prob (of the "
        "answer) or loss (of the answer). [default: the task's, logit_diff for kits and files]",
        choices=METRICS,
    )
    n_pairs: int | None = opt(
        None,
        f"Pairs: drawn from a kit, or the first N of a file. [default: {N_PAIRS} from a kit "
        "(circuit: 32), every pair of a file]",
    )
    templates: tuple | None = opt(
        None,
        "A kit's templates to draw from, comma-separated indices (one template: every pair has "
        "one length, as positions=each needs). [default: all]",
        kind="csv",
    )
    seed: int = opt(0, "Seed of a kit's pairs, the bootstrap and any random null.")
    bootstrap: int = opt(1000, "Resamples of the pairs for every interval (0: none).")
    batch_size: int = opt(32, "Pairs per forward pass.")

    def normalise(self) -> None:
        super().normalise()
        self.put("templates", template_indices(self.templates))

    def check(self) -> None:
        super().check()
        if self.metric is not None:
            check_choice("metric", self.metric, METRICS)
        for name in ("n_pairs", "batch_size"):
            at_least(name, getattr(self, name))


KV_MODE_CHOICES = ("both", *PATCH_KV_MODES)


@dataclass(frozen=True)
class PatchSettings(TaskSettings):
    """Everything a patching run is made with but the model and the task (and, for the run
    directory, where it goes and which scan it is read beside)."""

    activations: tuple = opt(
        ("z",),
        "What to patch, comma-separated: z (each head's output, the input of the output "
        "projection), q, k, v, pattern.",
        kind="csv",
        choices=PATCH_ACTIVATIONS,
    )
    positions: tuple = opt(
        ("all",),
        "Where, comma-separated: all (every position at once), each (one position at a time: "
        "the layer x head x position grid), named (the task's named positions and END), or "
        "names such as END,S2.",
        kind="csv",
    )
    directions: tuple = opt(
        PATCH_DIRECTIONS,
        "denoising (clean into corrupt: share of the gap restored) and/or noising (corrupt into "
        "clean: share destroyed).",
        kind="csv",
        choices=PATCH_DIRECTIONS,
    )
    estimator: str = opt(
        "auto",
        "auto (attribution for every head, exact patching for the top ones), exact, "
        "attribution (a first-order estimate, labelled so) or both.",
        choices=PATCH_ESTIMATORS,
    )
    kv_mode: str = opt(
        "both",
        "k/v of grouped-query models: group (patch the KV head: every query head sharing it "
        "sees the change), head (only what one query head reads) or both.",
        choices=KV_MODE_CHOICES,
    )
    dla: bool = opt(True, "Also every head's direct logit attribution at the last position.")

    def normalise(self) -> None:
        super().normalise()
        for name in ("activations", "positions", "directions"):
            self.put(name, as_tuple(getattr(self, name)))
        for name in ("estimator", "kv_mode"):
            self.put(name, str(getattr(self, name)).strip().lower())

    def check(self) -> None:
        super().check()
        for name, allowed in (("activations", PATCH_ACTIVATIONS), ("directions", PATCH_DIRECTIONS)):
            values = getattr(self, name)
            if not values:
                raise HeadscopeError(
                    f"{setting(name)} is empty; give one or more of {', '.join(allowed)}."
                )
            for v in values:
                if v not in allowed:
                    raise HeadscopeError(
                        f"Unknown {name[:-1]} '{v}' ({setting(name)}).{did_you_mean(v, allowed)} "
                        f"Use {', '.join(allowed)}."
                    )
        if not self.positions:
            raise HeadscopeError(
                f"{setting('positions')} is empty; give all, each, named or position names."
            )
        check_choice("estimator", self.estimator, PATCH_ESTIMATORS)
        check_choice("kv_mode", self.kv_mode, KV_MODE_CHOICES)


#: chosen: an attribution estimate beside every exact path; all: also every head's q, k and v as a
#: receiver of every earlier head (first order only); none.
ATTRIBUTION = ("chosen", "all", "none")
CIRCUIT_PAIRS = 32  # pairs a circuit run draws from a kit


@dataclass(frozen=True)
class CircuitSettings(TaskSettings):
    """Everything a circuit run is made with but the model and the task."""

    receivers: tuple | None = opt(
        None,
        "Receivers, comma-separated: logits, or a head's input LAYERhHEAD.KIND[@POSITION] "
        "(KIND q, k or v; POSITION a named position of the task, shifted like S1+1, or all), "
        "e.g. L9H1.q@END. [default: for IOI, the classes' receivers (logits, then the name "
        "movers' queries at END, the S-inhibition heads' values at S2, the induction heads' "
        "keys at S1+1); for other tasks, logits and the queries at END of the 5 heads with the "
        "largest direct effect]",
        kind="csv",
    )
    senders: tuple | None = opt(
        None,
        "Senders, comma-separated head names (L3H0). [default: every head below each receiver]",
        kind="csv",
    )
    direction: str = opt(
        "noising",
        "noising (the sender's output from the corrupt prompt into the clean run: share of the "
        "gap destroyed) or denoising (clean into corrupt: share restored).",
        choices=PATCH_DIRECTIONS,
    )
    freeze_mlps: bool = opt(
        False, "Freeze every MLP at its base output too (default: MLPs recompute)."
    )
    attribution: str = opt(
        "chosen",
        "First-order estimates: chosen (beside every exact path), all (also every head's q, k "
        "and v from every earlier head) or none.",
        choices=ATTRIBUTION,
    )
    composition: bool = opt(
        True, "Q-, K- and V-composition of every head pair from the weights, with their null."
    )
    n_null: int = opt(32, "Random sender matrices per receiver for the composition null.")
    top_k: int = opt(5, "Senders compared between composition and path patching (top-k overlap).")
    edge_threshold: float = opt(0.05, "|Path effect| drawn as an edge of the circuit diagram.")
    direct: float = opt(0.05, "Class rule: |direct effect| of a (negative) name mover.")
    attention: float = opt(0.1, "Class rule: END -> IO attention of a name mover.")
    copying: float = opt(0.5, "Class rule: copying score of a name mover.")
    path: float = opt(0.05, "Class rule: path effect into a class's receivers.")
    pattern: float = opt(0.4, "Class rule: induction / duplicate-token / previous-token score.")

    def normalise(self) -> None:
        super().normalise()
        for name in ("receivers", "senders"):
            self.put(name, as_tuple(getattr(self, name)) or ())
        self.put("direction", str(self.direction).strip().lower())
        self.put("attribution", str(self.attribution).strip().lower())

    def check(self) -> None:
        from headscope.circuits.receivers import Receiver, parse_head

        super().check()
        check_choice("direction", self.direction, PATCH_DIRECTIONS)
        check_choice("attribution", self.attribution, ATTRIBUTION)
        for r in self.receivers:
            Receiver.parse(r)
        for s in self.senders:
            parse_head(s)
        for name in ("n_null", "top_k"):
            at_least(name, getattr(self, name))
        for name in ("edge_threshold", "direct", "attention", "copying", "path", "pattern"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v >= 0:
                raise HeadscopeError(f"{setting(name)} must be a number >= 0, got {v!r}.")


#: Edge scores (headscope.circuits.edge_scores.METHODS without exact) and circuit ablations.
EDGE_METHODS = ("eap", "eap-ig")
EDGE_ABLATIONS = ("corrupt", "mean", "zero")
EDGE_KV_MODES = ("group", "head")


@dataclass(frozen=True)
class DiscoverSettings(TaskSettings):
    """Everything a circuit discovery (every edge scored, the circuit pruned) is made with."""

    methods: tuple = opt(
        EDGE_METHODS,
        "Edge scores, comma-separated: eap (a forward and a backward) and/or eap-ig (integrated "
        "gradients over --steps interpolated inputs).",
        kind="csv",
        choices=EDGE_METHODS,
    )
    steps: int = opt(5, "EAP-IG's interpolation steps.")
    direction: str = opt(
        "noising",
        "noising (the corrupt prompt's writer into the clean run) or denoising (the reverse).",
        choices=PATCH_DIRECTIONS,
    )
    exact: int = opt(
        100, "Edges patched exactly: the top N by each score (0: none), plus any of --edges."
    )
    edges: tuple | None = opt(
        None,
        "Edges also patched exactly, comma-separated writer->reader (L0H1->L3H2.q).",
        kind="csv",
    )
    sizes: int = opt(20, "Circuit sizes on the faithfulness curve (log-spaced shares of edges).")
    smallest: float = opt(0.001, "The curve's smallest circuit, as a share of the edges.")
    n_random: int = opt(10, "Random edge orders whose curves a ranking must beat.")
    ablation: str = opt(
        "corrupt",
        "What an edge outside a circuit carries: corrupt (the corrupt prompt's writer), mean "
        "(its mean over the corrupt prompts at that position) or zero.",
        choices=EDGE_ABLATIONS,
    )
    circuit_share: float = opt(
        0.01, "The circuit saved (circuit.json, the diagram): this share of the top edges."
    )
    kv_mode: str = opt(
        "group",
        "Keys and values read per KV head, as the model computes them (group), or per query head "
        "(head: an edge into L3H4.k is the key head 4 alone reads).",
        choices=EDGE_KV_MODES,
    )
    positions: tuple | None = opt(
        None,
        "Also score every edge at these named positions of the task, comma-separated (IO,S2,END; "
        "S1+1: the token after S1): a reader there reading the writer's output there "
        "(edges_at.csv; the top 10 per position by the ranking score patched exactly).",
        kind="csv",
    )
    exact_readers: int = opt(
        10,
        "Query and key readers patched exactly (a head's whole query, a KV head's whole key, from "
        "the other prompt): the top N by AtP*'s estimate (0: none).",
    )
    held_out: int = opt(
        0,
        "Measure the curve and the saved circuit on N other pairs, none of the ranking's: a "
        "kit's drawn with seed + 1, a file's next N. [0: on the ranking's own pairs]",
    )

    def normalise(self) -> None:
        super().normalise()
        self.put("methods", as_tuple(self.methods) or ())
        self.put("edges", as_tuple(self.edges) or ())
        self.put("positions", as_tuple(self.positions) or ())
        for name in ("direction", "ablation", "kv_mode"):
            self.put(name, str(getattr(self, name)).strip().lower())

    def check(self) -> None:
        super().check()
        if not self.methods:
            raise HeadscopeError(f"{setting('methods')} is empty; give eap and/or eap-ig.")
        for m in self.methods:
            check_choice("methods", m, EDGE_METHODS)
        check_choice("direction", self.direction, PATCH_DIRECTIONS)
        check_choice("ablation", self.ablation, EDGE_ABLATIONS)
        check_choice("kv_mode", self.kv_mode, EDGE_KV_MODES)
        at_least("steps", self.steps)
        at_least("sizes", self.sizes, 2)
        at_least("exact", self.exact, 0)
        at_least("n_random", self.n_random, 0)
        at_least("held_out", self.held_out, 0)
        at_least("exact_readers", self.exact_readers, 0)
        for name in ("smallest", "circuit_share"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise HeadscopeError(
                    f"{setting(name)} is a share of the edges in (0, 1] (0.01 = 1%), got {v!r}."
                )


# ------------------------------------------------------------------------------ census

PARTS = CENSUS_PARTS  # the census's parts, in the order they run (docs/census.md)
TOKENIZE = ("natural", "words")
#: How successor and copy suppression read a head's output: ``auto`` = the unembedding where the
#: model has a trained one (decoders; encoders: not measured, NaN rows saying why), ``unembedding``
#: (refused for encoders), ``embeddings`` = through the input embeddings, rows named
#: ``*_embeddings``.
READOUTS = ("auto", "unembedding", "embeddings")
ENGINES = ("blocked", "hooks")  # word maps need each head's full pattern


@dataclass(frozen=True)
class CensusSettings(Placement):
    """Everything a census is run with; the model and the output folder are given beside it."""

    parts: tuple = opt(",".join(PARTS), "Comma-separated parts to run.", kind="csv", choices=PARTS)
    tokenize: str = opt(
        "natural",
        "How a parsed sentence becomes tokens: natural (tokenized whole; sentences whose tokens "
        "straddle two words are left out) or words (each word on its own, as Clark et al.; "
        "every sentence kept).",
        choices=TOKENIZE,
    )
    n_sentences: int = opt(1000, "Held-out sentences for the syntax part (the first that align).")
    min_count: int = opt(
        100, "A relation is a row of the syntax table with at least this many pairs."
    )
    n_prompts: int | None = opt(
        None, "Text-probe pairs for rare_word (every pair of the built-in corpus when not given)."
    )
    noop_sequences: int = opt(
        16, "Text sequences the no-op test and the mean ablation beside it use."
    )
    repeat_len: int = opt(50, "L of the repeat probe BOS+R+R (copy suppression).")
    repeat_sequences: int = opt(8, "Repeat sequences for copy suppression.")
    ablation: bool = opt(
        True,
        "Each head's whole-head mean-ablation effect beside the no-op test and copy suppression.",
    )
    readout: str = opt(
        "auto",
        "What successor and copy suppression read a head's output through: auto (the "
        "unembedding; encoders have none and get NaN rows), unembedding, or embeddings (the "
        "input embeddings; rows named *_embeddings).",
        choices=READOUTS,
    )
    n_null: int = opt(200, "Shuffled successor maps (the successor null).")
    bootstrap: int = opt(
        1000, "Resamples for every interval (sentences, sequences or pairs; at least 1)."
    )
    seed: int = opt(0, "Seed of the repeat probe, the shuffled maps and the bootstrap.")
    engine: str = opt(
        "blocked", "How the syntax part reads each head's full pattern.", choices=ENGINES
    )
    batch_size: int = opt(16, "Sentences per forward (syntax).")

    def normalise(self) -> None:
        super().normalise()
        parts = self.parts.split(",") if isinstance(self.parts, str) else list(self.parts)
        self.put("parts", tuple(p.strip().lower() for p in parts if p.strip()))

    def check(self) -> None:
        super().check()
        bad = [p for p in self.parts if p not in PARTS]
        if bad:
            raise HeadscopeError(
                f"Unknown census part '{bad[0]}'.{did_you_mean(bad[0], PARTS)} "
                f"Use any of {', '.join(PARTS)}."
            )
        if not self.parts:
            raise HeadscopeError(f"No census part given; use any of {', '.join(PARTS)}.")
        for name, allowed in (("tokenize", TOKENIZE), ("readout", READOUTS), ("engine", ENGINES)):
            check_choice(name, getattr(self, name), allowed)
        for name in (
            "n_sentences",
            "min_count",
            "n_prompts",
            "noop_sequences",
            "repeat_sequences",
            "batch_size",
        ):
            at_least(name, getattr(self, name))
        at_least("repeat_len", self.repeat_len, 2)
        at_least("n_null", self.n_null, 0)
        at_least("bootstrap", self.bootstrap)  # every census score comes with its interval


# ------------------------------------------------------------------------------ kvplan


def _floats(value) -> tuple:
    if isinstance(value, (list, str)):
        return tuple(float(x) for x in (value.split(",") if isinstance(value, str) else value))
    return value


@dataclass(frozen=True)
class PlanSettings(Placement):
    """What a KV plan restricts and how it is verified."""

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

    def normalise(self) -> None:
        super().normalise()
        for name in ("budgets", "depths"):
            self.put(name, _floats(getattr(self, name)))

    def check(self) -> None:
        super().check()
        bad = [b for b in self.budgets if not (isinstance(b, (int, float)) and 0.0 <= b <= 1.0)]
        if bad or not self.budgets:
            raise HeadscopeError(
                f"Budgets are fractions of the heads, in 0..1; got {list(self.budgets)}. "
                "Use e.g. --budgets 0.25,0.5,0.75."
            )
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise HeadscopeError(
                f"Depths are fractions of the haystack, in 0..1; got {list(self.depths)}. "
                "Use e.g. --depths 0.1,0.5,0.9."
            )
        at_least("seeds", self.seeds, 0)
        at_least("texts", self.n_texts)
        at_least("needles_per_depth", self.needles_per_depth)
        at_least("scan_sequences", self.scan_sequences)
        at_least("scan_bootstrap", self.scan_bootstrap, 0)
        check_long(self.seq_len, self.sinks, self.window, self.needle_tokens)

    def scan_config(self) -> ScanSettings:
        """The long-context scan that chooses the heads, when the plan starts from a model."""
        return ScanSettings(
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
                f"--seq-len {self.seq_len} is longer than the model's context ({n_ctx}); use "
                f"at most {n_ctx}."
            )
        return self


# ------------------------------------------------------------------------------ qk

QK_PROBES = ("repeat", "text")


@dataclass(frozen=True)
class QKSettings(Resampling, Placement):
    """Which heads' query-key matches are decomposed, on which prompts, at which positions."""

    heads: tuple = opt(
        ("all",),
        "Heads to decompose, comma-separated (L18H6,L3H1), or all: every head.",
        kind="csv",
    )
    probe: str = opt(
        "repeat",
        "Prompts when neither --task nor --text is given: repeat (BOS + R + R, random tokens) or "
        "text (the scan's English sentences).",
        choices=QK_PROBES,
    )
    task: str | None = opt(
        None, "A task (a kit such as ioi, or a pairs file): its clean prompts and named positions."
    )
    text: str | None = opt(None, "One prompt of your own.")
    query: str = opt(
        "last",
        "The query positions: last, all (every position from 1), a number (negative: from the "
        "end) or a task's named position (END).",
    )
    key: str = opt(
        "argmax",
        "Each query's key: argmax (the key the head attends to most), sink (position 0), "
        "induction (the token after the query token's previous occurrence), a number or a "
        "task's named position (IO).",
    )
    n_prompts: int = opt(16, "Prompts (repeat or text probe, or a task's pairs).")
    seq_len: int = opt(64, "Tokens per repeat or text prompt.")
    top: int = opt(20, "Pairs of components reported per head (by |contribution|).")
    knockouts: int = opt(5, "Of those, the top N knocked out exactly (0: none).")
    seed: int = opt(0, "Seed of the probe's tokens and of the null keys' ties.")

    def check(self) -> None:
        super().check()
        check_choice("probe", self.probe, QK_PROBES)
        at_least("n_prompts", self.n_prompts)
        at_least("seq_len", self.seq_len, 2)
        at_least("top", self.top)
        at_least("knockouts", self.knockouts, 0)
        if self.task is not None and self.text is not None:
            raise HeadscopeError("Give --task or --text, not both.")
        heads = tuple(self.heads)
        if heads != ("all",):
            from headscope.circuits.receivers import parse_head

            for h in heads:
                parse_head(h)


# ------------------------------------------------------------------------------ icl

#: which queries the indirect effects use: those the model answers right 10-shot (Todd et al.'s
#: filter), or all (Yin and Steinhardt's)
ICL_FILTERS = ("correct", "none")


@dataclass(frozen=True)
class IclSettings(Resampling, Placement):
    """Which in-context tasks, how many prompts of each, and the ablations."""

    tasks: tuple = opt(
        ("all",),
        "ICL tasks, comma-separated: bundled kits (antonym, country-capital, ...) or JSON files "
        "of input/output pairs; all: every bundled kit.",
        kind="csv",
    )
    shots: int = opt(10, "Demonstrations per few-shot prompt.")
    queries: int = opt(
        100, "Valid-split queries per task for the accuracy baseline and the correct filter."
    )
    mean_prompts: int = opt(100, "Clean few-shot prompts per task for each head's mean output.")
    prompts: int = opt(25, "Shuffled-label prompts per task for the indirect effects.")
    filter: str = opt(
        "correct",
        "Queries for the mean outputs and the indirect effects: correct (those the model "
        "answers right few-shot, Todd et al.) or none (every valid query, Yin and Steinhardt).",
        choices=ICL_FILTERS,
    )
    test_prompts: int = opt(
        50, "Test-split few-shot prompts per task for the ablations (0: no ablations)."
    )
    fractions: tuple = opt(
        (0.01, 0.03, 0.05, 0.1, 0.2),
        "Ablations: shares of the heads mean-ablated (k = max(1, int(share x heads))).",
        kind="floats",
    )
    exclude: float = opt(
        0.02, "Ablations: the top share of the other ranking left out of each set (0.02: 2%)."
    )
    random_sets: int = opt(
        20, "Ablations and the function vector: random head sets of each size (the base rate)."
    )
    fv_heads: int = opt(
        10, "Heads whose mean outputs make the function vector (the top by FV score; 0: none)."
    )
    fv_layer: int | None = opt(
        None, "The block after which the function vector is added. [default: layers // 3]"
    )
    repeat_sequences: int = opt(16, "Repeat sequences for the induction-side scores.")
    seed: int = opt(0, "Seed of the prompts' draws, the shuffles and the random sets.")

    def normalise(self) -> None:
        super().normalise()
        self.put("tasks", as_tuple(self.tasks) or ("all",))
        fr = self.fractions
        self.put(
            "fractions", tuple(float(f) for f in (fr.split(",") if isinstance(fr, str) else fr))
        )
        self.put("filter", str(self.filter).strip().lower())

    def check(self) -> None:
        super().check()
        check_choice("filter", self.filter, ICL_FILTERS)
        for name in ("shots", "queries", "mean_prompts", "prompts", "repeat_sequences"):
            at_least(name, getattr(self, name))
        at_least("test_prompts", self.test_prompts, 0)
        at_least("random_sets", self.random_sets, 0)
        at_least("fv_heads", self.fv_heads, 0)
        at_least("fv_layer", self.fv_layer, 0)
        for f in self.fractions:
            if not 0 < float(f) <= 1:
                raise HeadscopeError(
                    f"{setting('fractions')} are shares of the heads in (0, 1]; got {f}."
                )
        if not 0 <= self.exclude < 1:
            raise HeadscopeError(f"{setting('exclude')} is a share in [0, 1); got {self.exclude}.")
        tasks = tuple(self.tasks)
        if tasks != ("all",):
            from headscope.probes.icl import icl_task

            for t in tasks:
                icl_task(t)  # one line for an unknown kit or a bad file
