"""Intervals and controls for the notebooks: closed forms, and group ablation against plain
forwards with the model's own interventions (no resumed prefix, no shared code path)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import headscope
from headscope.effects.ablation import head_means
from headscope.errors import HeadscopeError
from headscope.models.attention import ReplaceHeadOutput
from lib import controls


def test_proportion_interval_is_wilsons():
    lo, hi = controls.proportion_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert controls.proportion_interval(10, 10)[1] == 1.0
    with pytest.raises(HeadscopeError, match="0 <= k <= n"):
        controls.proportion_interval(3, 2)


def test_intervals_shrink_to_the_point_when_every_sequence_agrees():
    s, c = torch.full((6,), 0.5, dtype=torch.float64), torch.ones(6, dtype=torch.float64)
    assert controls.change_interval(s, c) == (0.5, 0.5, 0.5)
    total = np.tile(np.array([[0.1, 0.9]]), (5, 1, 1))  # [sequence, layer, head], all alike
    v, lo, hi = controls.pooled_interval(total, np.ones(5), lambda x: float((x > 0.3).mean()))
    assert (v, lo, hi) == (0.5, 0.5, 0.5)


def test_pooled_interval_covers_the_spread_of_sequences():
    rng = np.random.default_rng(0)
    total = rng.uniform(0, 1, (40, 2, 3))
    v, lo, hi = controls.pooled_interval(total, np.ones(40), lambda x: float(x.mean()))
    assert v == pytest.approx(total.mean())
    se = total.mean((1, 2)).std(ddof=1) / math.sqrt(40)
    assert lo < v < hi and (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.3)


def test_layer_intervals_are_scan_intervals_of_each_layer_mean():
    from types import SimpleNamespace

    rng = np.random.default_rng(1)
    total = rng.uniform(0, 1, (30, 3, 4))  # [sequence, layer, head]
    total[:, 2, 1] = np.nan  # a NaN head is left out of its layer's mean
    count = rng.integers(1, 4, 30).astype(float)
    result = SimpleNamespace(
        model_name="m",
        per_sequence={
            "sink": {"total": total, "count": count},
            "other": {"total": total * 0 + 0.25, "count": np.ones(30)},
        },
    )
    table = controls.layer_intervals(result, ["sink", "other"], resamples=200, seed=3)
    assert list(table.columns) == [
        "model",
        "metric",
        "layer",
        "mean",
        "ci_low",
        "ci_high",
        "resamples",
        "level",
    ]
    sink = table[table.metric == "sink"]
    for layer in range(3):
        v, lo, hi = controls.scan_interval(
            result,
            "sink",
            lambda s, layer=layer: float(np.nanmean(s[layer])),
            resamples=200,
            seed=3,
        )
        row = sink[sink.layer == layer].iloc[0]
        assert (row["mean"], row.ci_low, row.ci_high) == pytest.approx((v, lo, hi), rel=1e-12)
        pooled = np.nansum(total[:, layer], 0) / count.sum() if layer < 2 else None
        if pooled is not None:
            assert row["mean"] == pytest.approx(pooled.mean())
    other = table[table.metric == "other"]  # every sequence alike: the interval is the point
    assert (
        (other["mean"] == 0.25).all()
        and (other.ci_low == 0.25).all()
        and (other.ci_high == 0.25).all()
    )
    with pytest.raises(HeadscopeError, match="no per-sequence sums for 'entropy'"):
        controls.layer_intervals(result, ["entropy"])


def test_joint_interval_resamples_the_same_sequences_for_every_part():
    rng = np.random.default_rng(2)
    a = rng.uniform(0.5, 1.5, (25, 2, 3))
    c = rng.integers(1, 5, 25).astype(float)
    # b is a exactly doubled, sequence by sequence: any resample that draws the same sequences
    # for both gives a ratio of exactly 2; independent draws would not
    v, lo, hi = controls.joint_interval(
        {"a": (a, c), "b": (2 * a, c)}, lambda s: float(np.median(s["b"] / s["a"])), resamples=300
    )
    assert (v, lo, hi) == pytest.approx((2.0, 2.0, 2.0), rel=1e-12)
    # one part alone is pooled_interval, draw for draw
    one = controls.joint_interval({"a": (a, c)}, lambda s: float(s["a"][1].mean()), seed=4)
    assert one == controls.pooled_interval(a, c, lambda s: float(s[1].mean()), seed=4)
    # a median ratio that varies: the interval holds the point and has width
    b = a * rng.uniform(0.5, 1.5, a.shape)
    v, lo, hi = controls.joint_interval(
        {"a": (a, c), "b": (b, c)}, lambda s: float(np.median(s["b"] / s["a"]))
    )
    assert lo < v < hi
    with pytest.raises(HeadscopeError, match="same sequences"):
        controls.joint_interval({"a": (a, c), "b": (a[:3], c[:3])}, lambda s: 0.0)


def test_sequence_sums_read_the_long_table_back():
    rows = [
        {"metric": m, "sequence": q, "layer": la, "head": h, "total": q + 10 * la + h, "count": 2}
        for m in ("x", "y")
        for q in range(3)
        for la in range(2)
        for h in range(4)
    ]
    total, count = controls.sequence_sums(pd.DataFrame(rows), "y")
    assert total.shape == (3, 2, 4) and total[2, 1, 3] == 2 + 10 + 3 and list(count) == [2, 2, 2]
    with pytest.raises(HeadscopeError, match="has no rows for 'z'; it has x, y"):
        controls.sequence_sums(pd.DataFrame(rows), "z")


def test_random_groups_are_distinct_seeded_and_capped():
    pool = [(layer, h) for layer in range(2) for h in range(3)]
    groups = controls.random_groups(pool, 2, 100, seed=1)
    assert len(groups) == math.comb(6, 2) and len(set(groups)) == len(groups)
    assert all(len(set(g)) == 2 and set(g) <= set(pool) for g in groups)
    assert controls.random_groups(pool, 2, 5, seed=1) == controls.random_groups(pool, 2, 5, seed=1)
    with pytest.raises(HeadscopeError, match="size must be 1..6"):
        controls.random_groups(pool, 7, 1)


def test_against_is_the_share_of_random_groups_at_least_as_large():
    out = controls.against(0.5, [0.1, 0.2, 0.5, 0.9])
    assert out["share_random_ge"] == 0.5 and out["random_max"] == 0.9 and out["n_random"] == 4


def test_diff_correlation_tells_linked_curves_from_two_trends():
    rng = np.random.default_rng(0)
    a = np.cumsum(rng.uniform(0, 1, 60))  # two unrelated rising curves
    b = np.cumsum(rng.uniform(0, 1, 60))
    unlinked = controls.diff_correlation(a, b)
    assert unlinked["corr_levels"] > 0.95 and abs(unlinked["corr_changes"]) < 0.4
    # over many unrelated pairs the base rate is roughly uniform: rarely below 0.05
    shares = [
        controls.diff_correlation(
            np.cumsum(rng.uniform(0, 1, 60)), np.cumsum(rng.uniform(0, 1, 60))
        )["share_shifts_as_strong"]
        for _ in range(100)
    ]
    assert np.mean(np.array(shares) < 0.05) < 0.15
    c = a + rng.normal(0, 0.05, 60)  # c moves with a
    linked = controls.diff_correlation(a, c)
    assert linked["corr_changes"] > 0.8 and linked["share_shifts_as_strong"] == 0.0


def test_sink_control_probes():
    p = headscope.Probe("text", [[9, 1, 2, 3], [9, 4, 5, 6]])
    assert controls.with_first_token(p, [7, 8]).sequences == [[7, 1, 2, 3], [8, 4, 5, 6]]
    assert controls.with_token_at(p, 9, 2, drop_first=True).sequences == [
        [1, 2, 9, 3],
        [4, 5, 9, 6],
    ]
    with pytest.raises(HeadscopeError, match="1 tokens for 2 sequences"):
        controls.with_first_token(p, [7])


def _oracle_change(model, probe, interventions):
    """Second-copy loss change by two plain full forwards and F.cross_entropy (no resume)."""
    x = torch.tensor(probe.sequences)
    L = probe.repeat_len
    losses = []
    for ivs in ([], interventions):
        logits = model.run(x, interventions=ivs, output="logits").double()
        t = torch.arange(L + 2, 2 * L + 1)  # target tokens, predicted from t - 1
        ce = F.cross_entropy(
            logits[:, t - 1].reshape(-1, logits.shape[-1]), x[:, t].reshape(-1), reduction="sum"
        )
        losses.append(float(ce))
    return (losses[1] - losses[0]) / (x.shape[0] * (L - 1))


@pytest.mark.parametrize("ablation", ["mean", "zero", "resample"])
def test_group_effects_match_plain_forwards(tiny_gpt2, ablation):
    model = tiny_gpt2
    probe = headscope.repeat_probe(model, repeat_len=6, n_sequences=4, seed=0)
    group = [(1, 0), (1, 2), (0, 3)]
    means = head_means(model, probe, batch_size=4)
    sums = controls.group_effects(
        model, probe, {"g": group, "none": []}, ablation=ablation, means=means, batch_size=4
    )
    got = float(sums["g"][0].sum() / sums["g"][1].sum())
    x = torch.tensor(probe.sequences)
    if ablation == "mean":
        ivs = [ReplaceHeadOutput(la, h, means[la, h]) for la, h in group]
    elif ablation == "zero":
        ivs = [ReplaceHeadOutput(la, h, 0.0) for la, h in group]
    else:
        outs = {}

        def record(call):
            out = call.output()
            outs[call.layer] = out
            return out

        model.run(x, handler=record)
        ivs = [ReplaceHeadOutput(la, h, outs[la][:, :, h].roll(1, dims=0)) for la, h in group]
    assert got == pytest.approx(_oracle_change(model, probe, ivs), abs=1e-5)
    assert float(sums["none"][0].abs().sum()) == 0.0
    table = controls.effects_table(sums)
    row = table.set_index("ablated").loc["g"]
    assert row.ci_low <= row.change <= row.ci_high and row.sequences == 4


def test_group_ablation_study_sets_each_group_beside_its_random_groups(tiny_gpt2):
    model = tiny_gpt2
    probe = headscope.repeat_probe(model, repeat_len=6, n_sequences=4, seed=0)
    heads = [(layer, h) for layer in range(model.n_layers) for h in range(model.n_heads)]
    table, random = controls.group_ablation_study(
        model, probe, {"pair": heads[:2], "one": heads[2:3]}, heads[3:], n_random=5, batch_size=4
    )
    assert sorted(random["size"].value_counts().to_dict().items()) == [(1, 5), (2, 5)]
    assert set(table["ablation"]) == {"mean", "zero", "resample"} and len(table) == 6
    mean = table[table["ablation"] == "mean"].set_index("group")
    assert mean.loc["pair", "n_random"] == 5
    share = (random[random["size"] == 2]["change"] >= mean.loc["pair", "change"]).mean()
    assert mean.loc["pair", "share_random_ge"] == share
    assert (table["ci_low"] <= table["change"] + 1e-12).all() and (
        table["change"] <= table["ci_high"] + 1e-12
    ).all()


def test_induction_scores_match_the_scan_with_and_without_an_ablation(tiny_gpt2):
    model = tiny_gpt2
    probe = headscope.repeat_probe(model, repeat_len=6, n_sequences=3, seed=0)
    layers = list(range(model.n_layers))
    for ivs in ([], [ReplaceHeadOutput(0, 1, 0.0)]):
        got = controls.induction_scores(model, probe, layers, ivs)
        scan = headscope.scan(
            model, [probe], metrics=["induction"], interventions=ivs, bootstrap=0
        ).scores
        want = scan.pivot(index="layer", columns="head", values="score").to_numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_composition_patches_each_input_from_the_ablated_run(tiny_gpt2):
    model = tiny_gpt2
    probe = headscope.repeat_probe(model, repeat_len=6, n_sequences=3, seed=0)
    means = head_means(model, probe, batch_size=3)
    last = model.n_layers - 1
    table = controls.composition(model, probe, (0, 1), means[0, 1], [last])
    by = table.groupby("condition")
    assert set(by.groups) == {
        "clean",
        "all (head ablated)",
        f"keys of layers {last}-{last} only",
        f"queries of layers {last}-{last} only",
        f"values of layers {last}-{last} only",
    }
    clean = by.get_group("clean")["induction"].to_numpy()
    full = by.get_group("all (head ablated)")["induction"].to_numpy()
    assert not np.allclose(clean, full)  # the ablation reaches the last layer
    # patching queries and keys together from the ablated run reproduces the ablated pattern exactly
    x = torch.tensor(probe.sequences)
    abl = controls.attention_inputs_of(model, x, [last], [ReplaceHeadOutput(0, 1, means[0, 1])])
    both = controls.induction_scores(
        model,
        probe,
        [last],
        [controls.PatchInputs(last, query=abl[last]["query"], key=abl[last]["key"])],
    )
    np.testing.assert_allclose(both[0], full, atol=1e-6)
    # values do not enter the pattern: a values-only patch leaves the induction scores clean
    vals = by.get_group(f"values of layers {last}-{last} only")["induction"].to_numpy()
    np.testing.assert_allclose(vals, clean, atol=1e-6)
