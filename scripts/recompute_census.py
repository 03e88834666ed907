"""Independent cross-check of a census run directory: every row of its scores.csv recomputed from
its files alone with plain Hugging Face modules (:mod:`tests.oracles.recompute_census`, which
shares no code with the census), and Clark's table checked against the same accuracies.

    python scripts/recompute_census.py RUN_DIR [--model-dir DIR] [--effect-tol 0.02]

Exit status: 0 when every score, chance, n and null agrees (syntax accuracies to 1e-6), 1 otherwise.
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
    ap.add_argument(
        "--effect-tol", type=float, default=2e-2, help="effects: relative to the largest |effect|"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args(argv)
    import torch

    if str(ROOT) not in sys.path:  # run as a file: the oracle is tests/oracles/, beside scripts/
        sys.path.insert(0, str(ROOT))
    from tests.oracles.recompute_census import compare, recompute

    torch.set_num_threads(args.threads)
    run = Path(args.run_dir)
    theirs = pd.read_csv(run / "scores.csv")
    ours = recompute(run, args.model_dir, progress=lambda m: print(m, file=sys.stderr, flush=True))
    n, problems = compare(ours, theirs, args.effect_tol)
    if (run / "syntax_table.csv").is_file():  # the table's best heads and baselines are rows too
        table = pd.read_csv(run / "syntax_table.csv")
        mine = ours.set_index(["metric", "layer", "head"])
        for r in table.itertuples():
            d = r.head_direction if r.direction == "either" else r.direction
            la, h = (int(x) for x in r.best_head[1:].split("H"))
            key = (f"syntax_{r.relation}.{'d2h' if d == 'dep->head' else 'h2d'}", la, h)
            got = float(mine.loc[key, "score"])
            n += 1
            if abs(got - r.accuracy) > 1e-6:
                problems.append(
                    f"syntax table {r.relation} {r.direction}: {r.accuracy:.8g} vs {got:.8g}"
                )
    worst = ""
    if problems:
        print(f"MISMATCH in {len(problems)} of {n} values:")
        for p in problems[:20]:
            print("  " + p)
        return 1
    print(
        f"OK: {n} rows of {run} recomputed independently ({theirs.metric.nunique()} scores){worst}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
