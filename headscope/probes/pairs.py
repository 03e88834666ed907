"""The inputs a scan runs on, always as token ids (never re-tokenised text).

* ``text``: natural-language segment pairs joined the way the model's tokenizer joins a pair
  (encoders ``[CLS] a [SEP] b [SEP]``, decoders ``BOS a SEP b``). The default corpus lives in
  ``headscope/data/pairs.tsv``: one pair a line, the two segments separated by a TAB.
* ``repeat``: ``BOS + R + R`` (encoders ``[CLS] + R + R + [SEP]``), ``R`` = L distinct ordinary
  token ids drawn without replacement by a seeded ``torch.Generator`` (no global RNG).

Every sequence is saved with the run, so any score can be recomputed from the ids alone. Encoders
get no token-type ids (all zero), exactly what a recomputation from the ids alone would feed them.
"""

from __future__ import annotations

import codecs
import unicodedata
from importlib.resources import files
from pathlib import Path

from headscope.errors import HeadscopeError, at_least, did_you_mean, setting
from headscope.result import NULL_PROBE, Probe

DEFAULT_PAIRS = "pairs.tsv"
__all__ = [
    "Probe",
    "load_pairs",
    "text_probe",
    "repeat_probe",
    "null_probe",
    "packed_text_probe",
    "repeat_len_for",
    "is_punctuation",
    "PunctuationTable",
]


# ------------------------------------------------------------------------------ corpus


def default_pairs_path() -> Path:
    return Path(str(files("headscope") / "data" / DEFAULT_PAIRS))


