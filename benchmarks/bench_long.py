"""Benchmark: the long-context view's cost, as ratios measured in one run.

Each measurement runs in a fresh subprocess (its own peak memory), one torch thread:

* ``sdpa``          the model's own sdpa forward over the tokens, no logits (the base model);
* ``scan``          headscope's scan of every text metric plus ``streaming`` (fused engine: the
  kernel
                    also sums each row's sink + window band);
* ``scan-needle``   the retrieval metrics on one needle sequence (the kernel also keeps each row's
                    arg-max key), against ``sdpa-needle``, the sdpa forward over the same tokens;
* ``full-logits``   the sdpa forward with logits (what a KV-plan check runs with full attention);
* ``half-logits``   the same with half of the heads (the plan's 50% budget) restricted to 4 sinks +
                    a 64-token window by the kernel, which skips their key tiles outside the band.

Usage: ``python benchmarks/bench_long.py [--seq-len 8192] [--model smollm2-135m] [--rounds 1]
[--repeats 1]``. Not a test: timings on a shared machine are noisy, so the methods are interleaved
over rounds and the fastest run of each is kept; ratios are taken within this one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench_scan import (
    _rss_kb,  # the same resident-memory reader (this folder is on sys.path when run)
)

REPO = Path(__file__).resolve().parents[1]
METHODS = ["sdpa", "scan", "sdpa-needle", "scan-needle", "full-logits", "half-logits"]


def worker(spec: dict) -> dict:
    import time

    import torch

    import headscope
    from headscope.apps import kvplan
    from headscope.engines.extract import score_probe
    from headscope.metrics import REGISTRY
    from headscope.probes.long import long_text_probe, needle_probe

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    model = headscope.load_model(spec["model"])
    n, method = spec["seq_len"], spec["method"]
    text = long_text_probe(model, n, 1)
    text.settings["band"] = [4, 64]
    needle = needle_probe(model, [n], depths=(0.5,))
    tokens = torch.tensor(text.sequences if "needle" not in method else needle.sequences)
    metrics = [
        m for m in REGISTRY.values() if m.probe == "text" and (m.default or m.name == "streaming")
    ]
    retrieval = [REGISTRY["retrieval"], REGISTRY["retrieval_soft"]]
    ranking = sorted(
        ((la, h) for la in range(model.n_layers) for h in range(model.n_heads)),
        # a fixed, spread-out half of the heads
        key=lambda x: (x[0] * 7 + x[1] * 3) % 11,
    )
    half = kvplan.Restricted(frozenset(ranking[: len(ranking) // 2]), model.n_heads, 4, 64)
    runs = {
        "sdpa": lambda: model.run(tokens, output="hidden"),
        "sdpa-needle": lambda: model.run(tokens, output="hidden"),
        "scan": lambda: score_probe(model, text, metrics, batch_size=1, engine="fused"),
        "scan-needle": lambda: score_probe(model, needle, retrieval, batch_size=1, engine="fused"),
        "full-logits": lambda: model.run(tokens, output="logits"),
        "half-logits": lambda: model.run(tokens, handler=half, output="logits"),
    }
    run = runs[method]
    base = _rss_kb("VmRSS")
    best = float("inf")
    for _ in range(spec.get("repeats", 1)):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return {"wall_s": best, "peak_extra_gb": max(0, _rss_kb("VmHWM") - base) / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1, help="runs per worker (the fastest is kept)")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for method in METHODS:
            spec = {
                "model": args.model,
                "seq_len": args.seq_len,
                "method": method,
                "repeats": args.repeats,
            }
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", json.dumps(spec)],
                capture_output=True,
                text=True,
                env=env,
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                print(
                    f"{method}: failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}",
                    file=sys.stderr,
                )
                continue
            r = json.loads(lines[-1])
            if method not in best or r["wall_s"] < best[method]["wall_s"]:
                best[method] = {
                    **r,
                    "peak_extra_gb": max(r["peak_extra_gb"], best.get(method, r)["peak_extra_gb"]),
                }
            print(
                f"  {method:<12} {r['wall_s']:7.1f} s  peak +{r['peak_extra_gb']:.2f} GB",
                file=sys.stderr,
            )
    print(f"{args.model}, {args.seq_len} tokens, 1 thread, best of {args.repeats * args.rounds}")
    print(f"{'method':<12} {'wall s':>8} {'peak+GB':>8}  ratio")
    pairs = {"scan": "sdpa", "scan-needle": "sdpa-needle", "half-logits": "full-logits"}
    for method, r in best.items():
        ref = pairs.get(method)
        ratio = (
            f"{r['wall_s'] / best[ref]['wall_s']:.2f}x {ref}, "
            f"{r['peak_extra_gb'] - best[ref]['peak_extra_gb']:+.2f} GB"
            if ref in best
            else ""
        )
        print(f"{method:<12} {r['wall_s']:8.1f} {r['peak_extra_gb']:8.2f}  {ratio}")


if __name__ == "__main__":
    main()
