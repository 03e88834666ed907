"""Reading attention rows (headscope/metrics/rows.py): DenseRows on whole patterns and query
blocks."""

from __future__ import annotations

import math

import pytest
import torch

from headscope.metrics import PatternBatch
from headscope.metrics.rows import DenseRows, Rows, as_rows
from tests.metrics.patterns import batch, causal_uniform, random_causal


def test_as_rows():
    A = causal_uniform(3)
    rows = as_rows(A)
    assert isinstance(rows, DenseRows) and rows.pattern is A and rows.shape == (1, 1, 3, 3)
    assert as_rows(rows) is rows and isinstance(rows, Rows)
    assert rows.device == A.device


def test_at_reads_one_key_per_row():
    A = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0, 1, 0]])[None, None]
    got = as_rows(A).at(torch.tensor([-1, 0, 1]), batch(3))
    assert got.tolist() == [[[0.0, 0.5, 1.0]]]  # key -1 is outside: 0
    assert as_rows(A).at(torch.tensor([3, 3, 2]), batch(3)).tolist() == [[[0.0, 0.0, 0.0]]]


def test_row_entropy_ignores_padding_keys():
    A = torch.full((1, 1, 2, 4), 0.25)
    A[0, 0, :, 2:] = 0.5  # garbage in the padding columns
    A[0, 0, :, :2] = 0.5
    got = as_rows(A).row_entropy(PatternBatch(lengths=torch.tensor([2]), causal=False))
    assert got[0, 0].tolist() == pytest.approx([math.log(2)] * 2)


def test_row_entropy_from_a_given_log():
    A = random_causal(1, 2, 5)
    # finite where masked, as an engine hands it
    log = torch.log(A.clamp_min(torch.finfo(A.dtype).tiny))
    b = batch(5)
    torch.testing.assert_close(DenseRows(A, log).row_entropy(b), DenseRows(A).row_entropy(b))


@pytest.mark.parametrize("causal", [True, False])
def test_mass_of_a_block_equals_the_rows_of_the_whole(causal):
    A = random_causal(2, 3, 7, seed=1) if causal else torch.rand(2, 3, 7, 7).softmax(-1)
    keys = torch.rand(2, 7, generator=torch.Generator().manual_seed(2)) > 0.5
    b = PatternBatch(lengths=torch.tensor([7, 7]), causal=causal)
    whole = DenseRows(A).mass(b, "separator", keys)
    # reference: sum of A over flagged keys the query can see
    vis = torch.tril(torch.ones(7, 7)) if causal else torch.ones(7, 7)
    want = (A * keys[:, None, None, :] * vis).sum(-1)
    torch.testing.assert_close(whole, want)
    for start in (1, 4):
        block = DenseRows(A[:, :, start:]).mass(
            PatternBatch(b.lengths, causal, q_start=start), "separator", keys
        )
        torch.testing.assert_close(block, whole[:, :, start:])
