"""Benchmark: causal effects on SmolLM2, against the model's own forward, and attribution against
exact.

On 16 repeat + 16 text sequences (the default effects subset), in one process after a warm-up:

* ``forward``      one plain forward with logits over both probes (the unit of cost);
* ``attribution``  every head's attribution estimate on both losses (one forward + one backward per
                   batch; the same pass gives the heads' means);
* ``exact``        every head's exact mean-ablation on both losses (clean prefix reused);
* ``auto``         what ``--effects`` does by default: attribution for every head, exact for the
                   heads that matter, plus the circuit scores (copying, value_sink).

Targets (the effects issue): attribution <= 3x one forward; exact for all 270 heads <= 0.6x of
(270 x one forward); auto under 5 minutes. Agreement of attribution with exact over all heads:
Spearman rank correlation and the overlap of the top 10 by |effect|.

Usage: ``python benchmarks/bench_effects.py [--sequences 16] [--threads 2] [--json OUT.json]``. Not
a test; timings on a shared machine are noisy, so ratios are only ever taken within one run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    import pandas as pd

    return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--sequences", type=int, default=16, help="sequences per probe")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    import headscope
    from headscope.effects.heads import EffectSettings, head_effects
    from headscope.engines.extract import pad_batch, score_probe
    from headscope.scanner.config import ScanSettings
    from headscope.scanner.runner import circuit_scores

    if args.threads:
        torch.set_num_threads(args.threads)
    model = headscope.load_model(args.model)
    probes = headscope.default_probes(model, n_prompts=args.sequences)
    heads = model.n_layers * model.n_heads

    def forward():
        for p in probes:
            tokens, mask, _ = pad_batch(p.sequences, model.pad_id)
            for start in range(0, len(tokens), 8):  # the effects' batch size
                model.run(tokens[start : start + 8], mask[start : start + 8], output="logits")

    forward()  # warm-up
    model.bridge  # noqa: B018 - built once, outside the timings (copying reads weights through it)
    t0 = time.perf_counter()
    forward()
    t_forward = time.perf_counter() - t0

    def timed(mode):
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        res = head_effects(
            model, probes, EffectSettings(mode=mode, n_sequences=args.sequences), timings=timings
        )
        return time.perf_counter() - t0, res, timings

    t_attr, attr, attr_t = timed("attribution")
    t_exact, exact, exact_t = timed("exact")
    t0 = time.perf_counter()
    chosen = ScanSettings().metric_objects()  # the pattern scores auto needs to choose heads
    pattern = [r for p in probes for r in score_probe(model, p, chosen, None).values()]
    t_pattern = time.perf_counter() - t0
    t0 = time.perf_counter()
    circuit_scores(model, probes, 8)
    head_effects(model, probes, EffectSettings(mode="auto", n_sequences=args.sequences), pattern)
    t_auto = time.perf_counter() - t0

    rows = {
        "model": args.model,
        "sequences": args.sequences,
        "threads": torch.get_num_threads(),
        "heads": heads,
        "forward_s": t_forward,
        "attribution_s": t_attr,
        "exact_s": t_exact,
        "pattern_scan_s": t_pattern,
        "auto_effects_s": t_auto,
        "attribution_steps": attr_t,
        "exact_steps": exact_t,
    }
    print(
        f"{args.model}, {args.sequences} repeat + {args.sequences} text sequences, "
        f"{torch.get_num_threads()} threads, {heads} heads"
    )
    print(f"one forward (logits, both probes)        {t_forward:8.2f} s")
    print(
        f"attribution, every head, both losses     {t_attr:8.2f} s = {t_attr / t_forward:.2f}x "
        "one forward (target <= 3x)"
    )
    print(
        f"exact, every head, both losses           {t_exact:8.2f} s = "
        f"{t_exact / (heads * t_forward):.2f}x "
        f"of {heads} forwards (target <= 0.6x)"
    )
    print(
        f"default --effects (auto + circuits)      {t_auto:8.2f} s (+ {t_pattern:.1f} s pattern "
        "scan; target < 300 s)"
    )
    for a, e in zip(attr, exact, strict=True):
        x, y = a.score.flatten().numpy(), e.score.flatten().numpy()
        top_a = set(np.argsort(-np.abs(x))[:10])
        top_e = set(np.argsort(-np.abs(y))[:10])
        rho = spearman(x, y)
        rows[f"{e.metric.name}_spearman"] = rho
        rows[f"{e.metric.name}_top10_overlap"] = len(top_a & top_e)
        print(
            f"{e.metric.name:<20} attribution vs exact: Spearman {rho:.3f}, top-10 overlap "
            f"{len(top_a & top_e)}/10, "
            f"max |exact| {np.abs(y).max():.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
