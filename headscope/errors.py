"""One exception type for every mistake a user can fix, and one way for the library to say a line.

Library code raises :class:`HeadscopeError` with a single line that says what was wrong, what is
allowed and, where there is one, the nearest valid choice. Only the CLI turns it into an exit code.
Things a user should hear while work goes on (a kernel being compiled, a fallback) are
:func:`notice` lines, heard by whoever is :func:`listening` (no module-level callbacks).
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
from collections.abc import Callable, Iterable, Iterator


class HeadscopeError(ValueError):
    """A bad input, explained in one line."""


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ``" Did you mean: a, b?"`` for the closest choices, or ``""`` when none is close.

    >>> did_you_mean("inductoin", ["induction", "sink"])
    ' Did you mean: induction?'
    """
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(lowered), n=n, cutoff=0.6)
    if not close:
        return ""
    return " Did you mean: " + ", ".join(lowered[c] for c in close) + "?"


def setting(name: str) -> str:
    """How a message names a setting, so it reads well from Python and from the CLI.

    >>> setting("n_prompts")
    'n_prompts (--n-prompts)'
    """
    return f"{name} ({'--' + name.replace('_', '-')})"


def at_least(name: str, value: int | None, low: int = 1) -> None:
    """Refuse ``value < low`` in one line (None passes: it means "choose for me").

    >>> at_least("batch_size", 0)
    Traceback (most recent call last):
    ...
    headscope.errors.HeadscopeError: batch_size (--batch-size) must be at least 1, got 0.
    """
    if value is not None and value < low:
        raise HeadscopeError(f"{setting(name)} must be at least {low}, got {value}.")


# ------------------------------------------------------------------------------ notices

#: Who hears the library's one-line notices in the code running now (None: nobody), and which
#: once-only notices were already said. Scoped by :func:`listening`, like the attention seam's
#: handler: nothing stays set after the ``with`` block.
_LISTENER: contextvars.ContextVar[tuple[Callable[[str], None], set[str]] | None] = (
    contextvars.ContextVar("headscope_listener", default=None)
)


@contextlib.contextmanager
def listening(say: Callable[[str], None] | None) -> Iterator[None]:
    """Inside the block, :func:`notice` lines go to ``say`` (the CLI prints them to stderr; a
    library caller may pass its logger, or None for silence).

    >>> with listening(print):
    ...     notice("compiling the kernel")
    ...     notice("a fallback", once=True)
    ...     notice("a fallback", once=True)
    compiling the kernel
    a fallback
    """
    token = _LISTENER.set((say, set()) if say is not None else None)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def notice(message: str, once: bool = False) -> None:
    """Tell whoever is :func:`listening` one line (``once``: only the first time in that block)."""
    listener = _LISTENER.get()
    if listener is None:
        return
    say, said = listener
    if once and message in said:
        return
    said.add(message)
    say(message)
