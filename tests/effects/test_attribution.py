"""Attribution patching: the first-order estimate is the derivative of the target along the
ablation, checked by a finite difference through an independent interpolating intervention."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import headscope
from headscope.effects.ablation import head_means
from headscope.effects.attribution import attribution_effects
from headscope.effects.targets import TARGETS, measure


@dataclass(frozen=True)
class Nudge:
    """Move head ``head`` of layer ``layer`` a fraction ``eps`` of the way to ``value``."""

    layer: int
    head: int
    value: torch.Tensor
    eps: float

    def before(self, call):
        return call

    def after(self, call, out):
        if call.layer != self.layer:
            return out
        out = out.clone()  # [batch, query, head, dim]
        out[:, :, self.head] += self.eps * (self.value.to(out.dtype) - out[:, :, self.head])
        return out


def _pooled(model, probe, target, interventions=()):
    """The target pooled over the probe, one sequence at a time."""
    s = c = 0.0
    for ids in probe.sequences:
        tokens = torch.tensor([ids])
        out = model.run(tokens, interventions=interventions, output="logits")
        total, count = measure(target, out, tokens, torch.tensor([len(ids)]), probe.repeat_len)
        s, c = s + float(total.sum()), c + float(count.sum())
    return s / c


@pytest.fixture(scope="module")
def tiny_gpt2_fp64():
    """A tiny GPT-2 in float64 (in memory), so a finite difference is not float32 noise."""
    from tests.tiny_models import tiny_gpt2_in_memory

    hf, tok = tiny_gpt2_in_memory()
    return headscope.load_model(hf.double(), tok)


@pytest.mark.parametrize("target_name", ["repeat_loss", "text_loss"])
def test_attribution_is_the_derivative_along_the_ablation(tiny_gpt2_fp64, target_name):
    model, target = tiny_gpt2_fp64, TARGETS[target_name]
    probe = headscope.default_probes(model, n_prompts=3, repeat_len=6, seed=3)[
        target.probe == "repeat"
    ]
    means = head_means(model, probe, batch_size=2)
    per_seq, counts, pass_means = attribution_effects(model, probe, target, None, batch_size=2)
    # the same pass gives the means
    torch.testing.assert_close(pass_means, means.double(), atol=1e-7, rtol=0)
    assert (
        per_seq.shape == (len(probe), 2, 4) and counts.shape == (len(probe),) and (counts > 0).all()
    )
    estimate = per_seq.sum(0) / counts.sum()  # the pooled estimate
    given, _, _ = attribution_effects(model, probe, target, means, batch_size=3)
    torch.testing.assert_close(given.sum(0) / counts.sum(), estimate, atol=1e-6, rtol=1e-5)
    eps = 1e-4
    for layer, head in [(0, 1), (1, 3)]:
        up = _pooled(model, probe, target, [Nudge(layer, head, means[layer, head], eps)])
        down = _pooled(model, probe, target, [Nudge(layer, head, means[layer, head], -eps)])
        slope = (up - down) / (2 * eps)  # central difference: d target / d eps at 0
        assert float(estimate[layer, head]) == pytest.approx(slope, rel=1e-4, abs=1e-9)


def test_encoders_have_no_first_order_embedding_effect(tiny_bert):
    text = headscope.default_probes(tiny_bert, n_prompts=2)[0]
    with pytest.raises(headscope.HeadscopeError, match="zero to first order"):
        attribution_effects(tiny_bert, text, TARGETS["embedding"], 0.0, batch_size=2)
