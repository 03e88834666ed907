"""GPU check: the flex engine's scan against the model's own sdpa forward, on random models of real
shapes.

No weights travel to the GPU machine and nothing can be downloaded there, so each model is its real
configuration (written below) randomly initialised in bfloat16: speed and memory depend on shapes,
not on weights. Per configuration, on the same random tokens, one sequence:

* ``sdpa``     the model's own forward (transformers' sdpa: flash attention where it applies), no
  logits;
* ``flex``     the scan's forward with the flex engine (compiled FlexAttention), every text metric
  plus streaming reduced per layer as a scan does (``on_rows`` -> each metric -> per-head sums);
* ``triton``   the same with the Triton prototype's statistics
  (``benchmarks/triton_stats.py``);
* ``blocked``  the same with the blocked engine, at ``blocked_n`` tokens (its own sdpa beside it);
* ``chance``   the scan's chance values for one batch of that length (CPU; the same for every
  engine);
* ``exact``    float32 copies of the same random model at ``exact_n`` tokens: every score of the
  flex scan against the blocked engine's (max |difference|; 1e-5 is the bar);
* ``bf16``     the bfloat16 flex scan against the float32 flex scan at ``exact_n`` (max
  |difference|).

Time: best of a few runs after a warm-up that compiles (its time is printed as ``compile``); memory:
``torch.cuda.max_memory_allocated`` over the call, as a ratio to sdpa's (weights included) and above
the weights. Every part that fails prints one line and the rest runs; a final table follows, and
``--json`` writes everything. Parts are skipped (one line) when the time budget would be exceeded.

    python benchmarks/bench_gpu.py [--only llama-3.2-1b] [--budget 330] [--json OUT.json]
    python benchmarks/bench_gpu.py --cpu-smoke     # the same code on the CPU at tiny lengths (a dry
    run)
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The real configurations (hub config.json of each model), randomly initialised here.
SMOLLM2_135M = dict(
    model_type="llama",
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
LLAMA_32_1B = dict(
    model_type="llama",
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    vocab_size=128256,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
GEMMA_3_270M = dict(
    model_type="gemma3_text",
    hidden_size=640,
    intermediate_size=2048,
    num_hidden_layers=18,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    vocab_size=262144,
    max_position_embeddings=32768,
    sliding_window=512,
    query_pre_attn_scalar=256,
    rope_theta=1_000_000.0,
    rope_local_base_freq=10_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
)


@dataclass
class Config:
    name: str
    config: dict
    n: int  # tokens of the flex-vs-sdpa comparison
    blocked_n: int  # tokens of the blocked engine's run (it materialises pattern blocks)
    exact_n: int  # tokens of the float32 exactness check
    target: float | None = None  # the time-ratio target for flex / sdpa
    mem_target: float | None = None


CONFIGS = [
    Config("llama-3.2-1b", LLAMA_32_1B, 32768, 8192, 2048, target=1.2, mem_target=1.1),
    Config("smollm2-135m", SMOLLM2_135M, 8192, 8192, 2048, target=1.3),
    Config("gemma-3-270m", GEMMA_3_270M, 32768, 8192, 2048),
]
# --cpu-smoke: the same code at tiny lengths, 2 layers
SMOKE = dict(n=160, blocked_n=160, exact_n=150)


@dataclass
class Report:
    rows: dict = field(default_factory=dict)  # config -> {part: value}
    lines: list = field(default_factory=list)

    def put(self, cfg: str, key: str, value) -> None:
        self.rows.setdefault(cfg, {})[key] = value

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)


# ----------------------------------------------------------------------------- models and batches


def build(cfg: Config, device: torch.device, dtype: torch.dtype, smoke: bool):
    """(headscope Model, vocab size): the configuration randomly initialised on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import headscope
    from tests.oracles.conformance import _decoder_tokenizer

    kw = dict(cfg.config)
    model_type = kw.pop("model_type")
    if smoke:  # the same shape family, small: 2 layers (gemma: one sliding, one full), short window
        heads = kw["num_attention_heads"] if kw["num_attention_heads"] <= 9 else 8
        kv = kw["num_key_value_heads"] if heads % kw["num_key_value_heads"] == 0 else 2
        kw.update(
            num_hidden_layers=2,
            hidden_size=16 * heads,
            intermediate_size=128,
            vocab_size=512,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=16,
        )
        if "layer_types" in kw:
            kw.update(
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=40,
                query_pre_attn_scalar=16,
            )
    tok = _decoder_tokenizer()
    hf_cfg = AutoConfig.for_model(
        model_type,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **kw,
    )
    torch.manual_seed(0)
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(
            hf_cfg, dtype=dtype, attn_implementation="sdpa"
        ).eval()
    return headscope.load_model(hf, tok, name=cfg.name), hf_cfg.vocab_size


