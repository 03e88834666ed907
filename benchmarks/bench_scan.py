"""Benchmark: headscope's scan against the model's own forward passes, as ratios from one run.

Each measurement runs in a fresh subprocess (so peak memory is its own): load the model, warm up,
note the resident memory, reset the kernel's high-water mark (``/proc/self/clear_refs``), run (best
of 3 when one run takes under 10 s), and report wall time and peak memory above the loaded model.
Measured, on the same tokens:

* ``scan``       headscope scan of the text metrics (default engine: fused where the CPU kernel
  builds);
* ``scan-blocked`` the same scan from exact pattern blocks (the engine without the C++ kernel);
* ``scan-hooks`` the same scan reading transformer-lens ``hook_pattern`` (eager attention);
* ``sdpa``       the HF model's fused-attention forward, no logits (the base model);
* ``eager``      the same with eager attention, which materialises every pattern;
* ``logits``     the full sdpa forward with logits (the short-context comparison);
* ``tl-pat``     transformer-lens ``run_with_cache`` keeping only ``hook_pattern``;
* ``tl-all``     ``run_with_cache`` keeping everything.

Usage: ``python benchmarks/bench_scan.py [--quick] [--rounds 2] [--json OUT.json]``. Not a test:
timings on a shared machine are noisy, so each configuration's methods are measured in interleaved
rounds (the fastest wall time and the highest peak are kept; eager at >= 4,096 and the
transformer-lens caches once), and ratios are only ever taken within one run. The timer and the
closing fit of scan time against context length (``a + b n + c n^2``) are
:func:`lib.timing.best_time` and :func:`lib.timing.fit_quadratic` (``analyses/lib/timing.py``, put
on ``sys.path`` here), the same ones notebook 03 uses.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "analyses"))  # lib: the notebooks' helpers (lib.timing)


# ----------------------------------------------------------------------------- worker side


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _gpt2_small_shape(tmp: Path) -> str:
    """A random GPT-2-small-shaped checkpoint folder (12 x 12, d=768, 1024 positions)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    sys.path.insert(0, str(REPO))
    from tests.tiny_models import _bpe_tokenizer

    if not (tmp / "config.json").is_file():
        import torch

        tok = _bpe_tokenizer(1000)
        torch.manual_seed(0)
        GPT2LMHeadModel(
            GPT2Config(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        ).save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return str(tmp)


def worker(spec: dict) -> dict:
    import torch

    import headscope
    from headscope.engines.extract import score_probe
    from headscope.metrics import REGISTRY
    from headscope.probes.long import long_text_probe
    from lib.timing import best_time

    torch.set_grad_enabled(False)
    name = spec["model"]
    if name == "gpt2-small-shape":
        name = _gpt2_small_shape(Path(spec["tmp"]))
    model = headscope.load_model(name)
    method = spec["method"]
    text_metrics = [m for m in REGISTRY.values() if m.probe == "text"]
    # A short warm-up run first, so one-off kernel set-up is not timed.
    for seq_len in (min(32, spec["seq_len"]), spec["seq_len"]):
        # real prose, never repeated inside a sequence
        probe = long_text_probe(model, seq_len, spec["batch"])
        tokens = torch.tensor(probe.sequences)
        mask = torch.ones_like(tokens, dtype=torch.bool)
        run = _runner(model, method, probe, tokens, mask, text_metrics, spec["batch"], score_probe)
        if seq_len == spec["seq_len"]:
            break
        with torch.inference_mode():
            run()
    base_kb = _rss_kb("VmRSS")
    _reset_peak()
    runs = 0

    def timed() -> None:
        nonlocal runs
        runs += 1
        with torch.inference_mode():
            run()

    # Short runs are repeated (best of 3): one 3-second run on a shared machine is noise.
    wall = best_time(timed, repeats=3, long_s=10.0)
    peak_kb = _rss_kb("VmHWM")
    out = {"wall_s": wall, "runs": runs, "peak_extra_gb": max(0, peak_kb - base_kb) / 2**20}
    if hasattr(run, "cache_gb"):
        out["cache_gb"] = run.cache_gb
    return out


def _runner(model, method, probe, tokens, mask, text_metrics, batch, score_probe):
    """A zero-argument callable doing one measured thing."""
    if method in ("scan", "scan-blocked", "scan-hooks"):
        engine = {"scan": "auto", "scan-blocked": "blocked", "scan-hooks": "hooks"}[method]

        def run():  # the warm-up run builds whatever the engine builds on first use
            score_probe(model, probe, text_metrics, batch_size=batch, engine=engine)
    elif method == "sdpa":

        def run():  # the base model, no logits; with no handler, attention is transformers' sdpa
            model.run(tokens, mask, output="hidden")
    elif method == "logits":

        def run():
            model.logits(tokens, mask)
    elif method == "eager":
        # No Model method runs eager attention: this baseline benchmarks the raw HF model itself.
        hf = model.hf
        hf.set_attn_implementation("eager")

        def run():
            hf.base_model(input_ids=tokens, attention_mask=mask.long(), use_cache=False)
    elif method in ("tl-pat", "tl-all"):
        # transformer-lens' own run_with_cache is the baseline measured here, so this one reaches
        # the bridge and names its hooks; headscope's code goes through Model methods instead.
        bridge = model.bridge
        names = (lambda n: n.endswith("hook_pattern")) if method == "tl-pat" else None

        def run():
            _, cache = bridge.run_with_cache(tokens, names_filter=names, return_type="logits")
            run.cache_gb = sum(t.numel() * t.element_size() for t in cache.values()) / 2**30
    else:
        raise SystemExit(f"unknown method {method}")
    return run


# ----------------------------------------------------------------------------- driver side


def measure(model: str, seq_len: int, batch: int, method: str, tmp: Path) -> dict | None:
    spec = {"model": model, "seq_len": seq_len, "batch": batch, "method": method, "tmp": str(tmp)}
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["killed (out of memory?)"])[-1]
        print(f"    {method}: failed: {tail}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


def avail_gb() -> float:
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) / 2**20


