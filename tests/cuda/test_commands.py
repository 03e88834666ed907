"""Every command on the GPU: the scan (flex, blocked, hooks where transformer-lens is installed),
``--effects``, ``patch``, ``kvplan``, ``show`` and ``--ray`` with GPU workers, on tiny random models
placed on CUDA. Each checks device placement (the model and its outputs on the GPU), dtype handling
(bfloat16 weights, float32 statistics) and that scores equal the CPU's within the stated tolerance.

Marked ``cuda``: skipped with a reason where there is no GPU (CI); ``benchmarks/gpu_check.sh`` runs
them. ``HEADSCOPE_CUDA_TESTS_DEVICE=cpu`` dry-runs them on the CPU.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

import headscope
from headscope.cli.main import main

pytestmark = pytest.mark.cuda

FAST = [
    "--n-prompts",
    "4",
    "--repeat-len",
    "8",
    "--batch-size",
    "2",
    "--bootstrap",
    "20",
    "--quiet",
    "--no-figures",
]


def _device_args(accel: torch.device) -> list[str]:
    return ["--device", str(accel)]


def _scores(path) -> pd.DataFrame:
    return pd.read_csv(path / "scores.csv").set_index(["metric", "layer", "head"])["score"]


def _cli(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_the_model_and_its_outputs_live_on_the_device(tiny_gpt2_dir, accel):
    model = headscope.load_model(str(tiny_gpt2_dir), device=str(accel))
    assert model.device.type == accel.type
    assert all(p.device.type == accel.type for p in model.hf.parameters())
    logits = model.logits(torch.tensor([[1, 2, 3, 4]]))
    assert logits.device.type == accel.type and logits.dtype == torch.float32


@pytest.mark.parametrize("engine", ["flex", "blocked"])
def test_scan_on_the_device_equals_the_cpu_scan(tiny_gpt2_dir, tmp_path, accel, engine):
    """`headscope scan` on the device gives the CPU scan's scores (1e-5, float32: the GPU's
    reductions run in another order)."""
    cpu, dev = tmp_path / "cpu", tmp_path / "dev"
    r = _cli("scan", tiny_gpt2_dir, "--out", cpu, *FAST, "--engine", "blocked", "--device", "cpu")
    assert r.exit_code == 0, r.output
    r = _cli("scan", tiny_gpt2_dir, "--out", dev, *FAST, "--engine", engine, *_device_args(accel))
    assert r.exit_code == 0, r.output
    meta = json.loads((dev / "metadata.json").read_text())
    assert meta["device"].startswith(accel.type) and meta["engine"] == engine
    diff = (_scores(cpu) - _scores(dev)).abs().max()
    assert diff <= 1e-5, diff


def test_flex_is_what_auto_chooses_on_cuda(tiny_gpt2_dir, accel):
    if accel.type != "cuda":
        pytest.skip("auto prefers the fused CPU kernel on the CPU; this is the CUDA choice")
    model = headscope.load_model(str(tiny_gpt2_dir), device="cuda")
    from headscope.engines.registry import resolve_engine
    from headscope.metrics import default_metrics

    assert resolve_engine(model, "auto", default_metrics()).name == "flex"


def test_bfloat16_weights_keep_float32_statistics(tiny_gpt2_dir, tmp_path, accel):
    """A bfloat16 model scans with float32 statistics: scores within the README's stated difference
    of the float32 scan (5e-2 on SmolLM2; a tiny random model moves less)."""
    f32, bf16 = tmp_path / "f32", tmp_path / "bf16"
    assert _cli("scan", tiny_gpt2_dir, "--out", f32, *FAST, *_device_args(accel)).exit_code == 0
    r = _cli(
        "scan", tiny_gpt2_dir, "--out", bf16, *FAST, "--dtype", "bfloat16", *_device_args(accel)
    )
    assert r.exit_code == 0, r.output
    assert json.loads((bf16 / "metadata.json").read_text())["dtype"] == "bfloat16"
    assert (_scores(f32) - _scores(bf16)).abs().max() <= 5e-2


def test_effects_on_the_device(tiny_gpt2_dir, tmp_path, accel):
    """Exact ablation and attribution run where the model is (the cached residual stream, the
    repeated batches and the backward pass on the device) and agree with the CPU's."""
    cpu, dev = tmp_path / "cpu", tmp_path / "dev"
    for out, args in ((cpu, ["--device", "cpu"]), (dev, _device_args(accel))):
        r = _cli(
            "scan",
            tiny_gpt2_dir,
            "--out",
            out,
            *FAST,
            "--effects",
            "both",
            "--effects-sequences",
            "4",
            "--engine",
            "blocked",
            *args,
        )
        assert r.exit_code == 0, r.output
    a, b = _scores(cpu), _scores(dev)
    effects = [i for i in a.index if i[0].startswith(("effect_", "attribution_"))]
    assert effects and (a[effects] - b[effects]).abs().max() <= 1e-4


