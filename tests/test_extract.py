"""Streaming extraction on tiny random models: exact against a full pattern cache, padding-safe,
no hook or cached pattern left behind."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.extract import pad_batch, pattern_batch, score_probe
from headscope.metrics import REGISTRY
from headscope.probes import Probe


def full_patterns(model, ids: list[int]) -> list[torch.Tensor]:
    """Every layer's pattern for one unpadded sequence, the slow way (kept in memory)."""
    pats = {}

    def keep(layer, p):
        pats[layer] = p.clone()

    model.run_patterns(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool), keep)
    return [pats[layer] for layer in range(model.n_layers)]


def reference_scores(model, probe: Probe) -> dict[str, torch.Tensor]:
    """Per metric [layer, head] scores, one sequence at a time, from full patterns."""
    totals, counts = {}, {}
    for ids in probe.sequences:
        tokens, mask, lengths = pad_batch([ids], model.pad_id)
        b = pattern_batch(model, probe, tokens, mask, lengths)
        pats = full_patterns(model, ids)
        for m in REGISTRY.values():
            if m.probe != probe.name:
                continue
            for layer, p in enumerate(pats):
                r = m(p, b)
                totals.setdefault(m.name, torch.zeros(model.n_layers, model.n_heads, dtype=torch.float64))
                totals[m.name][layer] += r.total[0]
            counts[m.name] = counts.get(m.name, 0) + r.count.item()
    return {k: totals[k] / counts[k] for k in totals}


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_bert"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_streaming_scores_match_one_sequence_at_a_time(fixture, batch_size, request):
    model = request.getfixturevalue(fixture)
    probes = headscope.default_probes(model, n_prompts=5, repeat_len=6, seed=3)
    for probe in probes:
        got = score_probe(model, probe, list(REGISTRY.values()), batch_size=batch_size)
        want = reference_scores(model, probe)
        for name, res in got.items():
            torch.testing.assert_close(res.score, want[name], atol=1e-5, rtol=0, equal_nan=True)


def test_text_probe_has_varied_lengths_so_padding_is_exercised(tiny_gpt2):
    probe = headscope.default_probes(tiny_gpt2, n_prompts=5)[0]
    assert len({len(s) for s in probe.sequences}) > 1


def test_no_hook_and_no_cached_pattern_left_behind(tiny_gpt2):
    bridge = tiny_gpt2.bridge

    def n_hooks():
        return sum(len(hp._forward_hooks) for hp in bridge.hook_dict.values())

    before = n_hooks()
    probe = headscope.default_probes(tiny_gpt2, n_prompts=3)[0]
    score_probe(tiny_gpt2, probe, list(REGISTRY.values()), batch_size=2)
    assert n_hooks() == before
    for blk in bridge.blocks:
        assert getattr(blk.attn, "_pattern", None) is None

    # a failing callback must not leave hooks either
    def boom(layer, p):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        tiny_gpt2.run_patterns(torch.tensor([[0, 5, 6]]), torch.ones(1, 3, dtype=torch.bool), boom)
    assert n_hooks() == before


def test_forward_stops_after_last_wanted_layer(tiny_gpt2):
    seen = []
    tiny_gpt2.run_patterns(torch.tensor([[0, 5, 6]]), torch.ones(1, 3, dtype=torch.bool),
                           lambda layer, p: seen.append(layer), layers=[0])
    assert seen == [0]
    # the MLP of the last block never ran: hook_mlp_out would fire otherwise
    fired = []
    bridge = tiny_gpt2.bridge
    bridge.blocks[0].hook_mlp_out.add_hook(lambda t, hook: fired.append(hook.name))
    try:
        tiny_gpt2.run_patterns(torch.tensor([[0, 5, 6]]), torch.ones(1, 3, dtype=torch.bool),
                               lambda layer, p: None, layers=[0])
    finally:
        bridge.blocks[0].hook_mlp_out.remove_hooks()
    assert fired == []


def test_patterns_are_post_softmax_and_causal(tiny_gpt2, tiny_bert):
    for model in (tiny_gpt2, tiny_bert):
        p = full_patterns(model, model.wrap([5, 6, 7, 8]))[0]  # [1, head, q, k]
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
        upper = torch.triu(torch.ones(p.shape[-2:], dtype=torch.bool), 1)
        if model.causal:
            assert p[..., upper].abs().max() == 0
        else:
            assert p[..., upper].abs().max() > 0


def test_batch_size_zero_is_refused(tiny_gpt2):
    probe = headscope.default_probes(tiny_gpt2, n_prompts=2)[0]
    with pytest.raises(headscope.HeadscopeError, match="batch-size"):
        score_probe(tiny_gpt2, probe, list(REGISTRY.values()), batch_size=0)
