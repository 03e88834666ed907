"""Precision: a bfloat16 / float16 scan's scores against a float32 scan of the same model.

The flex engine computes its statistics in float32 whatever the model's dtype (half-precision
activations are exact in float32). What remains is the model's own half-precision forward: its
queries and keys differ from the float32 model's. This prints, per metric, the largest
``|score(dtype) - score(float32)|`` over every head, for the flex engine and, beside it, the blocked
engine on the same half-precision model (its patterns are float32 softmaxes of the same q, k), so
the two differences can be told apart: flex's extra error is the gap between the columns.

    python benchmarks/flex_precision.py [--model smollm2-135m] [--device cpu] [--json OUT]

On the CPU FlexAttention runs uncompiled (exact float32); on CUDA compiled, with TF32 matmuls for
half-precision inputs (the inputs exact, the weights rounded to 11 bits inside the kernel).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def probes_for(model, seq_len: int):
    import headscope
    from headscope.probes.long import long_text_probe

    probes = headscope.default_probes(model, n_prompts=8, repeat_len=30, seed=0)
    if seq_len:
        probes.append(long_text_probe(model, seq_len, n_sequences=2))  # streaming needs q >= 68
    return probes


def scores(model, probes, engine: str) -> dict[str, torch.Tensor]:
    from headscope.engines.extract import score_probe
    from headscope.metrics import REGISTRY

    out = {}
    for probe in probes:
        metrics = [
            m
            for m in REGISTRY.values()
            if m.probe == probe.name and m.name not in ("retrieval", "retrieval_soft")
        ]
        got = score_probe(model, probe, metrics, batch_size=4, engine=engine)
        tag = "long" if probe.settings.get("long") else probe.name
        out.update({f"{tag}/{n}": s.score.double().cpu() for n, s in got.items()})
    return out


def main(argv=None) -> int:
    import headscope

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--seq-len", type=int, default=256, help="the long text probe's length (0: none)"
    )
    ap.add_argument("--json", help="write the table here")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.time()
    ref_model = headscope.load_model(args.model, device=args.device, dtype="float32")
    probes = probes_for(ref_model, args.seq_len)
    ref = scores(ref_model, probes, "flex")
    ref_blocked = scores(ref_model, probes, "blocked")
    del ref_model
    table = {
        "float32 flex vs float32 blocked": {
            k: float((ref[k] - ref_blocked[k]).abs().nan_to_num().max()) for k in ref
        }
    }
    for dtype in ("bfloat16", "float16"):
        model = headscope.load_model(args.model, device=args.device, dtype=dtype)
        for engine in ("flex", "blocked"):
            got = scores(model, probes, engine)
            table[f"{dtype} {engine} vs float32"] = {
                k: float((got[k] - ref[k]).abs().nan_to_num().max()) for k in ref
            }
        del model
    keys = list(ref)
    cols = list(table)
    print(f"{args.model} on {args.device}, torch {torch.__version__}, {time.time() - t0:.0f} s")
    print(f"{'metric':<24}" + "".join(f"{c:>34}" for c in cols))
    for k in keys:
        print(f"{k:<24}" + "".join(f"{table[c][k]:>34.2e}" for c in cols))
    print(f"{'max':<24}" + "".join(f"{max(table[c].values()):>34.2e}" for c in cols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "model": args.model,
                    "device": args.device,
                    "torch": torch.__version__,
                    "table": table,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