def test_kvplan_on_the_device(tiny_gpt2_dir, tmp_path, accel):
    """A KV plan verified on the device: restricted heads by masks (the CPU kernel is not there)."""
    out = tmp_path / "run"
    r = _cli(
        "kvplan",
        tiny_gpt2_dir,
        "--out",
        out,
        "--budgets",
        "0.5",
        "--seeds",
        "1",
        "--window",
        "16",
        "--seq-len",
        "128",
        "--texts",
        "1",
        "--depths",
        "0.5",
        "--needles-per-depth",
        "1",
        "--needle-tokens",
        "4",
        "--scan-sequences",
        "2",
        "--scan-bootstrap",
        "0",
        "-q",
    )
    assert r.exit_code == 0, r.output
    assert (out / "kvplan" / "kvplan.csv").is_file()


def test_show_on_the_device(tiny_gpt2_dir, tmp_path, accel):
    model = headscope.load_model(str(tiny_gpt2_dir), device=str(accel))
    from headscope.apps.show import head_pattern

    hp = head_pattern(model, "The river bank flooded.", 1, 2)
    rows = hp.pattern.sum(-1)
    assert abs(float(rows.max()) - 1) < 1e-5 and abs(float(rows.min()) - 1) < 1e-5


def test_ray_workers_get_a_gpu_each(tiny_gpt2_dir, tmp_path, accel):
    """--ray with GPU workers: each actor holds a replica on its GPU; the scores are the plain
    scan's."""
    pytest.importorskip("ray")
    if accel.type != "cuda":
        pytest.skip("GPU workers need a GPU")
    plain, sharded = tmp_path / "plain", tmp_path / "sharded"
    assert _cli("scan", tiny_gpt2_dir, "--out", plain, *FAST, "--device", "cuda").exit_code == 0
    r = _cli(
        "scan",
        tiny_gpt2_dir,
        "--out",
        sharded,
        *FAST,
        "--device",
        "cuda",
        "--ray",
        "--workers",
        "1",
    )
    assert r.exit_code == 0, r.output
    assert (sharded / "scores.csv").read_bytes() == (plain / "scores.csv").read_bytes()


def test_patch_on_the_device_equals_the_cpu_patch(tiny_gpt2, tiny_gpt2_dir, tmp_path, accel):
    """`headscope patch` (exact and attribution, z and v) on the device gives the CPU run's
    effects (1e-4 in the metric's share, float32)."""
    words = [
        w[1:]
        for w in (tiny_gpt2.decode_one(i) for i in range(len(tiny_gpt2.tokenizer)))
        if w.startswith(" ") and w[1:].isalpha() and len(tiny_gpt2.encode(w)) == 1
    ]
    a, b, c, d = sorted(words, key=len, reverse=True)[:4]
    rows = [
        {
            "clean": f"the {x} and the {y} met the",
            "corrupt": f"the {z} and the {y} met the",
            "answer": " " + x,
            "wrong": " " + z,
        }
        for x, y, z in ((a, b, c), (b, c, d), (c, d, a), (d, a, b))
    ]
    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tables = {}
    for name, where in (("reference", "cpu"), ("device", str(accel))):
        out = tmp_path / f"patch-{name}"
        res = _cli(
            "patch",
            tiny_gpt2_dir,
            "--task",
            task,
            "--activations",
            "z,v",
            "--estimator",
            "both",
            "--bootstrap",
            "20",
            "--no-figures",
            "--quiet",
            "--device",
            where,
            "--out",
            out,
        )
        assert res.exit_code == 0, res.output
        meta = json.loads((out / "metadata.json").read_text())
        assert str(meta.get("device", where)).startswith(where.split(":")[0])
        tables[name] = pd.read_csv(out / "patching.csv").set_index(
            ["activation", "position", "direction", "layer", "head", "estimator", "kv_mode"]
        )["effect"]
    cpu, dev = tables["reference"], tables["device"]
    assert cpu.index.equals(dev.index)
    assert (cpu - dev).abs().max() < 1e-4
