"""Benchmark: counterfactual patching on SmolLM2 against the model's own forward, in one run.

On IOI pairs (the ``ioi`` kit, seed 0; all pairs in one batch), after a warm-up:

* ``forward``      one plain forward of the batch with logits (``Model.run(..., output="logits")``),
                   the unit of cost; the fastest of ``--repeats``, timed before and after the exact
                   run (its ratio uses their mean) and between the attribution runs;
* ``exact``        exact head-output (z) patching of every head at all positions, one direction
                   (denoising), both cached runs included: the engine's own steps (run_cached,
                   then patched_metrics per layer, as exact_patching runs them), each layer
                   followed by one plain forward, so that the 270 reference forwards are timed
                   beside the work;
* ``attribution``  attribution patching of every head and every activation kind (z, q, k, v,
                   pattern; k and v in both kv modes) at all positions: one direction (one
                   forward with a backward on the base prompt, one forward on the source), then
                   both directions; the fastest of ``--repeats`` runs each.

Targets (issue 21): exact <= 0.6x the time of 270 forwards of the same batch; attribution <= 3x one
forward. Usage: ``python benchmarks/bench_patching.py [--pairs 32] [--threads 2] [--json OUT]``.
Not a test; timings on a shared machine are noisy, so ratios are only taken within one run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    import headscope
    from headscope.effects.patch_attribution import attribution_patching
    from headscope.effects.patching import (
        KINDS,
        make_batches,
        patched_metrics,
        position_masks,
        run_cached,
    )
    from headscope.probes.kits import load_kit

    if args.threads:
        torch.set_num_threads(args.threads)
    model = headscope.load_model(args.model)
    tt = load_kit("ioi", model, n_pairs=args.pairs, seed=0).tokenize(model)
    batches = make_batches(tt, args.pairs, model.pad_id)
    (batch,) = batches
    heads = model.n_layers * model.n_heads

    def forward():
        t0 = time.perf_counter()
        model.run(batch.corrupt, batch.mask, output="logits")
        return time.perf_counter() - t0

    forward()  # warm-up
    t_forward = min(forward() for _ in range(args.repeats))
    # exact: what exact_patching does for one batch, layer by layer, each layer's patched
    # forwards timed beside one plain forward (so both see the same machine;
    # ratio = sum exact / (heads x forward))
    t0 = time.perf_counter()
    clean = run_cached(model, batch, "clean", tt.metric, ("z",))
    corrupt = run_cached(model, batch, "corrupt", tt.metric, ())
    t_cache = time.perf_counter() - t0
    ((_, where),) = position_masks(batch, "all")
    t_layers, t_refs = [], []
    for layer in range(model.n_layers):
        t0 = time.perf_counter()
        patched_metrics(
            model,
            batch,
            "corrupt",
            corrupt,
            clean,
            "z",
            layer,
            [(h, where) for h in range(model.n_heads)],
            tt.metric,
        )
        t_layers.append(time.perf_counter() - t0)
        t_refs.append(forward())
    t_exact = t_cache + sum(t_layers)
    t_forward_after = min(forward() for _ in range(args.repeats))  # the machine may have changed

    def attribution(directions):
        t0 = time.perf_counter()
        attribution_patching(
            model, batches, len(tt), tt.metric, KINDS, ("group", "head"), ("all",), directions
        )
        return time.perf_counter() - t0

    # short phases: interleaved with forwards, the fastest of each kept (a shared machine only
    # ever slows down)
    t1, t2, tf = [], [], []
    for _ in range(args.repeats):
        t1.append(attribution(("denoising",)))
        t2.append(attribution(("denoising", "noising")))
        tf.append(forward())
    t_attr1, t_attr2, t_forward_attr = min(t1), min(t2), min(tf)

    shape = (
        f"{len(tt)} IOI pairs, {batch.clean.shape[1]} tokens (padded), "
        f"{torch.get_num_threads()} threads"
    )
    rows = {
        "model": args.model,
        "pairs": len(tt),
        "tokens": int(batch.clean.shape[1]),
        "threads": torch.get_num_threads(),
        "heads": heads,
        "forward_s": t_forward,
        "forward_after_s": t_forward_after,
        "forward_with_attribution_s": t_forward_attr,
        "exact_z_all_heads_s": t_exact,
        "attribution_one_direction_s": t_attr1,
        "attribution_both_directions_s": t_attr2,
        "exact_cache_s": t_cache,
        "exact_layers_s": t_layers,
        "forward_beside_layers_s": t_refs,
        "exact_ratio": t_exact / (model.n_heads * sum(t_refs)),
        "attribution_ratio": t_attr1 / t_forward_attr,
        "attribution_both_ratio": t_attr2 / t_forward_attr,
    }
    print(f"{args.model}: {shape}, {heads} heads")
    print(
        f"one forward (logits), fastest of {args.repeats}: {t_forward:.3f} s before exact, "
        f"{t_forward_after:.3f} s after, {t_forward_attr:.3f} s between the attribution runs; "
        "beside the exact layers: "
        f"{min(t_refs):.3f}..{max(t_refs):.3f} s, sum {sum(t_refs):.1f} s"
    )
    print(
        f"exact z patching, all {heads} heads, denoising  {t_exact:8.2f} s = "
        f"{rows['exact_ratio']:.3f}x of {heads} forwards timed beside it (target <= 0.6x; "
        f"cached runs {t_cache:.1f} s included)"
    )
    print(
        f"attribution, every head and kind, 1 direction {t_attr1:8.2f} s = "
        f"{rows['attribution_ratio']:.2f}x one forward (target <= 3x)"
    )
    print(
        f"attribution, every head and kind, 2 directions{t_attr2:8.2f} s = "
        f"{rows['attribution_both_ratio']:.2f}x one forward"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
