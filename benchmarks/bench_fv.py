"""Benchmark: function-vector scores (every head's indirect effect) against one forward per head
per prompt, in one run.

* ``forward``    one full forward of a shuffled-label prompt (the mean over a sample), what a
                 head-by-head sweep pays for each head and prompt (``heads x prompts`` of them);
* ``means``      every head's mean output at the last position over the clean prompts (batched
                 forwards with right padding);
* ``effects``    every head's indirect effect on every shuffled prompt: one forward of the prompt
                 without its last token (its KV cache), then every head's job computes the last
                 token alone against it, ``JOBS_PER_FORWARD`` jobs (and one untouched copy) a
                 forward.

Target (issue 40): the FV scores of all 270 SmolLM2 heads over 12 tasks x 25 prompts at most 0.6x
the cost of one forward per head per prompt. Usage: ``python benchmarks/bench_fv.py [--threads 2]
[--tasks 12] [--prompts 25] [--json OUT]``. Not a test.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=25)
    ap.add_argument("--mean-prompts", type=int, default=25)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    import headscope
    from headscope.effects import function_vectors as fv
    from headscope.probes import icl

    if args.threads:
        torch.set_num_threads(args.threads)
    model = headscope.load_model(args.model)
    names = list(icl.ICL_TASKS)[: args.tasks]
    n_heads = model.n_layers * model.n_heads
    t_means = t_ie = 0.0
    shuffled_all = []
    for t, name in enumerate(names):
        task = icl.icl_task(name)
        keep = icl.usable(model, task)
        clean = icl.build_prompts(model, task, args.mean_prompts, "clean", seed=2 * t, keep=keep)
        shuffled = icl.build_prompts(model, task, args.prompts, "shuffled", seed=2 * t + 1,
                                     keep=keep)  # fmt: skip
        t0 = time.perf_counter()
        means = fv.mean_outputs(model, clean)
        t_means += time.perf_counter() - t0
        t0 = time.perf_counter()
        fv.indirect_effects(model, shuffled, means)
        t_ie += time.perf_counter() - t0
        shuffled_all += shuffled.ids
        print(f"{name}: means {t_means:.1f} s, effects {t_ie:.1f} s so far", flush=True)
    sample = shuffled_all[:: max(1, len(shuffled_all) // 24)]
    with torch.inference_mode():
        model.run(torch.tensor([sample[0]]), output="logits")  # warm
        t0 = time.perf_counter()
        for ids in sample:
            model.run(torch.tensor([ids]), output="logits")
        t_fw = (time.perf_counter() - t0) / len(sample)
    n_prompts = len(shuffled_all)
    reference = t_fw * n_heads * n_prompts
    tokens = sum(map(len, shuffled_all)) / n_prompts
    rows = {
        "model": args.model,
        "tasks": len(names),
        "prompts": n_prompts,
        "mean_tokens_per_prompt": tokens,
        "heads": n_heads,
        "threads": torch.get_num_threads(),
        "forward_s": t_fw,
        "means_s": t_means,
        "effects_s": t_ie,
        "reference_s": reference,
        "effects_ratio": t_ie / reference,
        "total_ratio": (t_ie + t_means) / reference,
        "effects_in_forwards": t_ie / t_fw,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(
        f"{args.model}: {len(names)} tasks x {args.prompts} prompts ({tokens:.0f} tokens on "
        f"average), {n_heads} heads, {rows['threads']} threads"
    )
    print(f"one forward of a prompt: {t_fw * 1000:.0f} ms; one per head per prompt: "
          f"{reference:.0f} s ({n_heads * n_prompts} forwards)")  # fmt: skip
    print(f"indirect effects: {t_ie:.1f} s = {rows['effects_in_forwards']:.0f} forwards = "
          f"{rows['effects_ratio']:.3f}x the reference (target <= 0.6x)")  # fmt: skip
    print(f"with the mean outputs ({args.mean_prompts} clean prompts a task, {t_means:.1f} s): "
          f"{rows['total_ratio']:.3f}x")  # fmt: skip
    print(f"peak resident memory {rows['peak_rss_mb']:.0f} MB")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
