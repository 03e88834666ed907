"""The probes a scan's settings ask for, built for one model (every check that needs the model or a
file happens here, before any forward pass).

``config`` is a :class:`~headscope.scanner.config.ScanSettings` (read, never imported: the settings
object is defined above this layer and flows down to it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from headscope.errors import HeadscopeError, setting
from headscope.probes.long import (
    check_fits,
    corpus_ids,
    long_text_probe,
    needle_min_length,
    needle_probe,
)
from headscope.probes.pairs import (
    load_pairs,
    packed_text_probe,
    repeat_len_for,
    repeat_probe,
    text_probe,
)
from headscope.result import Probe

N_PROMPTS = 64  # sequences per probe when none is asked for (fewer when a prompts file holds fewer)


def n_prompts(config, say: Callable[[str], None] | None = None) -> int:
    """How many sequences per probe: ``config.n_prompts``, else 64 or, when the text probe's pairs
    are a file that holds fewer, all of them (and ``say`` hears so). An explicit number larger than
    the file is refused in one line."""
    wanted = config.n_prompts
    pairs_used = config.seq_len is None and not config.long_context
    if not pairs_used or "text" not in config.probe_names():
        return wanted or N_PROMPTS
    pairs = load_pairs(config.prompts)
    where = f"'{config.prompts}'" if config.prompts else "the built-in corpus"
    if wanted is None:
        if len(pairs) < N_PROMPTS and say is not None:
            say(
                f"{where} holds {len(pairs)} pairs: scanning {len(pairs)} text pairs and "
                f"{len(pairs)} repeat sequences "
                f"(at most {N_PROMPTS} unless --n-prompts says otherwise)"
            )
        return min(N_PROMPTS, len(pairs))
    if wanted > len(pairs):
        raise HeadscopeError(
            f"{setting('n_prompts')} {wanted} asks for more pairs than {where} "
            f"holds ({len(pairs)}); use at most {len(pairs)}."
        )
    return wanted


def build_probes(
    model, config, probes: Sequence[str] | None = None, say: Callable[[str], None] | None = None
) -> list[Probe]:
    """The probes ``config`` asks for: the text probe (the first ``n`` pairs) and ``n`` repeat
    sequences, or only the ``probes`` named (default: those the chosen metrics read).

    With ``seq_len``, every sequence is ``seq_len`` tokens long: the text probe is long real prose
    (:func:`~headscope.probes.long.long_text_probe`; with ``prompts``, those pairs packed, never
    wrapped), and the repeat probe uses the longest ``R`` that fits (``repeat_len`` is then
    ignored).

    ``long_context``: the text probe is long prose of ``seq_len`` tokens (default 2048), at most as
    many sequences as the corpus holds (``say`` hears when fewer), carrying the streaming metric's
    band (``sinks``, ``window``); and the needle probe of ``needle_tokens`` tokens at lengths
    ``seq_len / 4, / 2, x 1`` and 5 depths.
    """
    wanted = (
        list(probes)
        if probes is not None
        else (
            config.probe_names()
            if config.metrics is not None or config.long_context
            else ["text", "repeat"]
        )
    )
    long_len = config.long_seq_len()
    # an encoder or a context too short is refused before any corpus is fetched
    if config.long_context:
        check_fits(model, long_len)
    n = n_prompts(config, say) if "text" in wanted or "repeat" in wanted else 0
    out = []
    if "text" in wanted:
        if config.long_context:
            fits = len(corpus_ids(model, "scan", say)) // (long_len - 1)
            k = min(n, max(fits, 1))
            if k < n and say is not None:
                say(
                    f"the long prose corpus holds {fits} distinct {long_len}-token sequences: "
                    f"scanning {k}, not {n} (text is never repeated to fill a sequence)"
                )
            text = long_text_probe(model, long_len, k, progress=say)
            text.settings["band"] = [config.sinks, config.window]
            out.append(text)
        elif config.seq_len is not None and config.prompts is None:
            out.append(long_text_probe(model, config.seq_len, n, progress=say))
        else:
            pairs = load_pairs(config.prompts)
            out.append(
                text_probe(model, pairs, n, join=config.text_join, token_types=config.token_types)
                if config.seq_len is None
                else packed_text_probe(model, pairs, config.seq_len, n)
            )
    if "repeat" in wanted:
        L = config.repeat_len if config.seq_len is None else repeat_len_for(model, config.seq_len)
        out.append(repeat_probe(model, repeat_len=L, n_sequences=n, seed=config.seed))
    if "needle" in wanted:
        # a haystack of at least 16 tokens
        shortest = needle_min_length(model, config.needle_tokens) + 16
        lengths = sorted({max(long_len // 4, shortest), max(long_len // 2, shortest), long_len})
        out.append(
            needle_probe(model, lengths, k=config.needle_tokens, seed=config.seed, progress=say)
        )
    return out
