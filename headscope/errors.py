"""One exception type for every mistake a user can fix.

Library code raises :class:`HeadscopeError` with a single line that says what was wrong, what is
allowed and, where there is one, the nearest valid choice. Only the CLI turns it into an exit code.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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
