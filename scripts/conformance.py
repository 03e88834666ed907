"""Run the conformance suite (:mod:`headscope.apps.conformance`) and, with ``--write``, write what
it found into ``headscope/data/support.json`` (the site's support table, docs/models.md, is
generated from it when the site is built).

    python -m scripts.conformance                 # run, print the table
    python -m scripts.conformance --write         # ... and write support.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from headscope.apps.conformance import FAMILIES, TOL, run
from headscope.engines.support import SUPPORT_JSON


def write(table: dict) -> None:
    import transformers

    doc = {
        "generated_by": "python -m scripts.conformance --write",
        "transformers": transformers.__version__,
        "tolerance": TOL,
        "families": table,
    }
    SUPPORT_JSON.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write headscope/data/support.json")
    ap.add_argument("--family", action="append", help="only these families (by name or model_type)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    fams = [
        f
        for f in FAMILIES
        if not args.family or f.name in args.family or f.model_type in args.family
    ]
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
    if args.write:
        write(table)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