def plan(quick: bool) -> list[tuple[str, int, int, list[str]]]:
    """(model, seq_len, batch, methods). TL caches are skipped where they cannot fit in memory."""
    smol = "smollm2-135m"
    if quick:
        return [
            (smol, 512, 1, ["scan", "sdpa", "eager", "tl-pat"]),
            (smol, 128, 8, ["scan", "logits"]),
        ]
    return [
        (smol, 128, 8, ["scan", "scan-blocked", "scan-hooks", "logits", "sdpa"]),
        (smol, 512, 1, ["scan", "scan-blocked", "scan-hooks", "sdpa", "eager", "tl-pat", "tl-all"]),
        (
            smol,
            2048,
            1,
            ["scan", "scan-blocked", "scan-hooks", "sdpa", "eager", "tl-pat", "tl-all"],
        ),
        (smol, 4096, 1, ["scan", "scan-blocked", "sdpa", "eager", "tl-pat"]),
        (smol, 8192, 1, ["scan", "sdpa"]),
        ("gpt2-small-shape", 128, 8, ["scan", "scan-blocked", "scan-hooks", "logits", "sdpa"]),
        (
            "gpt2-small-shape",
            1024,
            1,
            ["scan", "scan-blocked", "scan-hooks", "sdpa", "eager", "tl-pat", "tl-all"],
        ),
        # sliding-window layers (512 keys on 15 of 18 layers): the kernel skips the tiles outside
        # the window
        ("gemma3-270m", 4096, 1, ["scan", "scan-blocked", "sdpa"]),
    ]


