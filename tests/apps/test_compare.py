"""Saved runs side by side: tables equal plain pandas computations, figures draw those numbers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import headscope
from headscope.apps.compare import (
    format_differences,
    format_summary,
    head_differences,
    load_runs,
    read_run,
    run_labels,
    summary,
    write_comparison,
)
from headscope.errors import HeadscopeError
from headscope.report.compare import (
    difference_figure,
    difference_limit,
    distribution_figure,
    same_shape,
)


@pytest.fixture(scope="module")
def run_dirs(tiny_gpt2, tiny_bert, tmp_path_factory) -> dict[str, Path]:
    """gpt2 seeds 0 and 1, bert, and a gpt2 run cut to layer 0 (another shape); no figures
    (speed)."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, model, seed in [
        ("gpt2-s0", tiny_gpt2, 0),
        ("gpt2-s1", tiny_gpt2, 1),
        ("bert", tiny_bert, 0),
    ]:
        result = headscope.scan(
            model, headscope.default_probes(model, n_prompts=4, repeat_len=8, seed=seed)
        )
        out[name] = headscope.save_run(result, root / name, figures=False)
        if name == "gpt2-s0":
            cut = replace(
                result, scores=result.scores[result.scores["layer"] == 0].reset_index(drop=True)
            )
            out["gpt2-cut"] = headscope.save_run(cut, root / "gpt2-cut", figures=False)
    return out


def scores_of(path: Path) -> pd.DataFrame:
    return pd.read_csv(path / "scores.csv", keep_default_na=False, na_values=["NaN"])


def test_labels():
    assert run_labels(["/tmp/abc/tiny", "/x/bert"], [Path("a"), Path("b")]) == ["tiny", "bert"]
    assert run_labels(["m", "m"], [Path("r/s0"), Path("r/s1")]) == ["s0", "s1"]
    assert run_labels(["m", "m"], [Path("a/run"), Path("b/run")]) == ["a/run", "b/run"]


def test_load_runs_labels_seeds_by_directory(run_dirs):
    runs = load_runs([run_dirs["gpt2-s0"], run_dirs["gpt2-s1"]])
    assert list(runs) == ["gpt2-s0", "gpt2-s1"]  # same model: the directory names tell them apart
    runs = load_runs([run_dirs["gpt2-s0"], run_dirs["bert"]])
    assert list(runs) == [
        Path(headscope.load_run(run_dirs[k]).model_name).name for k in ("gpt2-s0", "bert")
    ]


def test_summary_equals_pandas(run_dirs):
    paths = [run_dirs["gpt2-s0"], run_dirs["gpt2-s1"], run_dirs["bert"]]
    runs = load_runs(paths)
    table = summary(runs)
    assert len(table) == 3 * 8  # 8 metrics x 3 runs
    for label, path in zip(runs, paths, strict=True):
        raw = scores_of(path)
        for metric, sub in raw.groupby("metric"):
            row = table[(table["run"] == label) & (table["metric"] == metric)].iloc[0]
            np.testing.assert_equal(row["max"], sub["score"].max())
            np.testing.assert_equal(row["mean"], sub["score"].mean())
            assert row["labelled"] == (sub["label"] != "").sum()
            np.testing.assert_equal(row["chance"], sub["chance"].iloc[0])
            assert row["heads"] == len(sub) == 8
            if sub["score"].notna().any():
                best = sub.loc[
                    sub["score"].idxmin() if metric == "entropy" else sub["score"].idxmax()
                ]
                assert row["top_head"] == f"L{best['layer']}H{best['head']}"
                # the top head's own score (entropy: the minimum)
                assert row["top_score"] == best["score"]
    causal_next = table[(table["metric"] == "next_token") & (table["run"] != list(runs)[2])]
    assert causal_next["max"].isna().all() and "NaN" in format_summary(table)


