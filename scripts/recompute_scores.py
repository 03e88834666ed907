"""Independent cross-check of a headscope run directory: every score, chance and n recomputed from
``tokens.jsonl`` with plain Hugging Face eager attention (:mod:`tests.oracles.recompute`, which
shares no code with the metrics or engines), compared with ``scores.csv``.

    python scripts/recompute_scores.py RUN_DIR [--model-dir DIR] [--tol 1e-3]

Exit status: 0 when every score, chance and n agrees (score/chance within ``--tol``, NaN only where
NaN), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument(
        "--model-dir", default=None, help="checkpoint folder (default: from metadata.json)"
    )
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    ap.add_argument("--save", default=None, help="also write the recomputed table to this CSV")
    args = ap.parse_args(argv)
    if str(ROOT) not in sys.path:  # run as a file: the oracle is tests/oracles/, beside scripts/
        sys.path.insert(0, str(ROOT))
    from tests.oracles.recompute import compare, recompute

    run_dir = Path(args.run_dir)
    theirs = pd.read_csv(run_dir / "scores.csv")
    ours = recompute(
        run_dir, args.model_dir, device=args.device, progress=True, threads=args.threads or None
    )
    if args.save:
        ours.to_csv(args.save, index=False)
    summary, problems = compare(ours, theirs, args.tol)
    with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
        print(summary.to_string())
    if problems:
        print(f"\nMISMATCH (tolerance {args.tol:g}):")
        for p in problems:
            print("  " + p)
        return 1
    print(
        f"\nOK: every score, chance and n agrees within {args.tol:g} "
        f"({len(theirs)} rows, {theirs.metric.nunique()} metrics)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
