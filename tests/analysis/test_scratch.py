"""Attention from scratch (headscope.analysis.scratch) against closed forms and the article's numbers."""

from __future__ import annotations

import doctest
import math

import pytest
import torch
from matplotlib.figure import Figure

from headscope.analysis import scratch as S
from headscope.errors import HeadscopeError


def _qkv(*, seed: int = 0, n: int = 6, d_k: int = 5, d_v: int = 3, lead: tuple[int, ...] = ()):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*lead, *shape, generator=gen, dtype=torch.float64)

    return r(n, d_k), r(n, d_k), r(n, d_v)


def _article():
    ex = S.article_example()
    return tuple(ex["X"] @ ex[w] for w in ("WQ", "WK", "WV"))


def test_docstring_examples():
    result = doctest.testmod(S, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------------ the article's example


def test_article_queries_keys_values():
    Q, K, V = _article()
    assert Q.tolist() == [[0, 1], [1, 0], [2, 0], [1, 1]]
    assert K.tolist() == [[0, 1], [2, 0], [0, 1], [2, 1]]
    assert V.tolist() == [[0, 0], [1, 0], [0, 1], [1, 0]]
    assert (Q @ K.T)[2].tolist() == [0, 4, 0, 4]  # "bank" against every key


def test_article_bank_row():
    Q, K, V = _article()
    out, w = S.attention(Q, K, V)
    scaled = (Q @ K.T / math.sqrt(2))[2]
    assert scaled.round(decimals=2).tolist() == [0.0, 2.83, 0.0, 2.83]
    e = math.exp(4 / math.sqrt(2))
    assert round(e, 2) == 16.92 and round(2 + 2 * e, 2) == 35.84  # the article's softmax arithmetic
    assert w[2].round(decimals=3).tolist() == [0.028, 0.472, 0.028, 0.472]
    assert out[2].round(decimals=3).tolist() == [0.944, 0.028]
    assert round(float(w[2, 1] + w[2, 3]), 2) == 0.94  # 94% on the two water words


def test_article_causal():
    Q, K, V = _article()
    out, w = S.attention(Q, K, V, causal=True)
    assert w[2].round(decimals=3).tolist() == [0.053, 0.894, 0.053, 0.0]
    assert out[2].round(decimals=3).tolist() == [0.894, 0.053]
    assert w[0].tolist() == [1.0, 0.0, 0.0, 0.0]  # "The" can only look at itself
    full_out, full_w = S.attention(Q, K, V)
    torch.testing.assert_close(w[-1], full_w[-1])  # the last token already saw everything
    torch.testing.assert_close(out[-1], full_out[-1])


# ------------------------------------------------------------------------ attention in general


@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_sdpa(causal):
    Q, K, V = _qkv(lead=(2, 3))
    out, _ = S.attention(Q, K, V, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=causal)
    torch.testing.assert_close(out, ref)


def test_causal_rows_sum_to_one_and_upper_triangle_is_exactly_zero():
    Q, K, V = _qkv(n=7, lead=(4,))
    Q = Q * 30  # huge scores: the mask must still give exact zeros, not tiny numbers
    _, w = S.attention(Q, K, V, causal=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 7, dtype=torch.float64))
    upper = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert (w[:, upper] == 0).all()
    assert (w[:, ~upper] >= 0).all()


def test_unscaled_and_custom_scale():
    Q, K, V = _qkv()
    _, w1 = S.attention(Q, K, V, scale=1.0)
    torch.testing.assert_close(w1, (Q @ K.T).softmax(-1))
    _, w2 = S.attention(Q * 2, K, V, scale=0.5 / math.sqrt(Q.shape[-1]))
    torch.testing.assert_close(w2, S.attention(Q, K, V)[1])


