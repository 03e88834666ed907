"""Notebook 05's helpers: per-sequence induction scores against the scan-checked batch version,
resumed single-head ablations against plain ablated forwards, and resample ablation against a
plain transformers computation (forward hooks on the output projection, no headscope code)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope
from headscope.effects.ablation import head_means
from headscope.errors import HeadscopeError
from headscope.models.attention import ReplaceHeadOutput
from lib import controls
from lib import weight_importance as wi
from tests.circuits.path_oracle import _eager, out_proj


def test_sequence_induction_averages_to_the_checked_scores(tiny_gpt2):
    model = tiny_gpt2
    probe = headscope.repeat_probe(model, repeat_len=6, n_sequences=4, seed=3)
    layers = list(range(model.n_layers))
    for ivs in ([], [ReplaceHeadOutput(0, 1, 0.0)]):
        per = wi.sequence_induction(model, probe, layers, ivs)
        assert per.shape == (4, model.n_layers, model.n_heads)
        want = controls.induction_scores(model, probe, layers, ivs)  # checked against the scan
        np.testing.assert_allclose(per.mean(0), want, atol=1e-6)
    assert per.std(0).max() > 0  # sequences differ: an interval has something to show


def test_resumed_ablations_equal_plain_ablated_forwards(tiny_gqa_llama):
    model = tiny_gqa_llama
    probe = headscope.repeat_probe(model, repeat_len=5, n_sequences=3, seed=0)
    means = head_means(model, probe, batch_size=3)
    last = model.n_layers - 1
    receivers = [(last, h) for h in range(model.n_heads)]
    heads = [(0, 1), (1, 3), (0, 2)]
    values = {(0, 1): means[0, 1], (1, 3): 0.0, (0, 2): means[0, 2]}
    clean, got = wi.ablation_induction(model, probe, heads, values, receivers)
    np.testing.assert_allclose(clean, wi.sequence_induction(model, probe, [last])[:, 0], atol=1e-9)
    for hd in heads:
        want = wi.sequence_induction(model, probe, [last], [ReplaceHeadOutput(*hd, values[hd])])
        np.testing.assert_allclose(got[hd], want[:, 0], atol=1e-6)
        assert not np.allclose(got[hd], clean)  # the ablation reaches the receivers
    with pytest.raises(HeadscopeError, match="not below the receivers"):
        wi.ablation_induction(model, probe, [(last, 0)], {(last, 0): 0.0}, receivers)


def _plain_resampled_logits(hf, n_heads: int, tokens: torch.Tensor, layer: int, head: int):
    """Resample ablation by hand: record the output projection's input on a clean run, then run
    again with head ``head``'s slice of it taken from the previous sequence of the batch."""
    proj = out_proj(hf, layer)
    kept = {}

    def keep(_mod, args):
        kept["x"] = args[0].detach().clone()

    with _eager(hf), torch.no_grad():
        h = proj.register_forward_pre_hook(keep)
        hf(tokens)
        h.remove()
        x = kept["x"]  # [batch, pos, n_heads * dim], head-major
        d = x.shape[-1] // n_heads
        part = slice(head * d, (head + 1) * d)

        def swap(_mod, args):
            y = args[0].clone()
            y[..., part] = torch.roll(x[..., part], 1, dims=0)
            return (y,)

        h = proj.register_forward_pre_hook(swap)
        try:
            return hf(tokens).logits
        finally:
            h.remove()


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_gqa_llama"])
def test_resample_ablation_matches_a_plain_transformers_computation(fixture, request):
    model = request.getfixturevalue(fixture)
    probe = headscope.repeat_probe(model, repeat_len=5, n_sequences=4, seed=1)
    tokens = torch.tensor(probe.sequences)
    layer, head = 0, 1
    iv = wi.resample_ablation(model, probe, (layer, head))
    assert iv.value.shape[0] == len(probe)  # a per-position value for every sequence
    got = model.run(tokens, interventions=[iv], output="logits")
    want = _plain_resampled_logits(model.hf, model.n_heads, tokens, layer, head)
    np.testing.assert_allclose(got.double().numpy(), want.double().numpy(), atol=1e-4)
    clean = model.run(tokens, output="logits")
    assert (got - clean).abs().max() > 1e-3  # the swap changed something


def test_resampled_output_and_bootstrap_mean():
    z = torch.arange(8.0).view(4, 1, 2)
    r = wi.resampled_output(z, shift=1)
    assert torch.equal(r[1], z[0]) and torch.equal(r[0], z[3])
    with pytest.raises(HeadscopeError, match="at least 2"):
        wi.resampled_output(z[:1])
    assert wi.bootstrap_mean([0.25] * 5) == (0.25, 0.25, 0.25)
    v, lo, hi = wi.bootstrap_mean(np.arange(20.0), resamples=500)
    assert v == 9.5 and lo < v < hi
