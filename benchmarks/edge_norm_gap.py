"""What freezing Gemma's attention-output norm costs the edge graph: every head's edges cut
together against the head's output patched exactly, on real IOI pairs.

In the edge graph a head's write is ``z_h W_O[h]`` times the norm's gain over the RMS of the
layer's whole attention output *in the run it comes from* (docs/discover.md). Where no norm
follows the attention (SmolLM2), cutting every edge out of a head is patching its output
(``z``), exactly; under Gemma 3's norm it is not: patching ``z`` recomputes the norm's scale
with the other heads' live outputs, cutting the edges keeps each run's own scale. For every
head (noising: the corrupt prompt's value into the clean run) this prints both changes in the
metric, averaged over pairs, and how far apart they are.

Usage: ``python benchmarks/edge_norm_gap.py [--model gemma3-270m] [--pairs 16]``. Not a test.
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    import numpy as np
    import torch

    import headscope
    from headscope.circuits import edge_circuits as ec
    from headscope.circuits import edge_scores as es
    from headscope.circuits.edge_graph import graph_of
    from headscope.effects.patching import Request, exact_patching, make_batches
    from headscope.probes.kits import load_kit

    if args.threads:
        torch.set_num_threads(args.threads)
    model = headscope.load_model(args.model)
    tt = load_kit("ioi", model, n_pairs=args.pairs, seed=0).tokenize(model)
    batches = make_batches(tt, args.pairs, model.pad_id)
    g = graph_of(model)
    heads = [(la, h) for la in range(g.n_layers) for h in range(g.n_heads)]
    circuits = []
    for la, h in heads:
        keep = g.valid.clone()
        keep[g.head_writer(la, h)] = False  # every edge out of the head cut
        circuits.append(keep)
    cut = ec.circuit_metrics(model, batches, args.pairs, tt.metric, circuits)  # [head, pair]
    reqs = [Request("noising", "z", "group", ("all",), tuple(heads))]
    got = exact_patching(model, batches, args.pairs, tt.metric, reqs)
    patched = torch.stack([got[("noising", "z", "group", "all", la, h)] for la, h in heads])
    base = torch.cat([es.record(model, b, "clean", tt.metric)[1] for b in batches]).double()
    e_cut = (cut - base).mean(1).numpy()  # per head, over pairs
    e_node = (patched - base).mean(1).numpy()
    gap = np.abs(e_cut - e_node)
    big = np.abs(e_node) > 0.1
    print(f"{args.model}: {len(heads)} heads, {args.pairs} IOI pairs, noising, metric {tt.metric}")
    print(f"clean metric {base.mean():+.3f}")
    worst = heads[int(gap.argmax())]
    print(f"max |edges cut - output patched| over heads: {gap.max():.4f} (L{worst[0]}H{worst[1]})")
    print(f"median |gap| {np.median(gap):.4f}; Pearson r {np.corrcoef(e_cut, e_node)[0, 1]:.4f}")
    if big.any():
        rel = gap[big] / np.abs(e_node[big])
        same = int((np.sign(e_cut[big]) == np.sign(e_node[big])).sum())
        print(
            f"heads whose patched effect exceeds 0.1: {int(big.sum())}; |gap| / |effect| median "
            f"{np.median(rel):.3f}, max {rel.max():.3f}; same sign {same}/{int(big.sum())}"
        )
    order = np.argsort(-np.abs(e_node))[:8]
    print("largest patched effects: head, output patched, edges cut")
    for i in order:
        print(f"  L{heads[i][0]}H{heads[i][1]}  {e_node[i]:+.3f}  {e_cut[i]:+.3f}")


if __name__ == "__main__":
    main()
