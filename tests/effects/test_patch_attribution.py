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


def _eager_qk_oracle(hf, batch, layer: int, proj: str, rows: slice):
    """Plain transformers, eager attention, no headscope code: the gradient of the summed logit
    difference with respect to layer ``layer``'s attention weights in the clean run, and those
    weights again when the rows ``rows`` of its ``proj`` (q_proj or k_proj) output come from the
    corrupt run. Returns ``sum over query and key of grad * (A' - A)`` per pair and head."""
    attn = hf.model.layers[layer].self_attn
    mod = getattr(attn, proj)
    kept = {}
    h = mod.register_forward_hook(lambda m, i, o: kept.__setitem__("src", o.detach()))
    hf(input_ids=batch.corrupt)
    h.remove()
    rows_b = torch.arange(batch.clean.shape[0])
    with torch.enable_grad():
        out = hf(input_ids=batch.clean, output_attentions=True)
        a = out.attentions[layer]
        a.retain_grad()
        logits = out.logits[rows_b, -1]
        (logits[rows_b, batch.answer] - logits[rows_b, batch.wrong]).sum().backward()

    def swap(m, i, o):
        o = o.clone()
        o[..., rows] = kept["src"][..., rows]
        return o

    h = mod.register_forward_hook(swap)
    with torch.no_grad():
        moved = hf(input_ids=batch.clean, output_attentions=True).attentions[layer]
    h.remove()
    return (a.grad * (moved - a.detach())).sum((-1, -2))  # [pair, head]


def test_qk_fix_is_the_exact_softmax_then_first_order(tiny_gqa_llama64, monkeypatch):
    import copy

    import torch.nn.functional as F

    from headscope.effects.patch_attribution import qk_fixed

    model = tiny_gqa_llama64
    tt = random_task(model, n_pairs=3, length=8, n_changed=3, seed=4)
    batches = make_batches(tt, 3, model.pad_id)
    got = qk_fixed(model, batches, 3, "logit_diff")
    # plain attribution of the same patches is attribution_patching's, to rounding
    plain = attribution_patching(
        model, batches, 3, "logit_diff", ("q", "k"), ("group", "head"), ("all",), ("noising",)
    )
    for key, want in (("q", ("q", "head")), ("k", ("k", "group")), ("k_head", ("k", "head"))):
        torch.testing.assert_close(
            got[f"atp_{key}"], plain[("noising", *want, "all")], atol=1e-12, rtol=0
        )
    # the oracle: transformers' own eager attention in float64 (its softmax computes in float32
    # whatever the input; here in the input's dtype)
    softmax = F.softmax
    monkeypatch.setattr(F, "softmax", lambda x, dim=None, dtype=None, **k: softmax(x, dim=dim))
    hf = copy.deepcopy(model.hf)
    hf.set_attn_implementation("eager")
    hf.eval()
    d, group = model.d_head, model.n_heads // model.n_kv_heads
    (batch,) = batches
    checked = 0
    for la in range(model.n_layers):
        for h in range(model.n_heads):
            want = _eager_qk_oracle(hf, batch, la, "q_proj", slice(h * d, (h + 1) * d))[:, h]
            torch.testing.assert_close(got["q"][:, la, h], want, atol=1e-10, rtol=1e-8)
            checked += 1
        for g in range(model.n_kv_heads):
            per = _eager_qk_oracle(hf, batch, la, "k_proj", slice(g * d, (g + 1) * d))
            torch.testing.assert_close(
                got["k_head"][:, la, g * group : (g + 1) * group],
                per[:, g * group : (g + 1) * group], atol=1e-10, rtol=1e-8,
            )  # fmt: skip
            torch.testing.assert_close(got["k"][:, la, g], per.sum(1), atol=1e-10, rtol=1e-8)
    assert checked == model.n_layers * model.n_heads and got["q"].abs().max() > 1e-4
    assert (got["q"] - got["atp_q"]).abs().max() > 1e-4  # the fix is not plain attribution
