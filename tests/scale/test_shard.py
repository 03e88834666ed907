"""Sharding by whole batches, merged in plan order, equals the plain scan bit for bit (no Ray)."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.engines.extract import PunctuationTable, score_batch, score_probe
from headscope.errors import HeadscopeError
from headscope.metrics import REGISTRY
from headscope.scale.shard import ShardedScorer, deal, merge, plan_batches


def in_process(model):
    """Batches scored in reverse order, as if by many workers finishing out of order."""

    def run(probe, metrics, batches, engine, interventions, on_batch):
        eng = headscope.get_engine(engine)
        punct = PunctuationTable(model)
        return [
            score_batch(model, probe, metrics, b, eng, interventions, punct)
            for b in reversed(batches)
        ]

    return run


def same(x, y) -> bool:
    """Equal bit for bit (NaN where the other is NaN: next_token on a causal model)."""
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    return x.shape == y.shape and bool(((x == y) | (x.isnan() & y.isnan())).all())


def assert_identical(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert same(a[name].total, b[name].total), name
        assert a[name].count == b[name].count
        assert same(a[name].chance_total, b[name].chance_total)
        assert same(a[name].seq_total, b[name].seq_total)
        assert same(a[name].seq_count, b[name].seq_count)


@pytest.mark.parametrize("engine", ["fused", "blocked", "hooks"])
def test_sharded_equals_plain_bit_for_bit(tiny_gpt2, engine):
    metrics = list(REGISTRY.values())
    for probe in headscope.default_probes(tiny_gpt2, n_prompts=7, repeat_len=6):
        want = score_probe(tiny_gpt2, probe, metrics, batch_size=3, engine=engine)
        got = ShardedScorer(in_process(tiny_gpt2))(
            tiny_gpt2, probe, metrics, batch_size=3, engine=engine
        )
        assert_identical(got, want)


def test_encoder_with_token_types(tiny_bert):
    metrics = list(REGISTRY.values())
    probe = headscope.text_probe(tiny_bert, n_prompts=5, token_types=True)
    want = score_probe(tiny_bert, probe, metrics, batch_size=2)
    assert_identical(
        ShardedScorer(in_process(tiny_bert))(tiny_bert, probe, metrics, batch_size=2), want
    )


def test_merge_counts_each_batch_once(tiny_gpt2):
    metrics = [REGISTRY["induction"]]
    probe = headscope.repeat_probe(tiny_gpt2, repeat_len=5, n_sequences=4)
    batches = plan_batches(probe, 2)
    parts = in_process(tiny_gpt2)(probe, metrics, batches, "blocked", (), None)
    with pytest.raises(HeadscopeError, match="came back twice"):
        merge(tiny_gpt2, probe, metrics, batches, [*parts, parts[0]])
    with pytest.raises(HeadscopeError, match="Batch 1 of the repeat probe never came back"):
        merge(tiny_gpt2, probe, metrics, batches, [p for p in parts if p.index != batches[1]])


def test_plan_and_deal():
    probe = headscope.Probe("text", [[1] * n for n in (5, 1, 3, 3, 2)])
    assert plan_batches(probe, 2) == [[1, 4], [2, 3], [0]]
    assert deal(plan_batches(probe, 2), 2) == [[0, 2], [1]]
    with pytest.raises(HeadscopeError, match="at least 1"):
        plan_batches(probe, 0)