def load_pairs(path: str | Path | None = None) -> list[tuple[str, str]]:
    """Read segment pairs: one a line, ``segment A<TAB>segment B``. Blank lines, and lines whose
    first non-blank character is ``#``, are skipped (comments); a line whose segments are separated
    by spaces instead of a TAB is refused with a line saying so.

    A UTF-8 byte-order mark (what some Windows editors write first) is not text and is dropped.
    """
    p = default_pairs_path() if path is None else Path(path)
    if p.is_dir():
        raise HeadscopeError(
            f"Prompts file '{p}' is a directory; give a UTF-8 text file with one "
            "'A<TAB>B' pair a line."
        )
    if not p.is_file():
        raise HeadscopeError(
            f"Prompts file '{p}' does not exist; give a UTF-8 text file with one "
            "'A<TAB>B' pair a line."
        )
    data = p.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise HeadscopeError(
            f"Prompts file '{p}' is not UTF-8 (bad byte on line {line}); save it as UTF-8."
        ) from None
    pairs: list[tuple[str, str]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [s.strip() for s in raw.split("\t")]
        if len(parts) == 1 and "  " in line:
            raise HeadscopeError(
                f"Prompts file '{p}' line {lineno} separates its segments with "
                "spaces, not a TAB; put one TAB character between segment A and segment B."
            )
        if len(parts) != 2 or not all(parts):
            found = f"{len(parts) - 1} TABs" if len(parts) != 2 else "an empty segment"
            raise HeadscopeError(
                f"Prompts file '{p}' line {lineno}: expected two non-empty "
                f"segments separated by one TAB (found {'no TAB' if len(parts) == 1 else found})."
            )
        pairs.append((parts[0], parts[1]))
    if not pairs:
        raise HeadscopeError(
            f"Prompts file '{p}' holds no segment pairs; write one 'A<TAB>B' pair a line."
        )
    return pairs


# ------------------------------------------------------------------------------ probes


JOINS = ("plain", "chat")


def text_probe(
    model,
    pairs: list[tuple[str, str]] | None = None,
    n_prompts: int | None = None,
    join: str = "plain",
    token_types: bool = False,
) -> Probe:
    """Join the first ``n_prompts`` pairs the model's way (all pairs when ``n_prompts`` is None).

    ``join="plain"`` (the default): encoders ``[CLS] a [SEP] b [SEP]``, decoders ``BOS a SEP b``.
    ``join="chat"``: instruct decoders get the two segments as a user turn and an assistant turn
    of their chat template (what they saw in training; SmolLM2's ``<|im_end|>`` between plain
    segments is not). ``token_types``: encoders are fed the pair's segment ids (0 for
    ``[CLS] a [SEP]``, 1 for ``b [SEP]``) instead of all zeros.
    """
    if join not in JOINS:
        raise HeadscopeError(
            f"Unknown {setting('text_join')} '{join}'.{did_you_mean(join, JOINS)} Use one of "
            f"{', '.join(JOINS)}."
        )
    if join == "chat" and not model.causal:
        raise HeadscopeError(
            f"{setting('text_join')} chat joins turns of an instruct decoder; {model.name} is an "
            "encoder (use --token-types for its segment ids)."
        )
    if token_types and model.causal:
        raise HeadscopeError(
            f"{setting('token_types')} gives encoder pairs their segment ids; "
            f"{model.name} is a decoder."
        )
    pairs = load_pairs() if pairs is None else pairs
    if not pairs:
        raise HeadscopeError(
            "The text probe needs at least one segment pair; the list given is empty."
        )
    n = len(pairs) if n_prompts is None else n_prompts
    if n < 1:
        at_least("n_prompts", n)
    if n > len(pairs):
        raise HeadscopeError(
            f"{setting('n_prompts')} {n} asks for more pairs than the corpus holds "
            f"({len(pairs)}); use at most {len(pairs)}."
        )
    joiner = model.chat_pair if join == "chat" else model.join_pair
    seqs = [joiner(a, b) for a, b in pairs[:n]]
    for i, s in enumerate(seqs):
        if len(s) > model.n_ctx:
            raise HeadscopeError(
                f"Text pair {i + 1} is {len(s)} tokens, longer than the model's "
                f"context ({model.n_ctx})."
            )
    types = [model.pair_token_types(a, b) for a, b in pairs[:n]] if token_types else None
    how = "chat" if join == "chat" else "encoder" if not model.causal else "decoder"
    settings = {"n_prompts": n, "join": how} | ({"token_types": True} if token_types else {})
    return Probe("text", seqs, settings=settings, token_types=types)


def repeat_probe(model, repeat_len: int = 50, n_sequences: int = 16, seed: int = 0) -> Probe:
    """``BOS + R + R`` sequences with ``|R| = repeat_len`` distinct ordinary tokens, seeded."""
    extra = 1 + (model.eos_id is not None)  # BOS, and [SEP] for encoders
    max_len = (model.n_ctx - extra) // 2
    if repeat_len < 1 or repeat_len > max_len:
        raise HeadscopeError(
            f"{setting('repeat_len')} {repeat_len} does not fit: 2 x L + {extra} tokens must fit "
            f"the model's context of {model.n_ctx}; use 1..{max_len}."
        )
    if n_sequences < 1:
        at_least("n_prompts", n_sequences)
    vocab = model.ordinary_vocab()
    if repeat_len > len(vocab):
        raise HeadscopeError(
            f"{setting('repeat_len')} {repeat_len} exceeds the {len(vocab)} "
            f"ordinary tokens; use at most {len(vocab)}."
        )
    import torch

    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(n_sequences):
        r = vocab[torch.randperm(len(vocab), generator=gen)[:repeat_len]].tolist()
        seqs.append(model.wrap(r + r))
    return Probe(
        "repeat",
        seqs,
        repeat_len=repeat_len,
        settings={"repeat_len": repeat_len, "n_sequences": n_sequences, "seed": seed},
    )


NULL_SEED_OFFSET = 1_000_003  # the null's draws never coincide with the repeat probe's own


def null_probe(repeat: Probe, model) -> Probe:
    """The positional null of a repeat probe: sequences of the same length with no repetition.

    ``BOS + S`` (encoders ``[CLS] + S + [SEP]``), ``S`` = ``2L`` distinct ordinary tokens drawn by a
    seeded generator. The repeat metrics read the same positions on it (``A[q, q-L+1]``,
    ``A[q, q-L]``), so a head that attends at a fixed offset scores as high here as on the repeat
    probe, and an induction head (which needs an earlier copy of the current token) does not.
    """
    L = repeat.repeat_len
    vocab = model.ordinary_vocab()
    if 2 * L > len(vocab):
        raise HeadscopeError(
            f"The positional null needs 2 x {setting('repeat_len')} = {2 * L} distinct ordinary "
            f"tokens; the model has {len(vocab)}. Use at most {len(vocab) // 2}."
        )
    seed = int(repeat.settings.get("seed", 0)) + NULL_SEED_OFFSET
    import torch

    gen = torch.Generator().manual_seed(seed)
    seqs = [
        model.wrap(vocab[torch.randperm(len(vocab), generator=gen)[: 2 * L]].tolist())
        for _ in range(len(repeat))
    ]
    return Probe(
        NULL_PROBE,
        seqs,
        repeat_len=L,
        settings={"repeat_len": L, "n_sequences": len(seqs), "seed": seed, "null_of": "repeat"},
    )


def packed_text_probe(
    model,
    pairs: list[tuple[str, str]] | None,
    seq_len: int,
    n_sequences: int = 1,
    wrap: bool = False,
) -> Probe:
    """Text sequences exactly ``seq_len`` tokens long: segments packed until full.

    Decoders: ``BOS a1 SEP b1 SEP a2 SEP b2 ...``; encoders: ``[CLS] a1 [SEP] b1 [SEP] ... [SEP]``.
    The last segment is cut to fit. Each sequence continues the corpus where the previous one
    stopped. A corpus too short for what is asked is refused: wrapping around would repeat text
    inside the probe and turn it into a repeat probe. ``wrap=True`` allows it (timing runs, where
    only the length matters); the probe's settings then say ``"wrapped": True``.
    For long natural text use :func:`headscope.probes.long.long_text_probe`.
    """
    pairs = load_pairs() if pairs is None else pairs
    _check_seq_len(model, seq_len)
    if n_sequences < 1:
        at_least("n_prompts", n_sequences)
    segments = [model.encode(s) for pair in pairs for s in pair]
    if not any(segments):
        raise HeadscopeError(
            "The prompts hold no text that tokenizes to any token; give real sentences to pack."
        )
    body = seq_len - 1 - (model.eos_id is not None)  # room between BOS/[CLS] and a final [SEP]
    seqs, i = [], 0
    for _ in range(n_sequences):
        ids: list[int] = []
        while len(ids) < body:
            if i >= len(segments) and not wrap:
                raise HeadscopeError(
                    f"The prompts hold enough text for {len(seqs)} sequence(s) of {seq_len} "
                    "tokens, not "
                    f"{n_sequences}; packing more would repeat the text inside the probe. Use "
                    f"{setting('n_prompts')} {max(1, len(seqs))}, a shorter {setting('seq_len')}, "
                    f"or no {setting('prompts')} (the built-in long prose corpus)."
                )
            if ids:
                ids.append(model.sep_id)
            ids.extend(segments[i % len(segments)])
            i += 1
        seqs.append(model.wrap(ids[:body]))
    settings = {
        "n_prompts": n_sequences,
        "seq_len": seq_len,
        "packed": True,
        "join": "encoder" if not model.causal else "decoder",
    }
    return Probe("text", seqs, settings=settings | ({"wrapped": True} if i > len(segments) else {}))


def repeat_len_for(model, seq_len: int) -> int:
    """The longest L with ``BOS + R + R`` (encoders ``+ [SEP]``) at most ``seq_len`` tokens."""
    _check_seq_len(model, seq_len)
    return (seq_len - 1 - (model.eos_id is not None)) // 2


def _check_seq_len(model, seq_len: int) -> None:
    low = 3 + (model.eos_id is not None)
    if seq_len < low or seq_len > model.n_ctx:
        raise HeadscopeError(
            f"{setting('seq_len')} {seq_len} is outside {low}..{model.n_ctx} (the "
            f"model's context); use at most {model.n_ctx}."
        )


# ------------------------------------------------------------------------------ key flags


def is_punctuation(text: str) -> bool:
    """Non-empty after stripping whitespace, and every character is Unicode punctuation (P*).

    >>> is_punctuation(" ."), is_punctuation("..."), is_punctuation("a."), is_punctuation(" ")
    (True, True, False, False)
    """
    s = text.strip()
    return bool(s) and all(unicodedata.category(c).startswith("P") for c in s)


class PunctuationTable:
    """Caches, per token id, whether the token decoded alone is punctuation."""

    def __init__(self, model):
        self._model = model
        self._known: dict[int, bool] = {}

    def __call__(self, ids):  # [batch, pos] token ids -> [batch, pos] booleans
        import torch

        for i in ids.unique().tolist():
            if i not in self._known:
                self._known[i] = is_punctuation(self._model.decode_one(i))
        known = self._known
        return torch.tensor([[known[i] for i in row] for row in ids.tolist()], dtype=torch.bool)
