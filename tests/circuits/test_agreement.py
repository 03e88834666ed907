"""Agreement of two rankings of senders: closed cases (identical, reversed, ties), the chance level
of the top-k overlap against brute-force enumeration, the intervals' seeding, and the table."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from headscope.circuits.agreement import agreement_table, average_ranks, rank_agreement
from headscope.errors import HeadscopeError


def _spearman_oracle(x, y) -> float:
    """Spearman from its textbook definition, written here: average ranks by counting, then
    Pearson."""

    def ranks(v):
        return [sum(u < t for u in v) + (sum(u == t for u in v) + 1) / 2 for t in v]

    rx, ry = np.array(ranks(list(x))), np.array(ranks(list(y)))
    return float(np.corrcoef(rx, ry)[0, 1])


def test_identical_rankings():
    x = np.arange(20.0)
    row = rank_agreement(x, x * 3 + 1, k=5)
    assert row["rho"] == pytest.approx(1.0)
    assert row["overlap"] == 5 and row["overlap_share"] == 1.0
    assert row["rho_low"] == pytest.approx(1.0) and row["rho_high"] == pytest.approx(1.0)
    # exact: P(overlap = 5) = 1 / C(20, 5)
    assert row["overlap_p"] == pytest.approx(1 / math.comb(20, 5))
    assert row["rho_p"] == pytest.approx(1 / (1 + 2000))  # no random pairing reaches rho = 1


def test_reversed_rankings():
    x = np.arange(20.0)
    row = rank_agreement(x, -x, k=5)
    assert row["rho"] == pytest.approx(-1.0)
    assert row["overlap"] == 0 and row["overlap_p"] == 1.0
    assert row["rho_p"] < 0.01  # two-sided


def test_ties_get_average_ranks():
    assert average_ranks(np.array([3.0, 1.0, 3.0, 2.0, 3.0])).tolist() == [4.0, 1.0, 4.0, 2.0, 4.0]
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 4, size=12).astype(float)  # many ties
        y = rng.integers(0, 3, size=12).astype(float)
        if len(set(x)) < 2 or len(set(y)) < 2:
            continue
        row = rank_agreement(x, y, n_boot=0, n_perm=0)
        assert row["rho"] == pytest.approx(_spearman_oracle(x, y), abs=1e-12)


def test_ties_in_the_top_k_are_broken_by_order():
    x = [5.0, 5.0, 5.0, 1.0, 0.0]
    y = [0.0, 1.0, 5.0, 5.0, 5.0]
    row = rank_agreement(x, y, k=2, n_boot=0, n_perm=0)
    assert row["top_a"] == [0, 1] and row["top_b"] == [2, 3]
    assert row["overlap"] == 0


def test_chance_level_is_the_mean_under_random_rankings():
    """k^2 / n and the exact tail, against enumeration of every k-subset of n = 9."""
    n, k = 9, 3
    x = np.arange(n, dtype=float)
    top = set(range(n - k, n))
    overlaps = [len(top & set(s)) for s in itertools.combinations(range(n), k)]
    assert np.mean(overlaps) == pytest.approx(k * k / n)
    y = np.zeros(n)
    y[[8, 7, 0]] = [3.0, 2.0, 1.0]  # b's top 3: two of a's top 3
    row = rank_agreement(x, y, k=k, n_boot=0, n_perm=0)
    assert row["overlap"] == 2 and row["overlap_chance"] == pytest.approx(1.0)
    assert row["overlap_p"] == pytest.approx(np.mean([o >= 2 for o in overlaps]))


def test_permutation_p_and_interval_are_seeded_and_sane():
    rng = np.random.default_rng(3)
    x = rng.normal(size=60)
    unrelated = rank_agreement(x, rng.normal(size=60), seed=5)
    related = rank_agreement(x, x + 0.3 * rng.normal(size=60), seed=5)
    assert related["rho_p"] < 0.001 and related["rho_low"] > 0.7
    assert related["rho_low"] <= related["rho"] <= related["rho_high"]
    assert unrelated["rho_low"] < unrelated["rho"] < unrelated["rho_high"]
    y = rng.normal(size=60)
    a1, a2 = rank_agreement(x, y, seed=1), rank_agreement(x, y, seed=1)
    assert a1 == a2
    # under no relation the permutation p is roughly uniform: over 200 pairs, ~5% below 0.05
    ps = [
        rank_agreement(rng.normal(size=30), rng.normal(size=30), n_boot=0, n_perm=400, seed=i)[
            "rho_p"
        ]
        for i in range(200)
    ]
    assert 0.01 < np.mean(np.array(ps) < 0.05) < 0.10


def test_series_are_aligned_by_sender():
    a = pd.Series({"L0H0": 3.0, "L0H1": 2.0, "L1H0": 1.0, "L1H1": 0.0})
    b = pd.Series({"L1H1": 0.0, "L1H0": 1.0, "L0H1": 2.0, "L0H0": 3.0})  # same, other order
    row = rank_agreement(a, b, k=2, n_boot=0, n_perm=0)
    assert row["rho"] == pytest.approx(1.0) and row["top_a"] == row["top_b"] == ["L0H0", "L0H1"]


def test_table_over_receivers():
    rng = np.random.default_rng(0)
    rows = []
    for r in ("L5H0", "L5H1"):
        for s in range(10):
            v = rng.normal()
            rows.append(
                {"receiver": r, "sender": f"L0H{s}", "z": v, "effect": v if r == "L5H0" else -v}
            )
    df = pd.DataFrame(rows)
    out = agreement_table(df, a_col="z", b_col="effect", k=3, n_boot=100, n_perm=100)
    assert list(out.receiver) == ["L5H0", "L5H1"]
    assert out.rho.tolist() == pytest.approx([1.0, -1.0])
    assert out.overlap.tolist() == [3, 0]
    split = agreement_table(
        {r: g.set_index("sender").z for r, g in df.groupby("receiver")},
        {r: g.set_index("sender").effect for r, g in df.groupby("receiver")},
        k=3,
        n_boot=100,
        n_perm=100,
    )
    assert split.rho.tolist() == pytest.approx([1.0, -1.0])


@pytest.mark.parametrize(
    "a, b, kwargs, message",
    [
        ([1, 2, 3], [1, 2, 3], {"k": 4}, "k (the top-k overlap) must be an integer in 1-3"),
        ([1, 2, 3], [1, 2], {}, "must score the same senders"),
        ([1, float("nan"), 3], [1, 2, 3], {}, "NaN"),
        ([1], [1], {}, "at least 2 senders"),
        ([1, 2, 3], [1, 2, 3], {"n_boot": -1}, "n_boot must be 0 (off)"),
    ],
)
def test_bad_input_is_one_line(a, b, kwargs, message):
    with pytest.raises(HeadscopeError) as err:
        rank_agreement(a, b, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_table_names_its_columns():
    df = pd.DataFrame({"receiver": ["r"] * 3, "sender": ["a", "b", "c"], "z": [1.0, 2.0, 3.0]})
    with pytest.raises(HeadscopeError, match="b_col must name a score column"):
        agreement_table(df, a_col="z", b_col="effect")
