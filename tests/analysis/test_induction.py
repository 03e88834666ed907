"""Induction helpers: synthetic patterns and losses with known answers, then a tiny GPT-2."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

import headscope
from headscope.analysis.induction import (
    loss_figure,
    offset_weights,
    repeat_length_sweep,
    repeat_loss_summary,
    sequence_pattern,
    stripe_figure,
    sweep_figure,
    token_losses,
)
from headscope.errors import HeadscopeError


def _perfect_induction_pattern(L: int) -> np.ndarray:
    n = 2 * L + 1
    A = np.zeros((n, n))
    A[:, 0] = 1.0  # everything else on BOS
    for q in range(L + 1, n):
        A[q] = 0
        A[q, q - L + 1] = 1.0
    return A


def test_offset_weights_read_the_stripe():
    L = 4
    table = offset_weights(_perfect_induction_pattern(L), L)
    assert table["query"].tolist() == [5, 6, 7, 8]
    assert table["induction"].tolist() == [1, 1, 1, 1]
    assert table[["duplicate", "previous", "first"]].to_numpy().sum() == 0


def test_stripe_figure_is_a_figure():
    assert isinstance(stripe_figure(_perfect_induction_pattern(5), 5, "synthetic"), Figure)


def test_repeat_loss_summary_leaves_out_the_first_token_of_each_copy():
    L = 3
    # columns = loss on positions 1..2L; the first token of each copy gets 100 (must be ignored)
    losses = torch.tensor([[100.0, 6, 6, 100, 2, 2], [100, 4, 4, 100, 0, 0]])
    assert repeat_loss_summary(losses, L) == {"first_copy": 5.0, "second_copy": 1.0, "difference": -4.0}


def test_loss_and_sweep_figures():
    assert isinstance(loss_figure(torch.rand(3, 8), 4, "t"), Figure)
    import pandas as pd

    sweep = pd.DataFrame({"model": "m", "metric": "induction", "head_name": ["L0H0", "L0H0"], "repeat_len": [4, 8],
                          "score": [0.2, 0.5], "chance": [0.3, 0.2]})
    assert isinstance(sweep_figure(sweep, ["L0H0"]), Figure)


def test_token_losses_match_a_plain_cross_entropy(tiny_gpt2):
    probe = headscope.repeat_probe(tiny_gpt2, repeat_len=5, n_sequences=3, seed=1)
    losses = token_losses(tiny_gpt2, probe, batch_size=2)
    assert losses.shape == (3, 10)
    tokens = torch.tensor(probe.sequences)
    logits = tiny_gpt2.logits(tokens)
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1),
                                                 reduction="none").view(3, 10)
    torch.testing.assert_close(losses, expected, atol=1e-5, rtol=1e-5)


def test_token_losses_need_one_length(tiny_gpt2):
    probe = headscope.text_probe(tiny_gpt2, n_prompts=4)
    with pytest.raises(HeadscopeError, match="one length"):
        token_losses(tiny_gpt2, probe)


def test_sequence_pattern_scores_like_the_scan(tiny_gpt2):
    probe = headscope.repeat_probe(tiny_gpt2, repeat_len=6, n_sequences=1, seed=2)
    A = sequence_pattern(tiny_gpt2, probe.sequences[0], layer=1, head=2)  # [query, key]
    assert A.shape == (13, 13)
    np.testing.assert_allclose(A.sum(-1), 1.0, atol=1e-5)
    assert np.triu(A, 1).max() == 0  # causal
    scan = headscope.scan(tiny_gpt2, [probe], metrics=["induction"])
    expected = scan.scores.set_index("head_name").loc["L1H2", "score"]
    assert offset_weights(A, 6)["induction"].mean() == pytest.approx(expected, abs=1e-5)
    with pytest.raises(HeadscopeError, match="does not exist"):
        sequence_pattern(tiny_gpt2, probe.sequences[0], layer=5, head=0)


def test_repeat_length_sweep_has_one_block_per_length(tiny_gpt2):
    sweep = repeat_length_sweep(tiny_gpt2, [3, 7], n_sequences=2, seed=0)
    assert sorted(sweep["repeat_len"].unique()) == [3, 7]
    assert set(sweep["metric"]) == {"induction"}
    assert len(sweep) == 2 * tiny_gpt2.n_layers * tiny_gpt2.n_heads
