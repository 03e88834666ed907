"""The batch context of a metric (headscope/metrics/context.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from headscope.metrics import PatternBatch


def test_defaults():
    b = PatternBatch(lengths=torch.tensor([3]), causal=True)
    assert (b.q_start, b.separator, b.punctuation, b.repeat_len) == (0, None, None, None)


def test_to_keeps_every_field():
    flags = torch.tensor([[False, True, False]])
    b = PatternBatch(
        lengths=torch.tensor([3]),
        causal=False,
        q_start=2,
        separator=flags,
        punctuation=~flags,
        repeat_len=1,
        reach=5,
    )
    moved = b.to("cpu")
    assert [f.name for f in dataclasses.fields(moved)] == [
        "lengths",
        "causal",
        "q_start",
        "separator",
        "punctuation",
        "repeat_len",
        "reach",
        "band",
        "targets",
        "key_counts",
    ]
    assert (moved.causal, moved.q_start, moved.repeat_len, moved.reach) == (False, 2, 1, 5)
    assert torch.equal(moved.lengths, b.lengths) and torch.equal(moved.separator, flags)
    assert torch.equal(moved.punctuation, ~flags)
    none = PatternBatch(lengths=torch.tensor([3]), causal=True).to("cpu")
    assert none.separator is None and none.punctuation is None


def test_frozen():
    b = PatternBatch(lengths=torch.tensor([3]), causal=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.q_start = 1
    assert dataclasses.replace(b, q_start=4).q_start == 4 and b.q_start == 0