def text_batch(n: int, vocab: int, sep_id: int, device, seed: int = 0):
    """Random tokens ``[1, n]`` and their scan context: separator and punctuation flags (about 1%
    and
    10% of keys, as real text has), the streaming band (4 sinks, 64-token window)."""
    from headscope.metrics import PatternBatch

    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (1, n), generator=gen)
    sep = torch.rand(1, n, generator=gen) < 0.01
    tokens[sep] = sep_id
    punct = torch.rand(1, n, generator=gen) < 0.10
    mask = torch.ones(1, n, dtype=torch.bool)
    batch = PatternBatch(
        lengths=torch.tensor([n]),
        causal=True,
        separator=tokens == sep_id,
        punctuation=punct,
        band=(4, 64),
    )
    return tokens, mask, batch, batch.to(device)


def text_metrics():
    from headscope.metrics import REGISTRY

    # every text metric, streaming included
    return [m for m in REGISTRY.values() if m.probe == "text"]


def engine_of(name: str):
    """A registered engine, or ``triton``: the flex engine with the Triton statistics kernel."""
    from headscope.engines import flex
    from headscope.engines.registry import get_engine

    if name == "triton":
        from benchmarks.triton_stats import triton_layer_stats

        return flex.FlexEngine(stats=triton_layer_stats)
    return get_engine(name)


def scan_forward(model, engine: str, tokens, mask, batch, keep: dict | None = None) -> None:
    """One forward of the scan with ``engine``: each layer's rows reduced by every text metric to
    per-head sums, as :func:`headscope.engines.extract.score_batch` does (without the chance
    values)."""
    from headscope.engines.extract import _block

    metrics = text_metrics()
    n = tokens.shape[1]

    def on_rows(layer, rows, q_start=0):
        block = (
            batch
            if q_start == 0 and rows.shape[-1] == n
            else _block(batch, q_start, rows.shape[-1])
        )
        for m in metrics:
            pooled = m(rows, block)
            if keep is not None:
                t, c = keep.get((m.name, layer), (0.0, 0.0))
                keep[(m.name, layer)] = (
                    t + pooled.total.double().sum(0).cpu(),
                    c + float(pooled.count.sum()),
                )
            else:
                pooled.total.cpu()  # a scan moves each layer's sums to the CPU

    engine_of(engine).run(model, tokens, mask, batch, on_rows)


def sdpa_forward(model, tokens, mask) -> None:
    """The model's own forward (sdpa), no logits."""
    with torch.inference_mode():
        model.hf.base_model(
            input_ids=tokens.to(model.device),
            attention_mask=mask.to(model.device).long(),
            use_cache=False,
        )


def scores_of(keep: dict) -> dict:
    return {k: (t / c if c else t * math.nan) for k, (t, c) in keep.items()}


# ----------------------------------------------------------------------------- measuring


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn, device, repeats: int) -> dict:
    """``{"first", "best", "peak", "base"}``: the first call's time (compiles), the best of
    ``repeats`` more, and the largest ``max_memory_allocated`` over them (bytes; ``base``
    before)."""
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device) if cuda else 0
    times, peaks = [], []
    # the first run compiles (its peak counts only when it is the only run)
    for _ in range(1 + repeats):
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        peaks.append(torch.cuda.max_memory_allocated(device) if cuda else 0)
    timed = slice(1, None) if repeats else slice(0, 1)
    return {"first": times[0], "best": min(times[timed]), "peak": max(peaks[timed]), "base": base}


