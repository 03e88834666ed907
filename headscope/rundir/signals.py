"""Ctrl-C and SIGTERM while headscope writes: raised where the program was, held where it must not
be.

What Slurm, Kubernetes and Ray send (SIGTERM) is handled like Ctrl-C while a command runs
(:func:`interruptible`): both raise :class:`Interrupted` (a ``KeyboardInterrupt``) in the main
thread, so every ``finally`` clean-up runs. :func:`held` marks a critical section (making folders, a
rename, a clean-up) in which a signal waits until the section ends; :func:`released` marks the
part of a held section that may be interrupted (the long writing itself).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, raised where the program was, so that every clean-up runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.written: Path | None = None  # set when it arrived during a rename that completed


class _Signals:
    """SIGINT/SIGTERM handlers of the main thread: raise :class:`Interrupted`, or hold it while
    held.

    Python runs signal handlers in the main thread whichever thread the OS delivered the signal
    to, so a counter checked by the handler is enough to hold a signal back."""

    def __init__(self) -> None:
        self.depth = 0  # nested interruptible() blocks
        self.holding = 0  # nested held() blocks (released() sets it to 0 for a while)
        self.pending: int | None = None
        self.saved: dict[int, object] = {}

    def handle(self, signum, frame) -> None:
        if self.holding:
            self.pending = signum  # delivered when the critical section ends
            return
        raise Interrupted(signum)

    def raise_pending(self) -> None:
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise Interrupted(signum)


_SIGNALS = _Signals()
_CAUGHT = (signal.SIGINT, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While active, Ctrl-C and SIGTERM raise :class:`Interrupted` (a ``KeyboardInterrupt``) in the
    main thread, so ``finally`` blocks and :func:`held` sections behave the same for both. A signal
    the process ignores (``SIG_IGN``, e.g. SIGINT of a background job) stays ignored. Outside the
    main thread (where handlers cannot be set) it does nothing."""
    if not _main_thread():
        yield
        return
    if _SIGNALS.depth == 0:
        _SIGNALS.saved = {}
        for s in _CAUGHT:
            if signal.getsignal(s) is not signal.SIG_IGN:
                _SIGNALS.saved[s] = signal.signal(s, _SIGNALS.handle)
    _SIGNALS.depth += 1
    pending = None
    try:
        yield
    finally:
        _SIGNALS.holding += 1  # no signal may interrupt the restoring
        try:
            _SIGNALS.depth -= 1
            if _SIGNALS.depth == 0:
                for s, old in _SIGNALS.saved.items():
                    # None: set outside Python
                    signal.signal(s, signal.SIG_DFL if old is None else old)
                # a signal held back to the very end: raised below; if an exception is already
                # on its way out (the program is stopping anyway), it is dropped
                pending, _SIGNALS.pending = _SIGNALS.pending, None
        finally:
            _SIGNALS.holding -= 1
    if pending is not None:
        raise Interrupted(pending)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A critical section: a Ctrl-C or SIGTERM arriving inside it is raised when it ends."""
    if not _main_thread() or _SIGNALS.depth == 0:
        yield
        return
    _SIGNALS.holding += 1
    try:
        yield
    finally:
        _SIGNALS.holding -= 1
    if _SIGNALS.holding == 0:
        _SIGNALS.raise_pending()


@contextlib.contextmanager
def released() -> Iterator[None]:
    """Inside a :func:`held` section: the part that signals may interrupt (a long write)."""
    if not _main_thread() or _SIGNALS.depth == 0:
        yield
        return
    holding, _SIGNALS.holding = _SIGNALS.holding, 0
    try:
        _SIGNALS.raise_pending()  # one that came while held: now
        yield
    finally:
        _SIGNALS.holding = holding