def test_seed_differences_are_per_head_score_differences(run_dirs):
    a, b = run_dirs["gpt2-s0"], run_dirs["gpt2-s1"]
    runs = load_runs([a, b])
    diffs = head_differences(runs)
    sa, sb = scores_of(a), scores_of(b)
    for metric in ("induction", "duplicate_token", "previous_token"):
        expected = (
            sb[sb.metric == metric].set_index(["layer", "head"])["score"]
            - sa[sa.metric == metric].set_index(["layer", "head"])["score"]
        )
        got = diffs[diffs.metric == metric].set_index(["layer", "head"])["diff"]
        pd.testing.assert_series_equal(got.sort_index(), expected.sort_index(), check_names=False)
        assert list(diffs[diffs.metric == metric]["abs_diff"]) == sorted(
            expected.abs(), reverse=True
        )
    # The seed changes only the repeat probe: text metrics agree head by head, repeat metrics do
    # not.
    assert (diffs[diffs.metric == "previous_token"]["diff"] == 0).all()
    assert (diffs[diffs.metric == "induction"]["abs_diff"] > 0).any()
    assert "next_token" not in set(diffs.metric)  # NaN on causal models: no differences
    top = head_differences(runs, k=2)
    assert top.groupby("metric").size().max() == 2


def test_three_runs_spread(run_dirs):
    paths = [run_dirs["gpt2-s0"], run_dirs["gpt2-s1"], run_dirs["bert"]]
    runs = load_runs(paths)
    diffs = head_differences(runs)
    sink = diffs[diffs.metric == "sink"].set_index(["layer", "head"])
    wide = pd.concat(
        [
            scores_of(p).query("metric == 'sink'").set_index(["layer", "head"])["score"]
            for p in paths
        ],
        axis=1,
    )
    np.testing.assert_allclose(
        sink["diff"].sort_index(), (wide.max(axis=1) - wide.min(axis=1)).sort_index()
    )


def test_different_shapes(run_dirs, tmp_path):
    runs = load_runs([run_dirs["gpt2-s0"], run_dirs["gpt2-cut"]])
    assert not same_shape(runs)
    with pytest.raises(HeadscopeError, match=r"same layers x heads.*2x4.*1x4"):
        head_differences(runs)
    paths = write_comparison(runs, tmp_path / "cmp")
    assert [p.name for p in paths] == ["compare.csv", "distributions.png"]  # no per-head outputs


def test_write_comparison_two_runs(run_dirs, tmp_path):
    runs = load_runs([run_dirs["gpt2-s0"], run_dirs["gpt2-s1"]])
    paths = write_comparison(runs, tmp_path / "cmp")
    assert [p.name for p in paths] == [
        "compare.csv",
        "head_diffs.csv",
        "distributions.png",
        "difference.png",
    ]
    back = pd.read_csv(paths[0], keep_default_na=False, na_values=["NaN"])
    pd.testing.assert_frame_equal(
        back, summary(runs), check_dtype=False, check_exact=False, rtol=1e-7
    )
    diffs = pd.read_csv(paths[1])
    assert list(diffs.columns) == [
        "metric",
        "layer",
        "head",
        "head_name",
        "gpt2-s0",
        "gpt2-s1",
        "diff",
        "abs_diff",
        "beyond_ci",
    ]  # the runs carry bootstrap intervals


def test_a_comparison_written_before_top_score_is_replaced(run_dirs, tmp_path):
    runs = load_runs([run_dirs["gpt2-s0"], run_dirs["gpt2-s1"]])
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.csv").write_text(
        "metric,run,model,heads,max,mean,labelled,chance,top_head\ninduction,a,m,8,1,1,1,0,L0H0\n"
    )
    write_comparison(runs, out)
    assert pd.read_csv(out / "compare.csv").columns[-1] == "top_score"
    # not ours: refused, left as it was
    (out / "compare.csv").write_text("metric,run,my own column\n")
    with pytest.raises(HeadscopeError):
        write_comparison(runs, out)
    assert (out / "compare.csv").read_text() == "metric,run,my own column\n"


