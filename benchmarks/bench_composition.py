"""Benchmark: every composition score of a real offline model, with the null, in one run.

Prints the wall time of :func:`headscope.circuits.composition.composition` (every ordered pair of
heads in different layers, the three kinds, ``--n-null`` random senders per sender layer; the
weights read from the model included, the model's loading not), the share of pairs with z > 2 and
|z| > 2 by kind, and the top K-composition pairs by z. Usage:
``OMP_NUM_THREADS=1 python benchmarks/bench_composition.py smollm2-135m [--threads 1] [--top 10]``.
Not a test; timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import time

import torch

import headscope
from headscope.circuits.composition import composition


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-null", type=int, default=32)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--csv", default=None, help="write the whole table here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = headscope.load_model(args.model)
    t = time.perf_counter()
    df = composition(model, n_null=args.n_null)
    wall = time.perf_counter() - t
    n_pairs = len(df) // 3
    print(
        f"{args.model}: {model.n_layers} x {model.n_heads} heads, {n_pairs} pairs x 3 kinds, "
        f"n_null {args.n_null}, {args.threads} thread(s): {wall:.1f} s"
    )
    g = df.groupby("kind")
    print("share z > 2:   ", g.z.apply(lambda z: round(float((z > 2).mean()), 4)).to_dict())
    print("share |z| > 2: ", g.z.apply(lambda z: round(float((z.abs() > 2).mean()), 4)).to_dict())
    print("median score:  ", g.score.median().round(4).to_dict())
    print("median null:   ", g.null_mean.median().round(4).to_dict())
    cols = ["sender", "receiver", "score", "null_mean", "null_sd", "z", "percentile"]
    top = df[df.kind == "k"].nlargest(args.top, "z")[cols]
    print(f"top {args.top} K-composition pairs by z:")
    print(top.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.csv:
        df.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