TL_BYTES = {"smollm2-135m": (30, 9), "gpt2-small-shape": (12, 12), "gemma3-270m": (18, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="two small configurations only")
    ap.add_argument("--json", type=Path, help="also write every measurement here")
    ap.add_argument(
        "--only",
        action="append",
        metavar="MODEL:BATCHxSEQ",
        help="measure only these configurations, e.g. smollm2-135m:8x128 (repeatable)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="measure each configuration's methods this many times, interleaved; keep the fastest",
    )
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="headscope-bench-"))
    rows, best = [], {}
    print(
        f"{'model':<18} {'tokens':>10} {'method':<12} {'wall s':>8} {'x sdpa':>7} "
        f"{'x logits':>8} {'peak+GB':>8} {'+GB vs sdpa':>11}"
    )
    for model, seq_len, batch, methods in plan(args.quick):
        if args.only and f"{model}:{batch}x{seq_len}" not in args.only:
            continue
        res = {}
        # rounds interleave the methods: a noisy minute hits all alike
        for rnd in range(args.rounds):
            for method in methods:
                if method.startswith("tl"):
                    if rnd > 0:
                        continue  # slow and not a target: measured once
                    layers, heads = TL_BYTES[model]
                    need = (
                        layers
                        * heads
                        * seq_len**2
                        * batch
                        * 4
                        / 2**30
                        * (1 if method == "tl-pat" else 2.2)
                    )
                    if need > 0.6 * avail_gb():
                        print(
                            f"{model:<18} {f'{batch}x{seq_len}':>10} {method:<12} skipped: its "
                            f"cache needs ~{need:.0f} GB of {avail_gb():.0f} GB free"
                        )
                        continue
                if method == "eager" and rnd > 0 and seq_len >= 4096:
                    continue
                r = measure(model, seq_len, batch, method, tmp)
                if r is None:
                    continue
                rows.append(
                    {
                        "model": model,
                        "seq_len": seq_len,
                        "batch": batch,
                        "method": method,
                        "round": rnd,
                        **r,
                    }
                )
                prev = res.get(method)
                peak = (
                    max(r["peak_extra_gb"], prev["peak_extra_gb"]) if prev else r["peak_extra_gb"]
                )
                if prev is None or r["wall_s"] < prev["wall_s"]:
                    res[method] = dict(r)
                res[method]["peak_extra_gb"] = peak  # the highest peak of any round
        for method, r in res.items():
            xs = r["wall_s"] / res["sdpa"]["wall_s"] if "sdpa" in res else float("nan")
            xl = r["wall_s"] / res["logits"]["wall_s"] if "logits" in res else float("nan")
            dm = (
                r["peak_extra_gb"] - res["sdpa"]["peak_extra_gb"] if "sdpa" in res else float("nan")
            )
            print(
                f"{model:<18} {f'{batch}x{seq_len}':>10} {method:<12} {r['wall_s']:>8.2f} "
                f"{xs:>7.2f} {xl:>8.2f} "
                f"{r['peak_extra_gb']:>8.2f} {dm:>+11.2f}",
                flush=True,
            )
            best[(model, seq_len, batch, method)] = r["wall_s"]
    scans = sorted(
        (n, w)
        for (m, n, b, meth), w in best.items()
        if m == "smollm2-135m" and meth == "scan" and b == 1
    )
    if len(scans) >= 2:
        from lib.timing import fit_quadratic

        n, t = [s for s, _ in scans], [w for _, w in scans]
        fit = fit_quadratic(n, t)
        a, b, c = fit["a"], fit["b"], fit["c"]
        print(
            "\nscan time vs context (smollm2-135m, 1 sequence): "
            + ", ".join(f"{s}: {w:.2f}s" for s, w in scans)
        )
        print(
            f"quadratic fit t = {a:.3g} + {b:.3e} n + {c:.3e} n^2 (no negative term, relative "
            "error); at the "
            f"longest n the n^2 term is {c * n[-1] ** 2 / (a + b * n[-1] + c * n[-1] ** 2):.0%} "
            "of the fitted "
            f"time; it overtakes the linear term at n = {fit['n_cross']:.0f}; log-log slope "
            "between the last "
            f"two: {math.log(t[-1] / t[-2]) / math.log(n[-1] / n[-2]):.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