def test_kv_cache_step_from_scratch():
    """One new query against all cached keys = the last row of the full causal computation."""
    Q, K, V = _qkv(n=8)
    out, w = S.attention(Q, K, V, causal=True)
    step_out, step_w = S.attention(Q[-1:], K, V, causal=True)
    torch.testing.assert_close(step_out[0], out[-1])
    torch.testing.assert_close(step_w[0], w[-1])
    # appending a token never changes earlier rows
    prefix_out, prefix_w = S.attention(Q[:-1], K[:-1], V[:-1], causal=True)
    torch.testing.assert_close(w[:-1, :-1], prefix_w)
    assert (w[:-1, -1] == 0).all()
    torch.testing.assert_close(out[:-1], prefix_out)


def test_causal_mask_shapes():
    assert S.causal_mask(2, 4).int().tolist() == [[0, 0, 0, 1], [0, 0, 0, 0]]
    with pytest.raises(HeadscopeError, match="at least as many keys"):
        S.causal_mask(3, 2)


def test_permutation_equivariance_without_positions():
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(9, 6, generator=gen, dtype=torch.float64)
    WQ, WK, WV = (torch.randn(6, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    perm = torch.randperm(9, generator=gen).tolist()
    a = S.attention(X @ WQ, X @ WK, X @ WV)
    b = S.attention(X[perm] @ WQ, X[perm] @ WK, X[perm] @ WV)
    d_out, d_w = S.permutation_gap(*a, *b, perm)
    assert d_out < 1e-12 and d_w < 1e-12
    # the causal mask is tied to position, so it breaks equivariance
    a = S.attention(X @ WQ, X @ WK, X @ WV, causal=True)
    b = S.attention(X[perm] @ WQ, X[perm] @ WK, X[perm] @ WV, causal=True)
    assert min(S.permutation_gap(*a, *b, perm)) > 1e-3


def test_article_shuffle_gives_same_weights():
    X = S.article_example()["X"]
    ex = S.article_example()
    perm = [3, 1, 0, 2]
    a = S.attention(*(X @ ex[w] for w in ("WQ", "WK", "WV")))
    b = S.attention(*(X[perm] @ ex[w] for w in ("WQ", "WK", "WV")))
    assert max(S.permutation_gap(*a, *b, perm)) < 1e-12  # equal up to summation order


def test_repeat_kv_grouping():
    kv = torch.arange(3.0).view(3, 1, 1).expand(3, 4, 2)  # [kv_head, pos, d]
    out = S.repeat_kv(kv, 9)
    assert out.shape == (9, 4, 2)
    assert [int(out[h, 0, 0]) for h in range(9)] == [h // 3 for h in range(9)]
    assert torch.equal(S.repeat_kv(kv, 3), kv)  # plain multi-head attention: nothing to share
    with pytest.raises(HeadscopeError, match="evenly"):
        S.repeat_kv(kv, 4)


def test_softmax_slope_closed_forms():
    for n in (2, 4, 8):
        assert S.softmax_slope(torch.zeros(n, dtype=torch.float64)).item() == pytest.approx((1 / n) * (1 - 1 / n))
    assert S.softmax_slope(torch.tensor([50.0, 0.0, 0.0], dtype=torch.float64)).item() < 1e-20
    # stretching the same scores shrinks the slope
    s = torch.tensor([1.0, 0.5, 0.0, -0.5], dtype=torch.float64)
    slopes = [S.softmax_slope(s * f).item() for f in (1, 8, 11.3)]
    assert slopes[0] > slopes[1] > slopes[2]


# ------------------------------------------------------------------------ the sqrt(d_k) simulations


def test_dot_product_variance_grows_like_d_k():
    t = S.dot_product_stats([1, 16, 128], n_pairs=20_000, seed=3)
    for _, row in t.iterrows():
        assert row["var"] == pytest.approx(row["d_k"], rel=0.06)
        assert abs(row["mean"]) < 4 * math.sqrt(row["d_k"] / 20_000)
        assert row["std_scaled"] == pytest.approx(1.0, rel=0.03)
    again = S.dot_product_stats([1, 16, 128], n_pairs=20_000, seed=3)
    assert t.equals(again)  # seeded, no global RNG


def test_dot_product_uneven_chunks():
    t = S.dot_product_stats([8], n_pairs=1_001, chunk=100)
    assert t.loc[0, "d_k"] == 8 and math.isfinite(t.loc[0, "var"])


def test_peak_stats_small_trial_count():
    """The article: 51% peaked unscaled, never when scaled, top weight ~36% scaled (d_k 128, 8 keys)."""
    t = S.peak_stats(d_k=128, n_keys=8, n_trials=4_000, seed=0).set_index("scores")
    un, sc = t.loc["unscaled"], t.loc["scaled"]
    assert abs(un["frac_peaked"] - 0.51) < 0.035  # SE ~0.008 at 4,000 trials; large-n value ~0.519
    assert sc["frac_peaked"] == 0.0
    assert sc["mean_top"] == pytest.approx(0.36, abs=0.01)
    assert un["mean_top"] > 0.85
    assert un["mean_slope"] < sc["mean_slope"] / 3  # peaked softmax: little slope left
    assert t.equals(S.peak_stats(d_k=128, n_keys=8, n_trials=4_000, seed=0).set_index("scores"))


# ------------------------------------------------------------------------ cost


def test_cost_table_article_numbers():
    K = 1024
    t = S.cost_table([4 * K, 128 * K, 1024 * K], d_head=128, n_layers=32, n_heads=32, n_params=8e9).set_index("n")
    assert t.loc[128 * K, "scores"] / t.loc[4 * K, "scores"] == 1024  # 32x the text, 1,024x the scores
    assert round(t.loc[128 * K, "scores"] / 1e9) == 17  # ~17 billion pairs per head per layer
    assert t.loc[128 * K, "grid_size"] == "34.4 GB"
    assert round(t.loc[128 * K, "model_scores"] / 1e12, 1) == 17.6  # 1,024 grids
    assert round(t.loc[128 * K, "attn_to_weights"]) == 2  # "about twice"
    assert round(t.loc[1024 * K, "attn_to_weights"]) == 17  # "about 17 times"
    assert t.loc[4 * K, "attn_to_weights"] < 0.1  # "a rounding error"
    assert round(t.loc[4 * K, "attn_flops_per_token"] / 1e9, 1) == 2.1
    assert round(t.loc[128 * K, "attn_flops_per_token"] / 1e9) == 69
    assert t.loc[4 * K, "weight_flops_per_token"] == 16e9


def test_cost_table_closed_form():
    t = S.cost_table([10, 20], d_head=64, causal_half=False)
    assert t["scores"].tolist() == [100, 400]
    assert t["grid_bytes"].tolist() == [200, 800]
    assert t["flops_per_head_layer"].tolist() == [4 * 100 * 64, 4 * 400 * 64]
    assert "weight_flops" not in t


def test_format_bytes():
    assert S.format_bytes(512) == "512 B"
    assert S.format_bytes(2 * 4096**2) == "33.6 MB"
    assert S.format_bytes(2 * (1024 * 1024) ** 2) == "2.2 TB"


def test_fit_quadratic_recovers_coefficients_and_share():
    n = [100, 200, 400, 800, 1600]
    t = [0.5 + 1e-3 * x + 2e-6 * x * x for x in n]
    fit = S.fit_quadratic(n, t)
    assert fit["a"] == pytest.approx(0.5) and fit["b"] == pytest.approx(1e-3) and fit["c"] == pytest.approx(2e-6)
    assert fit["n_cross"] == pytest.approx(500)
    import pandas as pd

    table = S.with_fit(pd.DataFrame({"n": n, "seconds": t}), fit)
    assert table["quadratic_share"].is_monotonic_increasing
    assert table["fit_seconds"].tolist() == pytest.approx(t)


def test_fit_quadratic_never_negative():
    n = [100, 200, 400, 800]
    fit = S.fit_quadratic(n, [1.0 - 1e-4 * x + 1e-6 * x * x for x in n])  # a falling linear part
    assert min(fit["a"], fit["b"], fit["c"]) >= 0 and fit["b"] == 0 and fit["c"] > 0
    fit = S.fit_quadratic(n, [0.01 * x for x in n])  # purely linear
    assert fit["c"] == 0 and fit["n_cross"] == math.inf and fit["b"] == pytest.approx(0.01)


def test_best_time_budget():
    calls = []
    S._best_time(lambda: calls.append(1), repeats=3)
    assert len(calls) == 3
    calls.clear()
    S._best_time(lambda: calls.append(1), repeats=3, budget_s=0.0)  # budget spent after one call
    assert len(calls) == 1


def test_figures_are_plain_figures():
    import pandas as pd

    n = [10, 20, 40]
    table = pd.DataFrame({"n": n, "seconds": [1.0, 2.5, 7.0]})
    fig = S.timing_figure([("a", table, S.fit_quadratic(n, table["seconds"]))], "t")
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    _, w = S.attention(*_article())
    fig = S.weights_figure(w, S.ARTICLE_TOKENS, "w")
    assert isinstance(fig, Figure) and len(fig.axes) == 2  # grid + colour bar


# ------------------------------------------------------------------------ the real models

_TEXT = "The river bank flooded after the storm, so the town moved its market up the hill."


@pytest.mark.real
def test_recompute_matches_smollm2(smollm2):
    ids = smollm2.wrap(smollm2.encode(_TEXT))
    t = S.recompute_check(smollm2, ids, layers=[0, 17, 29])
    assert t["pattern_max_abs_diff"].max() < 1e-5
    assert t["z_max_abs_diff"].max() < 1e-5


@pytest.mark.real
def test_recompute_negative_controls_smollm2(smollm2):
    """The check has teeth: pre-RoPE keys, or the wrong KV head, do not reproduce the pattern."""
    ids = smollm2.wrap(smollm2.encode(_TEXT))
    acts = S.layer_activations(smollm2, ids, [3])[3]
    assert acts["rot_q"].shape == (9, len(ids), 64) and acts["rot_k"].shape == (3, len(ids), 64)
    _, no_rope = S.attention(acts["q"], S.repeat_kv(acts["k"], 9), S.repeat_kv(acts["v"], 9), causal=True)
    assert (no_rope - acts["pattern"]).abs().max() > 1e-2
    wrong_k = acts["rot_k"].repeat(3, 1, 1)  # head h -> KV head h % 3 instead of h // 3
    _, wrong = S.attention(acts["rot_q"], wrong_k, wrong_k, causal=True)
    assert (wrong - acts["pattern"]).abs().max() > 1e-2


@pytest.mark.real
def test_recompute_matches_minilm(minilm):
    ids = minilm.wrap(minilm.encode(_TEXT))
    t = S.recompute_check(minilm, ids)
    assert len(t) == 6
    assert t["pattern_max_abs_diff"].max() < 1e-5
    assert t["z_max_abs_diff"].max() < 1e-5


@pytest.mark.real
def test_prefix_rows_unchanged_smollm2(smollm2):
    ids = smollm2.wrap(smollm2.encode(_TEXT))
    t = S.prefix_check(smollm2, ids)
    assert len(t) == smollm2.n_layers
    assert t["prefix_max_abs_diff"].max() < 1e-5
    assert (t["new_key_max_weight"] == 0).all()


@pytest.mark.real
def test_permutation_real_model_changes(smollm2):
    ids = smollm2.wrap(smollm2.encode("The river bank flooded"))
    assert len(ids) == 5
    t = S.permutation_table(smollm2, ids, [0, 3, 4, 1, 2]).set_index("computation")
    assert t.loc["queries, before positions", "output_gap"] < 1e-5
    assert t.loc["from scratch, no positions, no mask", ["output_gap", "weights_gap"]].max() < 1e-5
    assert t.loc["from scratch, RoPE, no mask", "weights_gap"] > 1e-3
    assert t.loc["the model (positions + mask)", "weights_gap"] > 1e-2


@pytest.mark.real
def test_timing_helpers_smollm2(smollm2):
    t = S.time_scan(smollm2, [4, 8])
    assert t["n"].tolist() == [9, 17] and (t["seconds"] > 0).all()
    t = S.time_one_layer(smollm2, [16, 32], repeats=1)
    assert t["n"].tolist() == [16, 32] and (t["seconds"] > 0).all()
