"""Benchmark: QK attribution's table for every head of SmolLM2 at its argmax keys, against the
model's own forward over the same sequences, in one run.

* ``forward``      one forward of the batch (``Model.run(..., output="hidden")``);
* ``record``       the forward that records what the decomposition reads (every writer, each
                   layer's stream and attention call);
* ``tables last``  every head's table (and its null) at the last query of each sequence and its
                   argmax key, summed per prompt (``head_tables``), the record included;
* ``tables all``   the same at every query from position 1 (``--all``; slow: the parts are
                   ``queries x components x d_model x d_head`` multiply-adds per head);
* ``subspaces``, ``knockouts``  per head, at the last query (5 pairs knocked out per head).

Target (issue 39): the table for every head at its argmax keys over 16 sequences of 64 tokens at
most 5x one forward; memory printed (peak resident set, and the record's tensors).
Usage: ``python benchmarks/bench_qk.py [--threads 2] [--all] [--json OUT]``. Not a test.
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
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--all", action="store_true", help="also every query (slow)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    import headscope
    from headscope.circuits import qk_attribution as qa
    from headscope.circuits import qk_rules as rules
    from headscope.circuits import qk_summary as summary
    from headscope.probes.pairs import repeat_len_for, repeat_probe

    if args.threads:
        torch.set_num_threads(args.threads)
    model = headscope.load_model(args.model)
    probe = repeat_probe(model, repeat_len_for(model, args.seq_len), args.sequences, 0)
    ids = torch.tensor(probe.sequences)
    members = torch.arange(len(ids))
    heads = [(la, h) for la in range(model.n_layers) for h in range(model.n_heads)]

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out

    def forward():
        with torch.inference_mode():
            model.run(ids, output="hidden")

    def peak_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    forward()
    t_fw = min(timed(forward)[0] for _ in range(3))
    t_rec, rec = timed(lambda: qa.record(model, ids))
    rec_mb = (
        rec.writers.numel() * rec.writers.element_size()
        + sum(x.numel() * x.element_size() for x in rec.streams.values())
    ) / 2**20

    def tables(query: str):
        out = []
        for la, h in heads:
            inst = rules.instances(rec, la, h, query, "argmax")
            out.append(summary.head_tables(rec, la, h, inst, members, len(ids)))
        return out

    t_last, _ = timed(lambda: tables("last"))
    insts = {(la, h): rules.instances(rec, la, h, "last", "argmax") for la, h in heads}

    def subspaces():
        for (la, h), inst in insts.items():
            qa.subspaces(rec, la, h, inst.rows, inst.query, inst.key)

    def knockouts():
        for (la, h), inst in insts.items():
            c = qa.table(rec, la, h, inst.rows, inst.query, inst.key)
            for a in range(5):
                qa.knockouts(rec, la, h, inst, a, a, c)

    t_sub, _ = timed(subspaces)
    t_ko, _ = timed(knockouts)
    rows = {
        "model": args.model,
        "sequences": len(ids),
        "tokens": int(ids.shape[1]),
        "threads": torch.get_num_threads(),
        "heads": len(heads),
        "forward_s": t_fw,
        "record_s": t_rec,
        "tables_last_s": t_last,
        "tables_last_ratio": (t_rec + t_last) / t_fw,
        "subspaces_s": t_sub,
        "knockouts_s": t_ko,
        "record_mb": rec_mb,
    }
    if args.all:
        t_all, _ = timed(lambda: tables("all"))
        rows["tables_all_s"] = t_all
        rows["tables_all_ratio"] = (t_rec + t_all) / t_fw
    rows["peak_rss_mb"] = peak_mb()
    print(
        f"{args.model}: {len(ids)} sequences of {ids.shape[1]} tokens, {rows['threads']} threads, "
        f"{len(heads)} heads"
    )
    print(f"forward {t_fw:.3f} s; record {t_rec:.2f} s ({rec_mb:.0f} MB of tensors kept)")
    print(
        f"every head's table at the last query's argmax key (with its null): "
        f"{t_rec + t_last:.2f} s = {rows['tables_last_ratio']:.1f}x the forward (target <= 5x)"
    )
    if args.all:
        print(
            f"every head's table at every query's argmax key: {t_rec + rows['tables_all_s']:.1f} "
            f"s = {rows['tables_all_ratio']:.1f}x the forward"
        )
    print(f"subspaces {t_sub:.2f} s, knock-outs (5 pairs per head) {t_ko:.2f} s")
    print(f"peak resident memory {rows['peak_rss_mb']:.0f} MB")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
