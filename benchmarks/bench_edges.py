"""Benchmark: edge attribution and the faithfulness curve on SmolLM2, against the model's own
forward and backward, in one run.

On IOI pairs (the ``ioi`` kit, seed 0; all pairs in one batch), after a warm-up, each phase
interleaved with the reference it is divided by (the fastest of ``--repeats`` of each kept: a shared
machine only ever slows down):

* ``forward``           one forward of the batch to the metric (``Model.run(..., output="hidden")``
                        and the metric at the last position);
* ``forward+backward``  the same with a backward of the metric to the residual stream (parameters
                        not differentiated, as edge attribution runs it);
* ``eap``               every edge's EAP score, noising (a forward of the corrupt prompts, a
                        forward and backward of the clean ones, the products);
* ``eap-ig``            every edge's EAP-IG score with ``--steps`` steps (two forwards, ``steps``
                        forwards and backwards, the products);
* ``curve``             the faithfulness curve of the top edges by EAP: ``--sizes`` circuits, plus
                        the full and the empty circuit (no random orders), each one forward.

Targets (issue 38): EAP <= 3x one forward + backward; EAP-IG (5 steps) <= 8x; the 20-point curve
<= 25 forwards. Usage: ``python benchmarks/bench_edges.py [--pairs 32] [--threads 2] [--json
OUT]``. Not a test; ratios are only taken within one run.
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
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--sizes", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    import headscope
    from headscope.circuits import edge_circuits as ec
    from headscope.circuits import edge_scores as es
    from headscope.circuits.edge_graph import graph_of
    from headscope.effects.patch_attribution import no_parameter_grads
    from headscope.effects.patching import make_batches, read_rows
    from headscope.probes.kits import load_kit

    if args.threads:
        torch.set_num_threads(args.threads)
    model = headscope.load_model(args.model)
    tt = load_kit("ioi", model, n_pairs=args.pairs, seed=0).tokenize(model)
    batches = make_batches(tt, args.pairs, model.pad_id)
    (batch,) = batches
    n = len(tt)

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def forward():
        with torch.inference_mode():
            hidden = model.run(batch.clean, batch.mask, output="hidden")
            read_rows(model, tt.metric, hidden, batch, 1)

    def forward_backward():
        embed = model.hf.get_input_embeddings()
        hook = embed.register_forward_hook(lambda m, a, out: out.detach().requires_grad_(True))
        try:
            with no_parameter_grads(model):
                hidden = model.run(batch.clean, batch.mask, output="hidden", grad=True)
                read_rows(model, tt.metric, hidden, batch, 1, grad=True).sum().backward()
        finally:
            hook.remove()

    def best(work, reference) -> tuple[float, float]:
        """The fastest of ``--repeats`` of ``work`` and of ``reference``, interleaved."""
        w, r = [], []
        for _ in range(args.repeats):
            r.append(timed(reference))
            w.append(timed(work))
        return min(w), min(r)

    forward()
    forward_backward()
    eap = {}
    t_eap, t_fb1 = best(
        lambda: eap.update(s=es.attribution(model, batches, n, tt.metric, "eap")), forward_backward
    )
    t_ig, t_fb2 = best(
        lambda: es.attribution(model, batches, n, tt.metric, "eap-ig", steps=args.steps),
        forward_backward,
    )
    ranking = eap["s"].mean(0)
    shares = ec.fractions(args.sizes)
    t_curve, t_fw = best(
        lambda: ec.faithfulness_curve(
            model, batches, n, tt.metric, ranking, shares, n_random=0, resamples=0
        ),
        forward,
    )
    g = graph_of(model)
    rows = {
        "model": args.model,
        "pairs": n,
        "tokens": int(batch.clean.shape[1]),
        "threads": torch.get_num_threads(),
        "edges": g.n_edges,
        "forward_s": t_fw,
        "forward_backward_s": min(t_fb1, t_fb2),
        "eap_s": t_eap,
        "eap_ig_s": t_ig,
        "eap_ig_steps": args.steps,
        "curve_s": t_curve,
        "curve_sizes": args.sizes,
        "eap_ratio": t_eap / t_fb1,
        "eap_ig_ratio": t_ig / t_fb2,
        "curve_forwards": t_curve / t_fw,
    }
    print(
        f"{args.model}: {n} IOI pairs, {rows['tokens']} tokens (padded), "
        f"{rows['threads']} threads, {g.n_edges} edges"
    )
    print(f"forward {t_fw:.3f} s, forward + backward {rows['forward_backward_s']:.3f} s")
    print(f"EAP (every edge)            {t_eap:7.2f} s = {rows['eap_ratio']:.2f}x forward+backward")
    print(
        f"EAP-IG ({args.steps} steps)           {t_ig:7.2f} s = {rows['eap_ig_ratio']:.2f}x "
        "forward+backward"
    )
    print(
        f"curve ({args.sizes} sizes + full + empty) {t_curve:7.2f} s = "
        f"{rows['curve_forwards']:.1f} forwards"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
