"""A head census's settings: one frozen object checked when it is made (no torch here, so
``headscope census --help`` and its refusals are instant); the command's options are its fields.

>>> CensusSettings().parts[0], CensusSettings(parts="noop,rare_word").parts
('syntax', ('noop', 'rare_word'))
>>> CensusSettings(parts=("nope",))  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
headscope.errors.HeadscopeError: Unknown census part 'nope'. Did you mean: noop? Use any of syntax,
noop, successor, copy_suppression, rare_word.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from headscope.errors import HeadscopeError, at_least, did_you_mean
from headscope.scanner.config import opt
from headscope.uncertainty import check as check_bootstrap

#: The census's parts, in the order they run (design.md section 12).
PARTS = ("syntax", "noop", "successor", "copy_suppression", "rare_word")
TOKENIZE = ("natural", "words")
#: How successor and copy suppression read a head's output: ``auto`` = the unembedding where the
#: model has a trained one (decoders; encoders: not measured, NaN rows saying why), ``unembedding``
#: (refused for encoders), ``embeddings`` = through the input embeddings, rows named
# ``*_embeddings``.
READOUTS = ("auto", "unembedding", "embeddings")
ENGINES = ("blocked", "hooks")  # word maps need each head's full pattern


@dataclass(frozen=True)
class CensusSettings:
    """Everything a census is run with; the model and the output folder are given beside it."""

    parts: tuple = opt(
        ",".join(PARTS),
        f"Comma-separated parts to run. [default: all: {','.join(PARTS)}]",
        kind="csv",
        choices=PARTS,
    )
    tokenize: str = opt(
        "natural",
        "How a parsed sentence becomes tokens: natural (tokenized whole; "
        "sentences whose tokens straddle two words are left out) or words (each "
        "word on its own, as Clark et al.; every sentence kept).",
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
        "unembedding; encoders have none and get NaN rows), unembedding, or "
        "embeddings (the input embeddings; rows named *_embeddings).",
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

    def __post_init__(self) -> None:
        parts = self.parts.split(",") if isinstance(self.parts, str) else list(self.parts)
        parts = tuple(p.strip().lower() for p in parts if p.strip())
        object.__setattr__(self, "parts", parts)
        bad = [p for p in parts if p not in PARTS]
        if bad:
            raise HeadscopeError(
                f"Unknown census part '{bad[0]}'.{did_you_mean(bad[0], PARTS)} "
                f"Use any of {', '.join(PARTS)}."
            )
        if not parts:
            raise HeadscopeError(f"No census part given; use any of {', '.join(PARTS)}.")
        for name, allowed in (("tokenize", TOKENIZE), ("readout", READOUTS), ("engine", ENGINES)):
            value = getattr(self, name)
            if value not in allowed:
                raise HeadscopeError(
                    f"Unknown {name} '{value}'.{did_you_mean(str(value), allowed)} "
                    f"Use one of {', '.join(allowed)}."
                )
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
        check_bootstrap(self.bootstrap, 0.95)

    def record(self) -> dict:
        """The settings as ``metadata.json`` records them."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