class Budget:
    def __init__(self, seconds: float):
        self.end = time.time() + seconds

    def left(self) -> float:
        return self.end - time.time()


def part(report: Report, cfg: str, name: str, budget: Budget, need: float, fn) -> None:
    """Run one part; a failure or a lack of time is one line, and the rest goes on."""
    if budget.left() < need:
        report.say(
            f"[{cfg}] {name}: skipped (needs ~{need:.0f} s, {max(0.0, budget.left()):.0f} s left)"
        )
        report.put(cfg, name, "skipped (time)")
        return
    t0 = time.time()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - one line per failed part, then on to the next
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        report.say(
            f"[{cfg}] {name}: FAILED after {time.time() - t0:.0f} s: {type(exc).__name__}: {first}"
        )
        report.put(cfg, name, f"failed: {type(exc).__name__}: {first}")
        if "-v" in sys.argv:
            traceback.print_exc()
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- one configuration


def run_config(
    cfg: Config, args, report: Report, budget: Budget, device: torch.device, phase: int
) -> None:
    """Phase 1: build, then flex / triton / blocked against sdpa (the targets); phase 2: build the
    same
    random model again, then chance and exactness. All configurations' phase 1 runs first."""
    smoke = args.cpu_smoke
    n, blocked_n, exact_n = (
        (SMOKE["n"], SMOKE["blocked_n"], SMOKE["exact_n"])
        if smoke
        else (cfg.n, cfg.blocked_n, cfg.exact_n)
    )
    reps = 1 if smoke else args.repeats
    state: dict = {}
    name = cfg.name

    def load():
        t0 = time.time()
        state["model"], state["vocab"] = build(cfg, device, torch.bfloat16, smoke)
        m = state["model"]
        report.say(
            f"[{name}] built: {m.n_layers} layers x {m.n_heads} heads ({m.n_kv_heads} KV), "
            f"d_head {m.d_head}, "
            f"reach {sorted(set(m.reach), key=str)}, {m.n_params / 1e6:.0f} M params, "
            f"{m.dtype}, "
            f"{time.time() - t0:.0f} s"
        )

    part(report, name, "build" if phase == 1 else "rebuild", budget, 20, load)
    if "model" not in state:
        return
    model = state["model"]

    def compare(tag: str, length: int, engine: str, repeats: int):
        tokens, mask, _, on_dev = text_batch(length, state["vocab"], model.sep_id, device)
        s = measure(lambda: sdpa_forward(model, tokens, mask), device, max(1, repeats))
        e = measure(lambda: scan_forward(model, engine, tokens, mask, on_dev), device, repeats)
        ratio = e["best"] / s["best"]
        mem = e["peak"] / s["peak"] if s["peak"] else math.nan
        above = (
            (e["peak"] - e["base"]) / (s["peak"] - s["base"]) if s["peak"] > s["base"] else math.nan
        )
        report.put(name, f"{tag}_n", length)
        report.put(name, f"{tag}_sdpa_s", s["best"])
        report.put(name, f"{tag}_s", e["best"])
        report.put(name, f"{tag}_compile_s", e["first"])
        report.put(name, f"{tag}_time_ratio", ratio)
        report.put(name, f"{tag}_mem_ratio", mem)
        report.put(name, f"{tag}_mem_above_weights_ratio", above)
        report.put(name, f"{tag}_peak_gib", e["peak"] / 2**30)
        report.put(name, f"{tag}_sdpa_peak_gib", s["peak"] / 2**30)
        report.say(
            f"[{name}] {engine} at {length}: {e['best'] * 1e3:.1f} ms vs sdpa "
            f"{s['best'] * 1e3:.1f} ms = "
            f"{ratio:.2f}x; peak {e['peak'] / 2**30:.2f} vs {s['peak'] / 2**30:.2f} GiB = "
            f"{mem:.2f}x "
            f"({above:.2f}x above the weights); first call {e['first']:.1f} s"
        )

    if phase == 1:
        part(report, name, "flex", budget, 60, lambda: compare("flex", n, "flex", reps))
        if not args.no_triton:
            part(report, name, "triton", budget, 40, lambda: compare("triton", n, "triton", reps))
        part(
            report, name, "blocked", budget, 45, lambda: compare("blocked", blocked_n, "blocked", 0)
        )
        return

    def chance():
        from headscope.engines.extract import BatchScores, _add_chance

        _, _, batch, _ = text_batch(n, state["vocab"], model.sep_id, torch.device("cpu"))
        metrics = text_metrics()
        names = [m.name for m in metrics]
        part_ = BatchScores(
            [0],
            {k: [] for k in names},
            {k: [] for k in names},
            {k: [] for k in names},
            {k: torch.zeros(1, model.n_layers, model.n_heads, dtype=torch.float64) for k in names},
            {k: torch.zeros(1, dtype=torch.float64) for k in names},
        )
        reach = tuple(model.reach) or (None,) * model.n_layers
        t0 = time.perf_counter()
        _add_chance(metrics, batch, part_, reach)
        dt = time.perf_counter() - t0
        report.put(name, "chance_cpu_s", dt)
        report.say(
            f"[{name}] chance values of one {n}-token batch (CPU, {torch.get_num_threads()} "
            "threads, "
            f"any engine): {dt:.1f} s"
        )

    part(report, name, "chance", budget, 30 if not smoke else 1, chance)

    def exact():
        from headscope.engines import flex_stats

        tokens, mask, _, on_dev = text_batch(exact_n, state["vocab"], model.sep_id, device, seed=1)
        half = {}
        if model.dtype != torch.float32:
            # the bf16 scan, for the next part
            scan_forward(model, "flex", tokens, mask, on_dev, half)
        model.hf.float()  # the same random weights (bf16 values are exact in float32)
        try:
            got, want, tri = {}, {}, {}
            scan_forward(model, "flex", tokens, mask, on_dev, got)
            scan_forward(model, "blocked", tokens, mask, on_dev, want)
            if not args.no_triton:
                try:
                    scan_forward(model, "triton", tokens, mask, on_dev, tri)
                    t = scores_of(tri)
                    b_ = scores_of(want)
                    tw = max(float((t[k] - b_[k]).abs().nan_to_num().max()) for k in b_)
                    report.put(name, "triton_exact_max_diff", tw)
                    report.say(
                        f"[{name}] float32 triton vs blocked at {exact_n}: max |diff| {tw:.2e}"
                    )
                except Exception as exc:  # noqa: BLE001
                    report.say(
                        f"[{name}] float32 triton vs blocked: FAILED: {type(exc).__name__}: "
                        f"{(str(exc).splitlines() or [''])[0][:160]}"
                    )
            a, b = scores_of(got), scores_of(want)
            worst = max(float((a[k] - b[k]).abs().nan_to_num().max()) for k in b)
            where = max(b, key=lambda k: float((a[k] - b[k]).abs().nan_to_num().max()))
            report.put(name, "exact_n", exact_n)
            report.put(name, "exact_max_diff", worst)
            ok = "within" if worst <= 1e-5 else "NOT within"
            passes = flex_stats.value_passes(
                2 * model.d_head + 4, model.d_head, flex_stats.MAX_VALUE_DIM.get(device.type)
            )
            report.say(
                f"[{name}] float32 flex vs blocked at {exact_n}: max |diff| {worst:.2e} "
                f"({ok} 1e-5; "
                f"largest: {where[0]}, layer {where[1]}); value passes "
                f"{passes}"
            )
            if half:
                h = scores_of(half)
                per = {
                    m: max(float((h[k] - a[k]).abs().nan_to_num().max()) for k in a if k[0] == m)
                    for m in {k[0] for k in a}
                }
                report.put(name, "bf16_max_diff", max(per.values()))
                report.put(name, "bf16_per_metric", per)
                report.say(
                    f"[{name}] bfloat16 flex vs float32 flex at {exact_n}: max |diff| "
                    f"{max(per.values()):.2e} ("
                    + ", ".join(f"{m} {v:.1e}" for m, v in sorted(per.items()))
                    + ")"
                )
        finally:
            model.hf.to(torch.bfloat16)

    part(report, name, "exact", budget, 60, exact)
    state.clear()  # the model goes when this function returns


