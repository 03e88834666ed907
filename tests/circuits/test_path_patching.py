"""Path patching: closed forms and exact identities (the independent oracle's comparison is in
tests/circuits/test_path_oracle_agreement.py).

* a sender patched with its base run's own output changes nothing, bit for bit;
* ``logits`` with a last-layer sender is a plain head-output patch (nothing after it is a head);
* with MLPs and the final norm frozen, the direct path of a head is its direct logit attribution
  (both are then the same linear map of the head's output);
* the first-order estimate is the derivative of the exact path effect in the dose (float64);
* bad input: one line.
"""

from __future__ import annotations

import pytest
import torch

from headscope.circuits.path_attribution import path_attribution
from headscope.circuits.path_patching import (
    Cost,
    Receiver,
    ReceiverGroup,
    check_paths,
    one_at_a_time_cost,
    path_patching,
    senders_below,
)
from headscope.effects.logit_attribution import direct_logit_attribution, final_norm
from headscope.effects.patching import Request, exact_patching, make_batches
from headscope.errors import HeadscopeError
from headscope.probes.tasks import TokenizedTask
from tests.patch_helpers import float64_copy, random_task


def _own(tt: TokenizedTask) -> TokenizedTask:
    """The task with corrupt = clean: every source activation is the base run's own."""
    return TokenizedTask(
        tt.name, tt.clean, [list(c) for c in tt.clean], tt.answer, tt.wrong, tt.positions
    )


def _all_paths(model, kinds=("q", "k", "v"), position="all"):
    receivers = [Receiver("logits")] + [
        Receiver(k, la, h, position)
        for la in range(1, model.n_layers)
        for h in range(model.n_heads)
        for k in kinds
    ]
    top = model.n_layers - 1  # a group: two heads of the last layer and one below it
    receivers.append(
        ReceiverGroup((Receiver("q", top, 0), Receiver("q", top, 1), Receiver("q", top - 1, 2)))
    )
    by = senders_below(model, receivers)
    return [(s, r) for r in receivers for s in by[r]]


@pytest.mark.parametrize("freeze", [False, True])
def test_a_sender_patched_with_its_own_output_changes_nothing(tiny_gpt2, tiny_gqa_llama, freeze):
    for model in (tiny_gpt2, tiny_gqa_llama):
        tt = _own(random_task(model, n_pairs=5, lengths=[9, 9, 7, 9, 8]))
        batches = make_batches(tt, 3, model.pad_id)  # padding inside a batch too
        paths = _all_paths(model)
        for direction in ("noising", "denoising"):
            base: dict = {}
            got = path_patching(
                model, batches, len(tt), tt.metric, paths, direction, freeze, baseline=base
            )
            assert set(got) == set(paths)
            for key, m in got.items():
                assert torch.equal(m, base["clean"]), (model.name, key)


def test_logits_with_a_last_layer_sender_is_a_head_output_patch(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=6)
    batches = make_batches(tt, 3, model.pad_id)
    last = model.n_layers - 1
    paths = [((last, h), Receiver("logits")) for h in range(model.n_heads)]
    for direction in ("noising", "denoising"):
        got = path_patching(model, batches, len(tt), tt.metric, paths, direction)
        units = tuple((last, h) for h in range(model.n_heads))
        ref = exact_patching(
            model, batches, len(tt), tt.metric, [Request(direction, "z", "head", ("all",), units)]
        )
        for h in range(model.n_heads):
            want = ref[(direction, "z", "head", "all", last, h)]
            torch.testing.assert_close(
                got[((last, h), Receiver("logits"))], want, atol=1e-5, rtol=0
            )


class _FrozenRMSNorm(torch.nn.Module):
    """A final RMSNorm whose scale is fixed per row and position (that of a recorded run) on
    inputs of that run's shape; an ordinary RMSNorm on others (DLA reads the gain off a constant
    vector)."""

    def __init__(self, norm, scale):
        super().__init__()
        self.norm, self.weight, self.scale = norm, norm.weight, scale  # scale: [rows, pos, 1]

    def forward(self, x):
        if x.shape[:-1] != self.scale.shape[:-1]:
            return self.norm(x)
        return x * self.weight / self.scale.to(x.dtype)


