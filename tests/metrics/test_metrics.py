"""Properties every registered metric shares (headscope/metrics/__init__.py): one module per
behaviour, padding never counts, query blocks add up to the whole, the pattern is never written.

Each metric's own closed-form cases live in ``test_<metric>.py``; the selectors in ``test_base.py``.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from headscope.metrics import REGISTRY, PatternBatch, default_metrics, uniform_pattern
from tests.metrics.patterns import causal_uniform, random_causal

NAMES = [
    "previous_token",
    "next_token",
    "sink",
    "separator",
    "punctuation",
    "entropy",
    "induction",
    "duplicate_token",
]


def test_every_behaviour_is_registered_from_its_own_module():
    assert [m.name for m in default_metrics()] == NAMES  # registration order is the report's order
    for m in default_metrics():
        name = m.name
        module = importlib.import_module(f"headscope.metrics.{name}")
        assert module.METRIC is m and m.name == name and m.fn is getattr(module, name)
        assert m.definition and m.label and m.threshold == m.threshold
        assert m.probe == ("repeat" if name in ("induction", "duplicate_token") else "text")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "name", ["previous_token", "next_token", "sink", "separator", "punctuation", "entropy"]
)
def test_padding_gives_same_scores_as_unpadded(name, causal):
    """A sequence padded to a longer batch must score exactly as it does alone."""
    g = torch.Generator().manual_seed(1)
    n, pad = 5, 3
    logits = torch.randn(1, 2, n, n, generator=g)
    if causal:
        logits = logits.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), -torch.inf)
    A = logits.softmax(-1)
    flags = torch.tensor([[False, True, False, True, False]])
    m = REGISTRY[name]
    alone = m(A, PatternBatch(torch.tensor([n]), causal, separator=flags, punctuation=flags))
    # pad with garbage that must be ignored: rows and columns past n
    big = torch.rand(1, 2, n + pad, n + pad, generator=g)
    big[..., :n, :n] = A
    big[..., :n, n:] = 0.0  # what a masked softmax gives real queries
    # padded flags ignored too
    flags_big = torch.cat([flags, torch.ones(1, pad, dtype=torch.bool)], 1)
    padded = m(
        big, PatternBatch(torch.tensor([n]), causal, separator=flags_big, punctuation=flags_big)
    )
    assert padded.count.item() == alone.count.item()
    torch.testing.assert_close(padded.total, alone.total, equal_nan=True)


@pytest.mark.parametrize("name", ["induction", "duplicate_token"])
def test_repeat_metrics_ignore_padding(name):
    L, pad = 3, 2
    n = 2 * L + 1
    A = random_causal(1, 2, n, seed=4)
    big = torch.rand(1, 2, n + pad, n + pad)
    big[..., :n, :n] = A
    big[..., :n, n:] = 0.0
    alone = REGISTRY[name](A, PatternBatch(torch.tensor([n]), True, repeat_len=L))
    padded = REGISTRY[name](big, PatternBatch(torch.tensor([n]), True, repeat_len=L))
    assert padded.count.item() == alone.count.item() == L
    torch.testing.assert_close(padded.total, alone.total)


def test_blocked_queries_sum_to_the_full_pattern():
    """Splitting the query axis into blocks (q_start) gives the same totals: the long-context
    path."""
    g = torch.Generator().manual_seed(2)
    n, L = 9, 4
    A = random_causal(2, 3, n, seed=2)
    flags = torch.rand(2, n, generator=g) > 0.5
    lengths = torch.tensor([n, n - 2])
    for m in REGISTRY.values():
        full = m(A, PatternBatch(lengths, True, separator=flags, punctuation=flags, repeat_len=L))
        parts = [
            m(
                A[:, :, s : s + 4],
                PatternBatch(
                    lengths, True, q_start=s, separator=flags, punctuation=flags, repeat_len=L
                ),
            )
            for s in range(0, n, 4)
        ]
        torch.testing.assert_close(sum(p.total for p in parts), full.total, equal_nan=True)
        torch.testing.assert_close(sum(p.count for p in parts), full.count)


def test_metrics_never_write_into_the_pattern():
    A = causal_uniform(6).repeat(1, 2, 1, 1)
    before = A.clone()
    flags = torch.ones(1, 6, dtype=torch.bool)
    for m in REGISTRY.values():
        m(
            A,
            PatternBatch(torch.tensor([6]), True, separator=flags, punctuation=flags, repeat_len=2),
        )
    assert torch.equal(A, before)


@pytest.mark.parametrize("causal", [True, False])
def test_every_metric_has_a_chance_value_in_range(causal):
    """A uniform head gives each metric its chance value: a probability, or for entropy up to
    ln(n)."""
    n = 7
    flags = torch.tensor([[False, True, False, False, True, False, True]])
    b = PatternBatch(torch.tensor([n]), causal, separator=flags, punctuation=flags, repeat_len=3)
    U = uniform_pattern((1, 1, n, n), b)
    for m in default_metrics():
        name = m.name
        s = m(U, b).score().item()
        if name == "next_token" and causal:
            assert s != s  # NaN by construction
        elif name == "entropy":
            assert 0 < s <= math.log(n) + 1e-6  # ln n: uniform over all n keys
        else:
            assert 0 < s < 1, name
