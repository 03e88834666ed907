"""Streaming extraction on tiny random models: exact against full patterns one sequence at a time,
padding-safe, and shards of a probe that pool to the whole."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.engines.extract import auto_batch_size, pad_batch, pattern_batch, score_probe
from headscope.metrics import REGISTRY
from headscope.result import Probe


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
        b = pattern_batch(model, probe, tokens, mask, lengths, metrics=list(REGISTRY.values()))
        pats = full_patterns(model, ids)
        for m in REGISTRY.values():
            if m.probe != probe.name:
                continue
            for layer, p in enumerate(pats):
                r = m(p, b)
                totals.setdefault(
                    m.name, torch.zeros(model.n_layers, model.n_heads, dtype=torch.float64)
                )
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
    with pytest.raises(
        headscope.HeadscopeError,
        match=r"batch_size \(--batch-size\) must be at "
        r"least 1",
    ):
        score_probe(tiny_gpt2, probe, list(REGISTRY.values()), batch_size=0)


def test_shards_of_a_probe_pool_to_the_whole(tiny_gpt2):
    """Sums and counts are order-free: scoring two halves and adding gives the whole (Ray sharding).
    One sequence a forward, so every sequence meets the same float32 arithmetic in both runs."""
    metrics = list(REGISTRY.values())
    for probe in headscope.default_probes(tiny_gpt2, n_prompts=6, repeat_len=5, seed=4):
        whole = score_probe(tiny_gpt2, probe, metrics, batch_size=1)
        halves = [Probe(probe.name, probe.sequences[i::2], probe.repeat_len) for i in (0, 1)]
        a, b = (score_probe(tiny_gpt2, h, metrics, batch_size=1) for h in halves)
        for name, res in whole.items():
            merged = sum([a[name], b[name]])  # sum() starts from 0
            torch.testing.assert_close(merged.score, res.score, atol=1e-12, rtol=0, equal_nan=True)
            assert merged.count == res.count and merged.chance == pytest.approx(
                res.chance, nan_ok=True
            )
    with pytest.raises(ValueError, match="Cannot pool"):
        a["induction"] + a["duplicate_token"]


def test_auto_batch_size_shrinks_with_length(tiny_gpt2):
    assert auto_batch_size(tiny_gpt2, 64) == 64 and auto_batch_size(tiny_gpt2, 4096) == 1
    assert auto_batch_size(tiny_gpt2, 512) == 8  # ~4k tokens a batch
    assert auto_batch_size(tiny_gpt2, 128, budget_bytes=1) == 1
