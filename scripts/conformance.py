"""Run the conformance suite (:mod:`tests.oracles.conformance`) under the installed transformers,
print the table and what changed against the shipped one (``headscope/data/support.json``), and with
``--write`` write what it found there (the site's support table, docs/models.md, is generated from
it when the site is built).

    python -m scripts.conformance                 # run, print the table and the changes
    python -m scripts.conformance --write         # ... and write support.json

To try a new transformers release before the pin moves, ``python -m scripts.adopt_transformers
VERSION`` runs this under that release without touching ``.venv``.

Exit status: 1 when an engine gave a wrong score or crashed; with ``--strict``, 1 also when any
family regressed (exact -> refused) against the shipped table; else 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version

import torch

from headscope.engines.support import (
    SUPPORT_JSON,
    changes_text,
    load_support,
    support_changes,
)
from tests.oracles.conformance import FAMILIES, TOL, run

COMMAND = "python -m scripts.conformance --write"


def write(table: dict) -> None:
    doc = {
        "generated_by": COMMAND,
        "transformers": version("transformers"),
        "tolerance": TOL,
        "families": table,
    }
    SUPPORT_JSON.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write headscope/data/support.json")
    ap.add_argument("--family", action="append", help="only these families (by name or model_type)")
    ap.add_argument("--json", help="also write the table found (and its changes) to this file")
    ap.add_argument(
        "--strict", action="store_true", help="exit 1 when a family regressed against the table"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    fams = [
        f
        for f in FAMILIES
        if not args.family or f.name in args.family or f.model_type in args.family
    ]
    shipped_doc = json.loads(SUPPORT_JSON.read_text())
    print(
        f"conformance under transformers {version('transformers')} (the shipped table was made "
        f"with {shipped_doc['transformers']})"
    )
    table = run(fams)
    bad = [
        (n, e)
        for n, row in table.items()
        for e, o in row["engines"].items()
        if o["status"] in ("wrong", "error")
    ]
    for n, e in bad:
        print(
            f"  {n} / {e}: {table[n]['engines'][e]['status']}: {table[n]['engines'][e]['detail']}"
        )
    shipped = load_support()
    if args.family:  # only the families that ran
        shipped = {n: row for n, row in shipped.items() if n in table}
    changes = support_changes(shipped, table)
    print(changes_text(changes))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"transformers": version("transformers"), "table": table, "changes": changes},
                fh,
                indent=1,
            )
    if args.write:
        if args.family:
            print("--write needs the whole run (no --family): support.json left as it was")
            return 2
        write(table)
        print(f"wrote {SUPPORT_JSON} (transformers {version('transformers')})")
    return 1 if bad or (args.strict and changes["regressed"]) else 0


if __name__ == "__main__":
    sys.exit(main())
