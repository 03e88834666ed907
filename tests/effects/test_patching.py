"""Exact patching: a head patched with its own activation changes nothing (bit for bit), and every
patch equals an independent plain-transformers recomputation (tests/effects/patching_oracle.py)."""

from __future__ import annotations

import pytest
import torch

from headscope.effects.patch_table import ratio_effects
from headscope.effects.patching import (
    KINDS,
    Request,
    exact_patching,
    make_batches,
    n_units,
    patched_metrics,
    position_masks,
    run_cached,
    stage_of,
)
from tests.effects import patching_oracle as oracle
from tests.patch_helpers import random_task

ALL_STAGES = ("z", "q", "k", "v", "k_head", "v_head", "pattern")


def _own_patch_is_exact(model, tt, layers, positions=("all", "X", "END"), batch_size=3):
    for batch in make_batches(tt, batch_size, model.pad_id):
        for prompt in ("clean", "corrupt"):
            run = run_cached(model, batch, prompt, tt.metric, ALL_STAGES)
            for stage in ALL_STAGES:
                units = model.n_kv_heads if stage in ("k", "v") else model.n_heads
                for layer in layers:
                    jobs = [
                        (u, w)
                        for u in range(units)
                        for p in positions
                        for _, w in position_masks(batch, p)
                    ]
                    got = patched_metrics(
                        model, batch, prompt, run, run, stage, layer, jobs, tt.metric
                    )
                    assert torch.equal(got, run.metric[None].expand_as(got)), (prompt, stage, layer)


def test_patching_a_head_with_its_own_activation_changes_nothing_exactly(
    tiny_gpt2, tiny_gqa_llama, tiny_gemma3_dir
):
    import headscope

    gemma = headscope.load_model(str(tiny_gemma3_dir))  # sliding window 4 on layer 0, one KV head
    for model in (tiny_gpt2, tiny_gqa_llama, gemma):
        tt = random_task(model, n_pairs=5, lengths=[9, 9, 7, 9, 8])  # padding inside a batch too
        _own_patch_is_exact(model, tt, range(model.n_layers))


def test_own_patch_effect_is_exactly_zero_through_the_table(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=4)
    batch = make_batches(tt, 4, model.pad_id)[0]
    clean = run_cached(model, batch, "clean", tt.metric, ("z",))
    corrupt = run_cached(model, batch, "corrupt", tt.metric, ())
    jobs = [(h, position_masks(batch, "all")[0][1]) for h in range(model.n_heads)]
    own = patched_metrics(
        model, batch, "clean", clean, clean, "z", 1, jobs, tt.metric
    ).double()  # noising, own
    stats = ratio_effects(
        clean.metric.double(),
        corrupt.metric.double(),
        own,
        torch.zeros(len(own), dtype=torch.bool),
        resamples=50,
    )
    assert (stats["effect"] == 0.0).all() and (stats["delta"] == 0.0).all()
    assert (stats["ci_low"] == 0.0).all() and (stats["ci_high"] == 0.0).all()


def _requests(model, kinds=KINDS, positions=("all", "X"), units=None, kv_modes=("group", "head")):
    out = []
    for d in ("denoising", "noising"):
        for k in kinds:
            for m in kv_modes if k in ("k", "v") else ("head",):
                every = units or [
                    (la, u) for la in range(model.n_layers) for u in range(n_units(model, k, m))
                ]
                every = [(la, u) for la, u in every if u < n_units(model, k, m)]
                out.append(Request(d, k, m, tuple(positions), tuple(every)))
    return out


