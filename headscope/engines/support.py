"""Which model families each engine scores exactly: the conformance table, as the tests found it.

``headscope/data/support.json`` is written by ``python -m scripts.conformance --write``, which scans
a tiny random model of every family with every engine and compares each score, chance and n with
the same metrics computed from Hugging Face's own eager attention weights.
``tests/apps/test_conformance.py`` reruns those checks and fails when this file (or the site's table
made from it) says anything else, so a family is claimed for an engine only where the test run
showed it exact.

>>> table = load_support()
>>> table["Llama"]["engines"]["blocked"]["status"]
'exact'
>>> support_text(table).splitlines()[0].split()[:4]
['family', 'model_type', 'kind', 'fused']
"""

from __future__ import annotations

import json
from pathlib import Path

SUPPORT_JSON = Path(__file__).parent.parent / "data" / "support.json"


def load_support(path: Path = SUPPORT_JSON) -> dict:
    """``{family: {"model_type", "kind", "note", "engines": {engine: {"status", "detail",
    ...}}}}``."""
    return json.loads(Path(path).read_text())["families"]


def support_meta(path: Path = SUPPORT_JSON) -> dict:
    """How the table was made: the command, transformers' version and the tolerance."""
    doc = json.loads(Path(path).read_text())
    return {k: v for k, v in doc.items() if k != "families"}


def support_text(table: dict | None = None) -> str:
    """A plain-text table for ``headscope models --support``: family, each engine's verdict, and
    for every refusal the reason, once per distinct reason."""
    table = load_support() if table is None else table
    engines = list(next(iter(table.values()))["engines"])
    w = max(len(n) for n in table) + 1
    lines = [
        f"{'family':<{w}} {'model_type':<13} {'kind':<8} "
        + " ".join(f"{e:<8}" for e in engines)
        + " notes"
    ]
    for name, row in table.items():
        cells = " ".join(f"{row['engines'][e]['status']:<8}" for e in engines)
        lines.append(
            f"{name:<{w}} {row['model_type']:<13} {row['kind']:<8} {cells} {row['note']}".rstrip()
        )
    reasons: dict[str, list[str]] = {}
    for name, row in table.items():
        for e, o in row["engines"].items():
            if o["status"] != "exact":
                why = o["detail"].replace(f"The {e} engine cannot run here: ", "")
                reasons.setdefault(f"{e}: {why}", []).append(name)
    if reasons:
        lines += ["", "Refused (engine: reason -> families):"]
        lines += [f"  {why} -> {', '.join(fams)}" for why, fams in reasons.items()]
    return "\n".join(lines)


def supported_engines(model_type: str, table: dict | None = None) -> list[str] | None:
    """The engines shown exact on ``model_type`` (None: the family was not in the conformance
    run)."""
    table = load_support() if table is None else table
    for row in table.values():
        if row["model_type"] == model_type:
            return [e for e, o in row["engines"].items() if o["status"] == "exact"]
    return None
