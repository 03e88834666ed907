"""Induction helpers: synthetic patterns and losses with known answers, then a tiny GPT-2."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import headscope
from headscope.errors import HeadscopeError
from lib.induction import (
    loss_figure,
    offset_weights,
    repeat_length_sweep,
    repeat_loss_summary,
    sequence_pattern,
    stripe_figure,
    sweep_figure,
    token_losses,
)


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


def test_stripe_figure_draws_the_pattern_and_the_offsets():
    A = _perfect_induction_pattern(5)
    fig = stripe_figure(A, 5, "synthetic")
    ax, ax2, _colour_bar = fig.axes
    np.testing.assert_array_equal(ax.images[0].get_array(), A)
    assert ax.get_title() == "synthetic\nstripe at key = query - 4"
    # dotted lines around each copy of R, across and down
    rows, cols = ax.lines[0::2], ax.lines[1::2]
    assert [line.get_ydata()[0] for line in rows] == [0.5, 5.5]
    assert [line.get_xdata()[0] for line in cols] == [0.5, 5.5]
    (key,) = fig.legends  # the dotted lines are keyed
    assert key.get_texts()[0].get_text().startswith("left, dotted (white) lines: between BOS")
    assert "second copy starts (6)" in key.get_texts()[0].get_text()
    lines = {
        t.get_text(): line for t, line in zip(ax2.get_legend().get_texts(), ax2.lines, strict=True)
    }
    assert list(lines) == [
        "induction",
        "duplicate",
        "previous",
        "first",
        "uniform attention, 1/(q+1) per key",
    ]
    np.testing.assert_array_equal(lines["induction"].get_xdata(), [6, 7, 8, 9, 10])
    np.testing.assert_array_equal(lines["induction"].get_ydata(), [1] * 5)
    assert all((lines[k].get_ydata() == 0).all() for k in ("duplicate", "previous", "first"))
    # a uniform head over the q + 1 keys query q sees
    uniform = lines["uniform attention, 1/(q+1) per key"]
    np.testing.assert_allclose(uniform.get_ydata(), [1 / 7, 1 / 8, 1 / 9, 1 / 10, 1 / 11])


def test_repeat_loss_summary_leaves_out_the_first_token_of_each_copy():
    L = 3
    # columns = loss on positions 1..2L; the first token of each copy gets 100 (must be ignored)
    losses = torch.tensor([[100.0, 6, 6, 100, 2, 2], [100, 4, 4, 100, 0, 0]])
    assert repeat_loss_summary(losses, L) == {
        "first_copy": 5.0,
        "second_copy": 1.0,
        "difference": -4.0,
    }


def test_loss_figure_draws_the_mean_loss_per_position():
    losses = torch.tensor(
        [[9.0, 9, 9, 9, 1, 1, 1, 1], [7, 7, 7, 7, 3, 3, 3, 3], [8, 8, 8, 8, 2, 2, 2, 2]]
    )
    fig = loss_figure(losses, 4, "t")
    (ax,) = fig.axes
    mean, split = ax.lines
    np.testing.assert_array_equal(mean.get_xdata(), np.arange(1, 9))
    np.testing.assert_allclose(mean.get_ydata(), [8, 8, 8, 8, 2, 2, 2, 2])
    np.testing.assert_array_equal(split.get_xdata(), [4.5, 4.5])  # between the two copies of R
    assert [t.get_text() for t in ax.texts] == ["first copy of R", "second copy of R"]
    assert [t.get_position() for t in ax.texts] == [(2.0, 8.0), (6.0, 8.0)]
    assert ax.get_title() == "t" and ax.get_ylim()[0] == 0
    keys = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "the second copy starts (position 5)" in keys  # the dashed line is keyed


def test_sweep_figure_draws_each_head_and_chance():
    sweep = pd.DataFrame(
        {
            "model": "m",
            "metric": "induction",
            "head_name": ["L0H0", "L0H0", "L1H2", "L1H2"],
            "repeat_len": [8, 4, 4, 8],
            "score": [0.5, 0.2, 0.9, 0.8],
            "chance": [0.2, 0.3, 0.3, 0.2],
        }
    )
    fig = sweep_figure(sweep, ["L0H0", "L1H2"])
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "L0H0",
        "L1H2",
        "chance (uniform attention)",
        "label cut 0.4",
    ]
    head, other, chance, cut = ax.lines
    np.testing.assert_array_equal(head.get_xdata(), [4, 8])  # sorted by repeat length
    np.testing.assert_array_equal(head.get_ydata(), [0.2, 0.5])
    np.testing.assert_array_equal(other.get_ydata(), [0.9, 0.8])
    np.testing.assert_array_equal(chance.get_ydata(), [0.3, 0.2])
    assert list(cut.get_ydata()) == [0.4, 0.4]
    assert "log scale" in ax.get_xlabel() and "point estimates, no interval" in ax.get_title()
    # with intervals: error bars, and the title says what they span
    banded = sweep.assign(ci_low=sweep["score"] - 0.1, ci_high=sweep["score"] + 0.05)
    ax = sweep_figure(banded, ["L0H0"], n_sequences=8).axes[0]
    (bars,) = [c for c in ax.containers if c.get_label() == "L0H0"]
    (segments,) = [b.get_segments() for b in bars.lines[2]]
    ends = [float(p[1]) for seg in segments for p in seg]
    assert ends == pytest.approx([0.1, 0.25, 0.4, 0.55])
    assert "8 sequences per L; bars: 95% interval over them" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "8"]
    assert ax.get_title().startswith("m: induction score against L")


def test_token_losses_match_a_plain_cross_entropy(tiny_gpt2):
    probe = headscope.repeat_probe(tiny_gpt2, repeat_len=5, n_sequences=3, seed=1)
    losses = token_losses(tiny_gpt2, probe, batch_size=2)
    assert losses.shape == (3, 10)
    tokens = torch.tensor(probe.sequences)
    logits = tiny_gpt2.logits(tokens)
    expected = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none"
    ).view(3, 10)
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