def test_distribution_figure_plots_every_head(run_dirs):
    runs = load_runs([run_dirs["gpt2-s0"], run_dirs["bert"]])
    fig = distribution_figure(runs)
    assert [ax.get_title() for ax in fig.axes] == [
        m + (" (nats)" if m == "entropy" else "") for m in runs[next(iter(runs))]["metric"].unique()
    ]
    ax = fig.axes[0]  # previous_token
    for label, scores in runs.items():
        (dots,) = [c.get_offsets()[:, 1] for c in ax.collections if c.get_label() == label]
        expected = scores.loc[scores.metric == "previous_token", "score"].to_numpy()
        np.testing.assert_allclose(np.sort(dots), np.sort(expected))
    assert [t.get_text() for t in ax.get_xticklabels()] == list(runs)


def test_difference_figure_draws_second_minus_first(run_dirs):
    runs = load_runs([run_dirs["gpt2-s0"], run_dirs["gpt2-s1"]])
    fig = difference_figure(runs)
    a, b = runs.values()
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    ax = fig.axes[[ax.get_title() for ax in fig.axes].index("induction")]
    expected = b[b.metric == "induction"].pivot(index="layer", columns="head", values="score") - a[
        a.metric == "induction"
    ].pivot(index="layer", columns="head", values="score")
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), expected.to_numpy())
    # the largest |difference|, rounded up: small seed differences show
    lim = difference_limit(expected.to_numpy())
    assert ax.images[0].get_clim() == (-lim, lim) and len(titles) == 8
    assert (
        np.abs(expected.to_numpy()).max() <= lim < 10 * max(np.abs(expected.to_numpy()).max(), 1e-4)
    )
    with pytest.raises(HeadscopeError, match="exactly two runs"):
        difference_figure(load_runs([run_dirs["gpt2-s0"], run_dirs["gpt2-s1"], run_dirs["bert"]]))


def test_bad_run_directories(run_dirs, tmp_path):
    with pytest.raises(
        HeadscopeError,
        match=r"does not exist; give a directory written by "
        r"`headscope scan`\. Did you mean: .*gpt2-s0",
    ):
        read_run(run_dirs["gpt2-s0"].parent / "gpt2-s9")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HeadscopeError, match=r"is not a headscope run directory \(no scores.csv\)"):
        read_run(tmp_path / "empty")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(HeadscopeError, match="is not a directory"):
        read_run(tmp_path / "file.txt")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "scores.csv").write_text("a,b\n1,2\n")
    with pytest.raises(
        HeadscopeError,
        match="lacks model, metric, probe, layer, head, head_name, score, chance, n, label; a run",
    ):
        read_run(tmp_path / "bad")
    with pytest.raises(HeadscopeError, match="at least two run directories, got 1"):
        load_runs([run_dirs["bert"]])
    same = run_dirs["bert"]
    with pytest.raises(HeadscopeError, match="are the same run directory"):
        load_runs([same, same.parent / ".." / same.parent.name / same.name])


# ------------------------------------------------------------------------------ hand-built tables


def hand_run(model: str, scores: dict[str, list[float]], chance: float = 0.25) -> pd.DataFrame:
    """A 1-layer x len(scores) heads run; labels where the registered threshold passes."""
    rows = []
    for metric, values in scores.items():
        m = headscope.get_metric(metric)
        for h, s in enumerate(values):
            rows.append(
                {
                    "model": model,
                    "metric": metric,
                    "probe": m.probe,
                    "layer": 0,
                    "head": h,
                    "head_name": f"L0H{h}",
                    "score": s,
                    "chance": chance,
                    "n": 10,
                    "label": m.label if m.passes(s) else "",
                }
            )
    return pd.DataFrame(rows)


HAND = {
    "a": hand_run(
        "org/a", {"induction": [0.1, 0.8], "entropy": [0.2, 1.4], "next_token": [np.nan, np.nan]}
    ),
    "b": hand_run("org/b", {"induction": [0.5, 0.2], "entropy": [0.9, 0.1], "sink": [0.7, 0.1]}),
}


