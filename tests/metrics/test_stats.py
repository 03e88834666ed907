"""Per-row statistics standing in for a pattern (headscope/metrics/stats.py): built here by hand
from q and k,
they answer every metric exactly as the dense pattern does."""

from __future__ import annotations

import pytest
import torch

from headscope.metrics import REGISTRY, PatternBatch
from headscope.metrics.base import key_set_flags
from headscope.metrics.rows import Rows
from headscope.metrics.stats import HeadStats

B, H, KVH, N, D = 2, 4, 2, 6, 3


def make(causal: bool, mask: torch.Tensor | None = None, seed: int = 0):
    """(HeadStats, dense pattern [b, h, q, k], batch) for random q, k with grouped key heads."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g)
    k = torch.randn(B, KVH, N, D, generator=g)
    s = q @ k.repeat_interleave(H // KVH, dim=1).transpose(-1, -2)  # [b, h, q, k]
    allowed = torch.ones(B, N, N, dtype=torch.bool)
    if causal:
        allowed &= torch.tril(torch.ones(N, N, dtype=torch.bool))
    if mask is not None:
        allowed &= mask
    s = s.masked_fill(~allowed[:, None], -torch.inf)
    lse = torch.logsumexp(s, -1).double()  # -inf for a row that sees nothing
    A = torch.nan_to_num(s.softmax(-1), nan=0.0)
    flags = torch.rand(B, N, generator=g) > 0.4
    targets = torch.full((B, N), -1)
    # needle answer queries -> the keys they copy
    targets[0, 4], targets[0, 5], targets[1, 3] = 1, 2, 0
    batch = PatternBatch(
        lengths=torch.tensor([N, N]),
        causal=causal,
        separator=flags,
        punctuation=~flags,
        repeat_len=2,
        band=(1, 2),
        targets=targets,
    )
    masses = {
        name: (A * key_set_flags(batch, name, N)[:, None, None, :]).sum(-1).double()
        for name in ("separator", "punctuation")
    }
    entropy = torch.special.entr(A).sum(-1).double()
    i = torch.arange(N)
    # [q, k]
    band = ((i[None, :] < 1) | ((i[:, None] - i[None, :] < 2) & (i[None, :] <= i[:, None]))).float()
    stats = HeadStats(
        shape=(B, H, N, N),
        entropy=entropy,
        masses=masses,
        lse=lse,
        query=q,
        key=k,
        causal=causal,
        mask=mask,
        band=((1, 2), (A * band).sum(-1).double()),
        argmax=A.argmax(-1),
    )
    return stats, A, batch


def test_is_rows():
    stats, A, _ = make(True)
    assert isinstance(stats, Rows) and stats.device == A.device


@pytest.mark.parametrize("causal", [True, False])
def test_at_equals_the_pattern(causal):
    stats, A, batch = make(causal)
    for offset in (-2, -1, 0, 1):
        keys = torch.arange(N) + offset
        want = A.gather(-1, keys.clamp(0, N - 1).view(1, 1, N, 1).expand(B, H, N, 1)).squeeze(-1)
        want = want * ((keys >= 0) & (keys < N))  # outside the key axis: 0
        torch.testing.assert_close(stats.at(keys, batch).float(), want, atol=1e-6, rtol=1e-5)
    if causal:
        assert stats.at(torch.arange(N) + 1).abs().max() == 0  # a later key is never visible


def test_at_respects_the_mask_and_empty_rows():
    mask = torch.ones(B, N, N, dtype=torch.bool)
    mask[1, :, 4:] = False  # sequence 1: keys 4, 5 hidden
    mask[0, 2, :] = False  # sequence 0, query 2 sees nothing
    stats, A, batch = make(False, mask)
    got = stats.at(torch.full((N,), 4), batch)
    assert got[1].abs().max() == 0 and got[0, :, 2].abs().max() == 0
    torch.testing.assert_close(got[0].float(), A[0, :, :, 4])


@pytest.mark.parametrize("causal", [True, False])
def test_every_fused_metric_scores_the_stats_like_the_pattern(causal):
    stats, A, batch = make(causal, seed=3)
    fused = [m for m in REGISTRY.values() if m.fused]
    assert len(fused) == len(REGISTRY)  # every built-in metric reads rows through the selectors
    assert {"streaming", "retrieval", "retrieval_soft"} <= {m.name for m in fused}
    for m in fused:
        want, got = m(A, batch), m(stats, batch)
        torch.testing.assert_close(got.count, want.count)
        torch.testing.assert_close(got.total, want.total, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_row_entropy_and_mass_are_the_kernel_values():
    stats, _, batch = make(True)
    assert stats.row_entropy(batch) is stats.entropy
    assert stats.mass(batch, "separator") is stats.masses["separator"]
