"""Attribution patching is the first-order term of exact patching: its estimate equals the slope of
the exactly patched metric under a small interpolation toward the source, for every activation kind,
both kv_modes and both directions."""

from __future__ import annotations

import pytest
import torch

from headscope.effects.patch_attribution import attribution_patching
from headscope.effects.patching import (
    KINDS,
    make_batches,
    n_units,
    patched_metrics,
    position_masks,
    run_cached,
    stage_of,
)
from tests.patch_helpers import random_task

EPS = 1e-4  # float64 models: central differences good to ~1e-8


def _slopes_match(
    model, tt, kinds=KINDS, kv_modes=("group", "head"), positions=("all", "X"), rtol=1e-5, eps=EPS
):
    batches = make_batches(tt, len(tt), model.pad_id)
    assert len(batches) == 1
    batch = batches[0]
    est = attribution_patching(
        model, batches, len(tt), tt.metric, kinds, kv_modes, positions, ("denoising", "noising")
    )
    stages = sorted({stage_of(k, m) for k in kinds for m in kv_modes})
    runs = {p: run_cached(model, batch, p, tt.metric, stages) for p in ("clean", "corrupt")}
    checked, worst = 0, 0.0
    for (d, kind, kv_mode, label), e in est.items():
        base, src = ("corrupt", "clean") if d == "denoising" else ("clean", "corrupt")
        stage = stage_of(kind, kv_mode)
        ((_, where),) = position_masks(batch, label)
        assert e.shape == (len(tt), model.n_layers, n_units(model, kind, kv_mode))
        for layer in range(model.n_layers):
            jobs = [(u, where) for u in range(e.shape[2])]
            up = patched_metrics(
                model, batch, base, runs[base], runs[src], stage, layer, jobs, tt.metric, t=eps
            )
            down = patched_metrics(
                model, batch, base, runs[base], runs[src], stage, layer, jobs, tt.metric, t=-eps
            )
            slope = ((up.double() - down.double()) / (2 * eps)).T  # [pair, unit]
            want = e[:, layer]  # [pair, unit]: grad . (source - base)
            scale = want.abs().max().clamp_min(1e-3)
            worst = max(worst, float((slope - want).abs().max() / scale))
            checked += want.numel()
    assert worst < rtol, worst
    return checked


def test_attribution_is_the_slope_of_exact_patching_on_gpt2(tiny_gpt2):
    tt = random_task(tiny_gpt2, n_pairs=3, length=8)  # float32: central differences good to ~1e-3
    assert _slopes_match(tiny_gpt2, tt, kv_modes=("head",), eps=1e-2, rtol=0.02) > 0


def test_attribution_is_the_slope_of_exact_patching_with_grouped_query(tiny_gqa_llama64):
    tt = random_task(tiny_gqa_llama64, n_pairs=3, length=8, seed=1)
    assert _slopes_match(tiny_gqa_llama64, tt) > 0


@pytest.mark.parametrize("metric", ["prob", "loss"])
def test_other_metrics_too(tiny_gqa_llama64, metric):
    tt = random_task(tiny_gqa_llama64, n_pairs=2, length=7, seed=2, metric=metric)
    assert (
        _slopes_match(tiny_gqa_llama64, tt, kinds=("z", "v", "pattern"), positions=("END", "X")) > 0
    )


def test_a_full_patch_is_close_to_its_estimate_when_the_change_is_small(tiny_gqa_llama):
    """Exact (t = 1) vs attribution on a corrupt prompt that differs from the clean one in one token
    at the end: the change is small there, the first-order estimate tracks the exact effect."""
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=3, length=8, n_changed=1, seed=4)
    batches = make_batches(tt, 3, model.pad_id)
    est = attribution_patching(
        model, batches, 3, tt.metric, ("z",), ("head",), ("all",), ("denoising",)
    )
    runs = {p: run_cached(model, batches[0], p, tt.metric, ("z",)) for p in ("clean", "corrupt")}
    ((_, where),) = position_masks(batches[0], "all")
    exact = torch.stack(
        [
            patched_metrics(
                model,
                batches[0],
                "corrupt",
                runs["corrupt"],
                runs["clean"],
                "z",
                la,
                [(h, where) for h in range(model.n_heads)],
                tt.metric,
            )
            .double()
            .T
            - runs["corrupt"].metric.double()[:, None]
            for la in range(model.n_layers)
        ],
        1,
    )
    a = est[("denoising", "z", "head", "all")]  # [pair, layer, head]
    corr = torch.corrcoef(torch.stack([a.flatten(), exact.flatten()]))[0, 1]
    assert corr > 0.9, corr


def test_parameters_require_grad_again_afterwards(tiny_gqa_llama):
    model = tiny_gqa_llama
    before = [p.requires_grad for p in model.hf.parameters()]
    tt = random_task(model, n_pairs=2, length=6)
    attribution_patching(
        model,
        make_batches(tt, 2, model.pad_id),
        2,
        tt.metric,
        ("z",),
        ("head",),
        ("all",),
        ("noising",),
    )
    assert [p.requires_grad for p in model.hf.parameters()] == before and any(before)