def test_the_direct_path_with_frozen_mlps_and_norm_is_the_direct_logit_attribution(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=4, seed=3)
    batches = make_batches(tt, 4, model.pad_id)  # one batch: the frozen scale's rows are its rows
    norm = final_norm(model)
    seen = {}
    h = norm.register_forward_hook(
        lambda m, a, y: seen.setdefault("s", (a[0] * m.weight / y).mean(-1, keepdim=True))
    )
    try:
        model.run(batches[0].clean, batches[0].mask, output="hidden")
    finally:
        h.remove()
    frozen = _FrozenRMSNorm(norm, seen["s"].detach())
    model.hf.model.norm = frozen
    try:
        senders = [(la, hd) for la in range(model.n_layers) for hd in range(model.n_heads)]
        paths = [(s, Receiver("logits")) for s in senders]
        base: dict = {}
        got = path_patching(
            model,
            batches,
            len(tt),
            tt.metric,
            paths,
            "noising",
            freeze_mlps=True,
            rows_per_forward=len(tt),
            baseline=base,
        )
        dla = {
            p: direct_logit_attribution(model, batches, len(tt), p) for p in ("clean", "corrupt")
        }
    finally:
        model.hf.model.norm = norm
    moved = 0
    for (la, hd), r in paths:
        want = dla["corrupt"][:, la, hd] - dla["clean"][:, la, hd]
        moved += int((want.abs() > 1e-3).sum())
        torch.testing.assert_close(got[((la, hd), r)] - base["clean"], want, atol=2e-5, rtol=1e-4)
    assert moved > len(paths)  # not a comparison of zeros


def test_the_first_order_estimate_is_the_derivative_of_the_exact_effect(tiny_gqa_llama):
    model = float64_copy(tiny_gqa_llama)
    tt = random_task(model, n_pairs=3, seed=5)
    batches = make_batches(tt, 3, model.pad_id)
    receivers = [
        Receiver("logits"),
        Receiver("q", 2, 1),
        Receiver("k", 2, 3, "X"),
        Receiver("v", 1, 0),
        ReceiverGroup((Receiver("v", 2, 0), Receiver("v", 2, 2, "X"), Receiver("v", 1, 1))),
    ]
    by = senders_below(model, receivers)
    paths = [(s, r) for r in receivers for s in by[r]]
    eps = 1e-5
    for freeze in (False, True):
        for direction in ("noising", "denoising"):
            base: dict = {}
            exact = path_patching(
                model, batches, len(tt), tt.metric, paths, direction, freeze, t=eps, baseline=base
            )
            est = path_attribution(model, batches, len(tt), tt.metric, paths, direction, freeze)
            m0 = base["clean" if direction == "noising" else "corrupt"]
            big = 0
            for key in paths:
                fd = (exact[key] - m0) / eps
                torch.testing.assert_close(est[key], fd, atol=1e-4, rtol=1e-3)
                big += int((fd.abs() > 1e-3).sum())
            assert big > len(paths), (freeze, direction)  # most of 3 pairs x paths carry something


def test_patching_all_senders_costs_fewer_forwards_than_one_at_a_time(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=4)
    batches = make_batches(tt, 4, model.pad_id)
    r = Receiver("k", 2, 0)
    paths = [(s, r) for s in senders_below(model, [r])[r]]
    cost = Cost()
    path_patching(model, batches, len(tt), tt.metric, paths, cost=cost)
    one = one_at_a_time_cost(model, len(tt), len(paths))
    assert cost.forwards < one.forwards
    # 2 cached runs; step 2: senders of layer 0 (3 blocks), of layer 1 (2); step 3: 1 block
    H, L, b = model.n_heads, model.n_layers, len(tt)
    assert cost.block_rows == 2 * b * L + H * b * 3 + H * b * 2 + 2 * H * b * 1


def test_bad_input_gets_one_line(tiny_gqa_llama):
    model = tiny_gqa_llama
    with pytest.raises(HeadscopeError, match="not below receiver L1H0.q"):
        check_paths(model, [(1, 2)], [Receiver("q", 1, 0)])
    with pytest.raises(HeadscopeError, match="Unknown receiver input 'key'"):
        Receiver.parse("L2H0.key")
    with pytest.raises(HeadscopeError, match="outside"):
        check_paths(model, [(0, 0)], [Receiver("q", 7, 0)])
    with pytest.raises(HeadscopeError, match="Cannot read receiver"):
        Receiver.parse("L2.q")
    assert Receiver.parse("L2H1.k@S2") == Receiver("k", 2, 1, "S2")
    assert Receiver.parse(Receiver("v", 3, 0, "END").name) == Receiver("v", 3, 0, "END")