def table(report: Report) -> str:
    cols = [
        ("flex_n", "n", "{:.0f}"),
        ("flex_time_ratio", "flex/sdpa", "{:.2f}x"),
        ("flex_mem_ratio", "flex mem", "{:.2f}x"),
        ("flex_mem_above_weights_ratio", "above w.", "{:.2f}x"),
        ("flex_s", "flex s", "{:.3f}"),
        ("flex_sdpa_s", "sdpa s", "{:.3f}"),
        ("flex_compile_s", "compile s", "{:.0f}"),
        ("triton_time_ratio", "tri/sdpa", "{:.2f}x"),
        ("triton_mem_ratio", "tri mem", "{:.2f}x"),
        ("blocked_n", "blk n", "{:.0f}"),
        ("blocked_time_ratio", "blk/sdpa", "{:.2f}x"),
        ("blocked_mem_ratio", "blk mem", "{:.2f}x"),
        ("chance_cpu_s", "chance s", "{:.1f}"),
        ("exact_max_diff", "fp32 diff", "{:.1e}"),
        ("triton_exact_max_diff", "tri diff", "{:.1e}"),
        ("bf16_max_diff", "bf16 diff", "{:.1e}"),
    ]
    lines = [f"{'config':<14}" + "".join(f"{h:>11}" for _, h, _ in cols)]
    for cfg, row in report.rows.items():
        cells = []
        for key, _, fmt in cols:
            v = row.get(key)
            cells.append(
                fmt.format(v)
                if isinstance(v, (int, float))
                else ("-" if v is None else str(v)[:10])
            )
        lines.append(f"{cfg:<14}" + "".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="only these configurations (by name)")
    ap.add_argument(
        "--budget", type=float, default=330.0, help="seconds for all parts; later parts are skipped"
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed runs after the warm-up (best kept)"
    )
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="the CPU, tiny lengths and 2-layer models: a dry run",
    )
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--no-triton", action="store_true", help="leave out the Triton prototype")
    ap.add_argument("-v", action="store_true", help="tracebacks of failed parts")
    args = ap.parse_args(argv)
    import transformers

    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    report = Report()
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU (smoke run)"
    report.say(
        f"bench_gpu: {where}; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, "
        f"triton {_version('triton')}; {time.strftime('%Y-%m-%d %H:%M')}"
    )
    if device.type == "cuda" and not torch.cuda.is_available():
        report.say("no CUDA device: nothing to measure (use --cpu-smoke for a dry run)")
        return 1
    budget = Budget(args.budget)
    for phase in (1, 2):
        for cfg in CONFIGS:
            if args.only and cfg.name not in args.only:
                continue
            try:
                run_config(cfg, args, report, budget, device, phase)
            except Exception as exc:  # noqa: BLE001
                report.say(
                    f"[{cfg.name}] FAILED: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:200] if str(exc) else ''}"
                )
    text = table(report)
    print("\n" + text, flush=True)
    targets = [
        f"{c.name}: flex/sdpa <= {c.target}x"
        + (f", memory <= {c.mem_target}x" if c.mem_target else "")
        for c in CONFIGS
        if c.target
    ]
    print("targets (issue 25, H200): " + "; ".join(targets))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"lines": report.lines, "rows": report.rows, "table": text}, indent=1, default=str
            )
        )
    return 0


def _version(name: str) -> str:
    try:
        return __import__(name).__version__
    except Exception:  # noqa: BLE001
        return "absent"


if __name__ == "__main__":
    raise SystemExit(main())