def _check_against_oracle(model, tt, requests, atol=1e-4, batch_size=4):
    base = {}
    got = exact_patching(
        model,
        make_batches(tt, batch_size, model.pad_id),
        len(tt),
        tt.metric,
        requests,
        baseline=base,
    )
    hf, n = model.hf, 0
    for i in range(len(tt)):
        for p in ("clean", "corrupt"):
            want = oracle.plain_metric(hf, getattr(tt, p)[i], tt.metric, tt.answer[i], tt.wrong[i])
            assert base[p][i].item() == pytest.approx(want, abs=atol)
            hand = oracle.hand_metric(hf, getattr(tt, p)[i], tt.metric, tt.answer[i], tt.wrong[i])
            assert hand == pytest.approx(
                want, abs=atol
            )  # the oracle's own attention is the model's
    for (d, kind, kv_mode, label, layer, unit), per_pair in got.items():
        for i in range(len(tt)):
            base_ids, src_ids = (
                (tt.corrupt[i], tt.clean[i]) if d == "denoising" else (tt.clean[i], tt.corrupt[i])
            )
            positions = range(len(base_ids)) if label == "all" else [tt.positions[label][i]]
            if kind == "z":
                want = oracle.z_patched_metric(
                    hf,
                    model.n_heads,
                    base_ids,
                    src_ids,
                    layer,
                    unit,
                    positions,
                    tt.metric,
                    tt.answer[i],
                    tt.wrong[i],
                )
            else:
                want = oracle.qkv_patched_metric(
                    hf,
                    base_ids,
                    src_ids,
                    layer,
                    kind,
                    kv_mode,
                    unit,
                    positions,
                    tt.metric,
                    tt.answer[i],
                    tt.wrong[i],
                )
            assert per_pair[i].item() == pytest.approx(want, abs=atol), (
                d,
                kind,
                kv_mode,
                label,
                layer,
                unit,
                i,
            )
            n += 1
    return n


@pytest.mark.parametrize("metric", ["logit_diff", "prob", "loss"])
def test_every_kind_matches_the_oracle_on_tiny_gpt2(tiny_gpt2, metric):
    tt = random_task(tiny_gpt2, n_pairs=3, lengths=[9, 8, 9], metric=metric)
    assert _check_against_oracle(tiny_gpt2, tt, _requests(tiny_gpt2, kv_modes=("head",))) > 0


def test_every_kind_and_kv_mode_matches_the_oracle_on_grouped_query_llama(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=3, lengths=[9, 8, 9])
    assert _check_against_oracle(model, tt, _requests(model)) > 0


def test_kv_modes_differ_as_they_should(tiny_gqa_llama):
    """group: patching a KV head changes what both its query heads read; head: only one of them.
    So the group patch of KV head 0 is not the head patch of query head 0 or 1 alone."""
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=3, seed=3)
    reqs = [
        Request("denoising", "v", "group", ("all",), ((1, 0),)),
        Request("denoising", "v", "head", ("all",), ((1, 0), (1, 1))),
    ]
    got = exact_patching(model, make_batches(tt, 3, model.pad_id), len(tt), tt.metric, reqs)
    group = got[("denoising", "v", "group", "all", 1, 0)]
    for h in (0, 1):
        assert (group - got[("denoising", "v", "head", "all", 1, h)]).abs().max() > 1e-4


def test_stage_names():
    assert [stage_of(k, "group") for k in KINDS] == ["z", "q", "k", "v", "pattern"]
    assert [stage_of(k, "head") for k in KINDS] == ["z", "q", "k_head", "v_head", "pattern"]


@pytest.mark.real
def test_own_patch_is_exact_on_smollm2(smollm2):
    """Bit-exact on one CPU thread. With several, SmolLM2's matrix products split a batch's rows
    over threads and kernels differently, so a row's last bits depend on what is batched with it
    (seen with 2 threads: the readout of a repeated clean row differed in its last bit); the tiny
    models stay exact either way."""
    import torch

    from headscope.probes.kits import load_kit

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tt = load_kit("ioi", smollm2, n_pairs=3, seed=1).tokenize(smollm2)
        tt.positions["X"] = tt.positions["S2"]
        _own_patch_is_exact(smollm2, tt, layers=[2, 28], positions=("all", "X"), batch_size=3)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.real
def test_matches_the_oracle_on_smollm2(smollm2):
    """Grouped-query (9 query heads, 3 KV heads): a few heads of three layers, every kind, both
    directions and kv_modes, at all positions and at S2."""
    from headscope.probes.kits import load_kit

    tt = load_kit("ioi", smollm2, n_pairs=2, seed=2).tokenize(smollm2)
    units = [(0, 1), (14, 4), (29, 2)]
    n = _check_against_oracle(
        smollm2, tt, _requests(smollm2, positions=("all", "S2"), units=units), atol=1e-4
    )
    # pairs x directions x positions x units: z, q, pattern 3 each; k, v 2 KV heads (group) +
    # 3 query heads (head)
    assert n == 2 * 2 * 2 * (3 + 3 + 3 + 2 * (2 + 3))