def test_summary_of_hand_built_runs():
    table = summary(HAND)
    assert table[["metric", "run"]].values.tolist() == [
        ["induction", "a"],
        ["induction", "b"],
        ["entropy", "a"],
        ["entropy", "b"],
        # metrics in first-seen order; a run without one is skipped
        ["next_token", "a"],
        ["sink", "b"],
    ]
    row = table.set_index(["metric", "run"])
    assert row.loc[("induction", "a"), ["max", "mean", "labelled", "top_head"]].tolist() == [
        0.8,
        0.45,
        1,
        "L0H1",
    ]
    # lowest, its own score
    assert row.loc[("entropy", "b"), ["top_head", "top_score"]].tolist() == ["L0H1", 0.1]
    assert row.loc[("entropy", "b"), "labelled"] == 1
    assert (
        np.isnan(row.loc[("next_token", "a"), "max"])
        and row.loc[("next_token", "a"), "top_head"] == ""
    )


def test_format_summary_lines():
    assert format_summary(summary(HAND)).splitlines() == [
        "metric           run              max    mean  labelled  chance  top head",
        "induction        a              0.800   0.450       1/2   0.250  L0H1 0.800",
        "induction        b              0.500   0.350       1/2   0.250  L0H0 0.500",
        "entropy          a              1.400   0.800       1/2   0.250  L0H0 0.200",
        "entropy          b              0.900   0.500       1/2   0.250  L0H1 0.100",
        "next_token       a                NaN     NaN       0/2   0.250  ",
        "sink             b              0.700   0.400       1/2   0.250  L0H0 0.700",
    ]


def test_differences_of_hand_built_runs():
    diffs = head_differences(HAND)
    assert sorted(set(diffs.metric)) == ["entropy", "induction"]  # only metrics both runs have
    ind = diffs[diffs.metric == "induction"]
    assert ind["head_name"].tolist() == ["L0H1", "L0H0"]  # largest |b - a| first
    assert ind["diff"].tolist() == pytest.approx([-0.6, 0.4])
    assert format_differences(diffs, ["a", "b"], k=1).splitlines() == [
        "largest per-head differences (b - a):",
        "  induction        L0H1 -0.600",
        "  entropy          L0H1 -1.300",
    ]
    three = {**HAND, "c": hand_run("org/c", {"induction": [0.3, 0.3], "entropy": [0.2, 0.2]})}
    spread = head_differences(three)
    # max - min
    assert spread[spread.metric == "induction"]["diff"].tolist() == pytest.approx([0.6, 0.4])
    assert format_differences(spread, list(three), k=1).splitlines()[:2] == [
        "largest per-head differences (max - min over runs):",
        "  induction        L0H1 0.600",
    ]


def test_run_labels_last_resort():
    assert run_labels(["org/m", "m"], [Path("r/x"), Path("r/x")]) == ["m#0", "m#1"]


def test_check_folder(tmp_path):
    from headscope.apps.compare import check_folder

    assert check_folder(tmp_path / "new") == tmp_path / "new" and not (tmp_path / "new").exists()
    assert check_folder(tmp_path) == tmp_path
    (tmp_path / "f").write_text("x")
    with pytest.raises(
        HeadscopeError,
        match=r"^--out '.*f' exists and is not a directory; choose "
        r"another --out\.$",
    ):
        check_folder(tmp_path / "f")


def test_runs_with_effects_compare_like_any_other_score(tiny_gpt2, tmp_path):
    """Effect rows are scores too: in the summary, the per-head differences and the figures."""
    from headscope.apps.compare import compare_dirs
    from headscope.effects.heads import EffectSettings

    dirs = []
    for seed in (0, 1):
        probes = headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=4, seed=seed)
        result = headscope.scan(tiny_gpt2, probes, effects=EffectSettings("exact", n_sequences=2))
        dirs.append(headscope.save_run(result, tmp_path / f"s{seed}", figures=False))
    text, paths = compare_dirs(dirs, tmp_path / "cmp")
    assert "effect_repeat_loss" in text and "copying" in text
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert {"effect_repeat_loss", "effect_text_loss", "value_sink"} <= set(table.metric)
    diffs = pd.read_csv(tmp_path / "cmp" / "head_diffs.csv")
    assert (diffs.loc[diffs.metric == "effect_repeat_loss", "abs_diff"] >= 0).all()
    assert [p.name for p in paths][-1] == "difference.png"
