"""headscope's path patching against the independent oracle (tests/circuits/path_oracle.py, which
imports nothing from headscope): every (sender, receiver) of a task, batched with padding in
headscope, one unpadded prompt at a time in the oracle, to 1e-4 (docs/circuits.md)."""

from __future__ import annotations

import copy

import pytest
import torch

from headscope.circuits.path_patching import Receiver, path_patching, senders_below
from headscope.effects.patching import make_batches
from tests.circuits import path_oracle as po
from tests.patch_helpers import random_task

TOL = 1e-4


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sharp_gpt2(tiny_gpt2):
    """Tiny GPT-2 with its attention scaled up (at init a head moves the logits by ~1e-6)."""
    import headscope

    hf = copy.deepcopy(tiny_gpt2.hf)
    with torch.no_grad():
        for block in hf.transformer.h:
            block.attn.c_attn.weight.mul_(15.0)
            block.attn.c_proj.weight.mul_(15.0)
    return headscope.load_model(hf, tiny_gpt2.tokenizer, name="tiny-gpt2-sharp")


def _oracle(model, tt, i, direction, sender, r, freeze, sender_position):
    base, src = (
        (tt.clean[i], tt.corrupt[i]) if direction == "noising" else (tt.corrupt[i], tt.clean[i])
    )

    def pos(p):
        if p == "all":
            return None
        name, _, shift = p.partition("+")
        return [tt.positions[name][i] + int(shift or 0)]

    receiver = ("logits",) if r.kind == "logits" else (r.kind, r.layer, r.head)
    return po.path_patched_metric(
        model.hf,
        model.n_heads,
        base,
        src,
        sender,
        receiver,
        tt.metric,
        tt.answer[i],
        tt.wrong[i],
        freeze_mlps=freeze,
        sender_positions=pos(sender_position),
        receiver_positions=None if r.kind == "logits" else pos(r.position),
    )


COMBOS = (("noising", False), ("noising", True), ("denoising", False), ("denoising", True))


def _compare(
    model, tt, receivers, senders=None, sender_position="all", batch_size=3, combos=COMBOS
):
    batches = make_batches(tt, batch_size, model.pad_id)
    below = senders_below(model, receivers)
    paths = [
        (s, r)
        for r in receivers
        for s in (senders or below[r])
        if r.kind == "logits" or s[0] < r.layer
    ]
    worst, moved = 0.0, 0.0
    for direction, freeze in combos:
        got = path_patching(
            model,
            batches,
            len(tt),
            tt.metric,
            paths,
            direction,
            freeze,
            sender_position=sender_position,
        )
        base = {"noising": tt.clean, "denoising": tt.corrupt}[direction]
        for s, r in paths:
            for i in range(len(tt)):
                want = _oracle(model, tt, i, direction, s, r, freeze, sender_position)
                err = abs(float(got[(s, r)][i]) - want) / max(1.0, abs(want))
                worst = max(worst, err)
                assert err <= TOL, (model.name, direction, freeze, s, r.name, i, err)
                plain = po.path_patched_metric(
                    model.hf,
                    model.n_heads,
                    base[i],
                    base[i],
                    s,
                    ("logits",),
                    tt.metric,
                    tt.answer[i],
                    tt.wrong[i],
                )
                moved = max(moved, abs(want - plain))
    assert moved > 1e-3, (model.name, moved)  # the patches move the metric
    return worst


def test_matches_the_oracle_on_tiny_models(sharp_gpt2, tiny_gqa_llama, tiny_gemma3_dir):
    import headscope

    gemma = headscope.load_model(str(tiny_gemma3_dir))  # q/k norms, a sliding window of 4
    for model in (sharp_gpt2, tiny_gqa_llama, gemma):
        tt = random_task(model, n_pairs=4, lengths=[9, 7, 9, 8])  # padding inside a batch
        top = model.n_layers - 1
        receivers = [
            Receiver("logits"),
            Receiver("q", top, 0),
            Receiver("k", top, model.n_heads - 1, "X"),
            Receiver("v", top, 1 % model.n_heads),
        ]
        _compare(model, tt, receivers)
        # a sender at X reaches the last position only through a key or value read at X
        _compare(model, tt, [receivers[2], Receiver("v", top, 0, "X")], sender_position="X")


@pytest.mark.real
def test_matches_the_oracle_on_smollm2(smollm2):
    from headscope.probes.kits import resolve_task

    model = smollm2
    tt = resolve_task("ioi", model, None, 2, 0).tokenize(model)
    receivers = [
        Receiver("logits"),
        Receiver("q", 9, 1, "END"),
        Receiver("k", 9, 4, "S1+1"),
        Receiver("v", 9, 7, "S2"),
    ]
    senders = [(0, 3), (4, 2), (8, 6), (23, 3)]
    combos = (("noising", False), ("denoising", True))
    worst = _compare(model, tt, receivers, senders, combos=combos)
    print(f"smollm2: worst relative difference {worst:.2e}")
