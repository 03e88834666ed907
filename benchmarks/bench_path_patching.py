"""Benchmark: path patching of every sender into one receiver's key on SmolLM2, batched against one
sender at a time, in one run.

On IOI pairs (the ``ioi`` kit, seed 0; all pairs in one batch), after a warm-up:

* ``batched``       :func:`headscope.circuits.path_patching.path_patching` of every head below the
                    receiver into its key (all positions), noising: the two cached runs, step 2
                    (no attention; every sender of a layer in shared forwards; it stops after the
                    receiver's layer), step 3 (from the receiver's layer);
* ``one-at-a-time`` the textbook procedure: per sender, a full forward with the sender patched and
                    every other head frozen (step 2), then a full forward with the receiver's key
                    written in (step 3); timed on ``--sample`` senders and scaled to all of them,
                    its results checked against the batched ones;
* ``forward``       one plain forward of the batch (the unit), fastest of ``--repeats``.

Forwards are counted as work (rows x blocks, in units of one full forward of every pair: what the
issue's target "<= 0.6x the forwards" is about) and as model calls; wall times are measured beside
them. Usage: ``python benchmarks/bench_path_patching.py [--pairs 32] [--receiver L23H0.k]
[--sample 6] [--threads 2] [--json OUT]``. Not a test; ratios only within one run.
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
    ap.add_argument("--receiver", default="L23H0.k")
    ap.add_argument("--sample", type=int, default=6)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    import headscope
    from headscope.circuits.path_patching import (
        STAGE,
        Cost,
        Receiver,
        _frozen_handler,
        one_at_a_time_cost,
        path_patching,
        run_cached,
        senders_below,
    )
    from headscope.effects.patching import make_batches, position_masks
    from headscope.effects.readout import read_metric
    from headscope.effects.stages import Edit, attend, explicit_handler, head_slice
    from headscope.probes.kits import resolve_task

    if args.threads:
        torch.set_num_threads(args.threads)
    model = headscope.load_model(args.model)
    tt = resolve_task("ioi", model, None, args.pairs, 0).tokenize(model)
    (batch,) = make_batches(tt, len(tt), model.pad_id)
    r = Receiver.parse(args.receiver)
    senders = senders_below(model, [r])[r]
    paths = [(s, r) for s in senders]
    b = len(tt)

    def best(fn, n):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    forward = lambda: model.run(batch.clean, batch.mask, output="logits")  # noqa: E731
    forward()  # warm-up
    t_fwd = best(forward, args.repeats)

    cost = Cost()
    t0 = time.perf_counter()
    got = path_patching(model, [batch], b, tt.metric, paths, cost=cost)
    t_batched = time.perf_counter() - t0

    # one at a time, on a sample of senders spread over the layers
    step = max(1, len(senders) // args.sample)
    sample = senders[::step][: args.sample]
    one = Cost()
    base = run_cached(model, batch, "clean", tt.metric, False, one)
    src = run_cached(model, batch, "corrupt", tt.metric, False, one)
    (_, where_all), *_ = position_masks(batch, "all")
    (_, where_r), *_ = position_masks(batch, r.position)
    worst = 0.0
    t0 = time.perf_counter()
    for ls, hs in sample:
        heads = torch.full((b,), hs)
        rows = torch.arange(b)
        edit = Edit(ls, "z", heads, where_all, head_slice(src.z[ls], "z", rows, heads))
        record: dict = {}
        frozen = _frozen_handler(base, 1, edit, record, {r.layer}, None)
        model.run(  # layers below the sender's computed as usual, the rest frozen
            batch.clean,
            batch.mask,
            handler=lambda call, ls=ls, frozen=frozen: (
                attend(call) if call.layer < ls else frozen(call)
            ),
            output=None,
        )
        one.add(b, model.n_layers)
        x = record[r.layer][STAGE[r.kind]][:, r.head]
        hidden = model.run(
            batch.clean,
            batch.mask,
            handler=explicit_handler(
                edit=Edit(r.layer, STAGE[r.kind], torch.full((b,), r.head), where_r, x)
            ),
            output="hidden",
        )
        one.add(b, model.n_layers)
        with torch.no_grad():
            m, _ = read_metric(model, tt.metric, hidden, batch.lengths, batch.answer, batch.wrong)
        batched = got[((ls, hs), r)][batch.index]  # the task's pair order -> the batch's rows
        worst = max(worst, float((m.double().cpu() - batched).abs().max()))
    t_one = (time.perf_counter() - t0) / len(sample) * len(senders)
    full = one_at_a_time_cost(model, b, len(senders))
    res = {
        "model": model.name,
        "pairs": b,
        "tokens_per_pair": max(tt.lengths),
        "receiver": r.name,
        "senders": len(senders),
        "threads": torch.get_num_threads(),
        "forward_s": round(t_fwd, 4),
        "batched_s": round(t_batched, 2),
        "batched_full_forwards": round(cost.full_forwards(b, model.n_layers), 1),
        "batched_model_calls": cost.forwards,
        "one_at_a_time_full_forwards": round(full.full_forwards(b, model.n_layers), 1),
        "one_at_a_time_model_calls": full.forwards,
        "one_at_a_time_s_scaled": round(t_one, 2),
        "one_at_a_time_sample": len(sample),
        "forward_ratio": round(cost.block_rows / full.block_rows, 3),
        "wall_ratio": round(t_batched / t_one, 3),
        "batched_in_forwards_of_time": round(t_batched / t_fwd, 1),
        "max_abs_difference_one_vs_batched": worst,
    }
    for k, v in res.items():
        print(f"{k:36} {v}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
