"""Sharded scan throughput on a local Ray instance against the plain scan, in one run (not a test).

    .venv/bin/python benchmarks/bench_ray.py [MODEL] [--n-prompts N]

Times, for the same probes and batch size: the plain scan (this process, torch's threads), and
the sharded scan with 1 and 2 workers (one model replica per actor, one thread each), separating
Ray's start-up and the actors' model loading from the scanning itself; checks the scores agree.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--n-prompts", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

    import ray

    import headscope
    from headscope.scale.ray_scan import RayPool
    from headscope.scale.shard import ShardedScorer

    model = headscope.load_model(args.model)
    probes = headscope.default_probes(model, n_prompts=args.n_prompts)
    n_seq = sum(len(p) for p in probes)
    kw = {"batch_size": args.batch_size, "bootstrap": 0, "null": False, "examples": False}

    t0 = time.perf_counter()
    plain = headscope.scan(model, probes, **kw)
    t_plain = time.perf_counter() - t0
    print(
        f"{args.model}: {n_seq} sequences, batch {args.batch_size}, {torch.get_num_threads()} "
        "torch threads here"
    )
    print(f"plain scan             {t_plain:7.2f} s  {n_seq / t_plain:6.2f} seq/s")

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    t_init = time.perf_counter() - t0
    print(f"ray.init (local)       {t_init:7.2f} s")
    for workers in (1, 2):
        t0 = time.perf_counter()
        pool = RayPool(args.model, workers, threads=1)
        pool.pids()  # every actor has loaded its replica
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        sharded = headscope.scan(model, probes, scorer=ShardedScorer(pool.run_batches), **kw)
        t_scan = time.perf_counter() - t0
        pool.close()
        same = plain.scores["score"].equals(sharded.scores["score"])
        print(
            f"sharded, {workers} worker(s)   {t_scan:7.2f} s  {n_seq / t_scan:6.2f} seq/s  "
            f"(+ {t_load:.2f} s starting actors and loading the model; scores identical: {same})"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
