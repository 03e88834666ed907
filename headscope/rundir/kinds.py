"""Every kind of run directory headscope writes, in one table.

A run directory says what it is in its record (``metadata.json``'s ``run_format``; a KV plan's
``kvplan.json``); the table gives, per kind, the command that writes it, its main table, how
messages name it, what ``--force`` may replace with it, and its record's file name. A new command
that writes a run directory adds one line here and writes through
:func:`headscope.rundir.store.write_run`.

>>> KINDS["patch"].table, KINDS["census"].replaces
('patching.csv', ('headscope-census/1', 'headscope-run/1'))
"""

from __future__ import annotations

from dataclasses import dataclass

from headscope.result import RUN_FORMAT


@dataclass(frozen=True)
class RunKind:
    """One kind of run directory."""

    command: str  # the headscope command that writes it
    run_format: str  # its record's ``run_format``
    table: str  # its main table: a folder holding it and a record is one of these runs
    what: str  # how one line names it ("patching run")
    #: the run formats ``--force`` may replace with this kind (its own, and what else)
    replaces: tuple[str, ...] = ()
    record: str = "metadata.json"  # the record's file name
    #: the only files it may hold, when fixed (a KV plan); else its record's ``files`` list
    files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.run_format not in self.replaces:
            object.__setattr__(self, "replaces", (self.run_format, *self.replaces))


SCAN = RunKind("scan", RUN_FORMAT, "scores.csv", "run directory")
PATCH = RunKind("patch", "headscope-patching/1", "patching.csv", "patching run")
CIRCUIT = RunKind("circuit", "headscope-circuit/1", "path.csv", "circuit run")
DISCOVER = RunKind("discover", "headscope-discover/1", "edges.csv", "discovery run")
QK = RunKind("qk", "headscope-qk/1", "qk.csv", "QK run")
ICL = RunKind("icl", "headscope-icl/1", "fv_heads.csv", "ICL run")
# a census may replace a scan's run directory (both hold scores.csv), never the reverse
CENSUS = RunKind("census", "headscope-census/1", "scores.csv", "census run", (RUN_FORMAT,))
KVPLAN = RunKind(
    "kvplan",
    "headscope-kvplan/1",
    "kvplan.csv",
    "KV plan",
    record="kvplan.json",
    files=("kvplan.csv", "kvplan.png", "kvplan.md", "kvplan.json", "kvplan.svg", "kvplan.pdf"),
)

#: By command.
KINDS = {k.command: k for k in (SCAN, PATCH, CIRCUIT, DISCOVER, QK, ICL, CENSUS, KVPLAN)}
#: By run format.
FORMATS = {k.run_format: k for k in KINDS.values()}
