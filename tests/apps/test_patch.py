"""headscope.patch and its run directory: the tidy table, estimators, kv modes, positions,
one-line refusals; every file written whole and read back, the --force rules, a figure or page
failing alone."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from headscope.apps import patch as api
from headscope.effects.patch_table import COLUMNS
from headscope.effects.patching import KINDS, Request, exact_patching, make_batches
from headscope.errors import HeadscopeError
from headscope.probes.tasks import TokenizedTask
from tests.patch_helpers import random_task


def _late_task(model, n=4, length=9):
    """Every pair of one length; clean and corrupt differ only from position 5 on."""
    tt = random_task(model, n_pairs=n, length=length, n_changed=2, seed=5)
    for i in range(n):
        tt.corrupt[i][1:5] = tt.clean[i][1:5]
    return TokenizedTask(
        tt.name, tt.clean, tt.corrupt, tt.answer, tt.wrong, {"X": [5] * n}, tt.metric
    )


def test_both_estimators_every_kind_every_head(tiny_gqa_llama):
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=4, lengths=[9, 8, 9, 7])
    r = api.patch(
        model, tt, activations=KINDS, positions=["all", "named"], estimator="both", bootstrap=50
    )
    t = r.table
    assert list(t.columns) == COLUMNS and not t["effect"].isna().any()
    assert set(t["position"]) == {"all", "X", "END"} and set(t["estimator"]) == {
        "exact",
        "attribution",
    }
    # per estimator, direction, position: z, q, pattern 3x4 query heads; k, v 3x2 KV heads +
    # 3x4 query heads
    per = t.groupby(["estimator", "direction", "position"]).size()
    assert (per == 3 * 4 * 3 + 2 * (3 * 2 + 3 * 4)).all()
    kv = t[(t["activation"] == "k") & (t["kv_mode"] == "group")]
    assert set(kv["head_name"]) == {f"L{la}KV{g}" for la in range(3) for g in range(2)}
    assert set(kv["query_heads"]) == {"0,1", "2,3"}
    assert (t[t["kv_mode"] == "head"]["head_name"].str.match(r"L\dH\d")).all()
    assert (t["ci_low"] <= t["effect"] + 1e-12).all() and (
        t["effect"] <= t["ci_high"] + 1e-12
    ).all()
    # the table's exact rows are the engine's numbers, and the delta is m_patched - m_base
    got = exact_patching(
        model,
        make_batches(tt, 32, model.pad_id),
        4,
        tt.metric,
        [Request("noising", "v", "group", ("X",), ((2, 1),))],
    )
    row = t[
        (t.estimator == "exact")
        & (t.activation == "v")
        & (t.kv_mode == "group")
        & (t.position == "X")
        & (t.direction == "noising")
        & (t["layer"] == 2)
        & (t["head"] == 1)
    ].iloc[0]
    assert row["m_patched"] == pytest.approx(
        float(got[("noising", "v", "group", "X", 2, 1)].mean()), abs=1e-12
    )
    clean = r.per_pair["m_clean"].mean().item()
    corrupt = r.per_pair["m_corrupt"].mean().item()
    assert row["delta"] == pytest.approx(row["m_patched"] - clean, abs=1e-12)
    assert row["effect"] == pytest.approx((clean - row["m_patched"]) / (clean - corrupt), abs=1e-12)
    b = r.baseline.set_index("prompt")
    assert b.loc["clean", "mean"] == pytest.approx(clean) and b.loc["clean", "n_pairs"] == 4
    assert len(r.dla) == 2 * 3 * 4 and set(r.dla["prompt"]) == {"clean", "corrupt"}


def test_auto_runs_exact_on_the_top_heads_by_attribution(tiny_gqa_llama):
    model = tiny_gqa_llama
    r = api.patch(
        model,
        random_task(model, n_pairs=3),
        activations=["z", "k"],
        estimator="auto",
        bootstrap=0,
        directions="denoising",
    )
    t = r.table
    for _, sub in t.groupby(["activation", "kv_mode"]):
        attr, exact = sub[sub.estimator == "attribution"], sub[sub.estimator == "exact"]
        n = len(attr)
        assert len(exact) == min(n, max(api.TOP_MIN, round(api.TOP_SHARE * n + 0.49)))
        top = attr.reindex(attr["effect"].abs().sort_values(ascending=False).index).head(len(exact))
        assert set(top["head_name"]) == set(exact["head_name"])
    assert t["ci_low"].isna().all()  # bootstrap=0: no intervals


def test_without_grouped_query_the_group_rows_are_the_head_rows(tiny_gpt2):
    r = api.patch(
        tiny_gpt2,
        random_task(tiny_gpt2, n_pairs=3),
        activations=["v"],
        estimator="exact",
        bootstrap=0,
    )
    t = r.table.set_index(["direction", "layer", "head", "kv_mode"])["effect"].unstack("kv_mode")
    assert list(t.columns) == ["group", "head"] and (t["group"] == t["head"]).all()


def test_positions_before_the_first_difference_carry_nothing(tiny_gqa_llama):
    """A patch where clean and corrupt still agree writes identical values: exactly 0."""
    model = tiny_gqa_llama
    r = api.patch(
        model,
        _late_task(model),
        activations=KINDS,
        positions="each",
        estimator="exact",
        bootstrap=0,
    )
    t = r.table
    assert set(t["position"]) == {str(p) for p in range(9)}
    early = t[t["position"].astype(int) < 5]
    assert (early["effect"] == 0.0).all() and (early["delta"] == 0.0).all()
    assert (t[t["position"].astype(int) >= 5]["effect"].abs() > 0).any()


def test_refusals(tiny_gqa_llama, tiny_bert):
    model = tiny_gqa_llama
    tt = random_task(model, n_pairs=2, lengths=[8, 9])
    cases = [
        ({"activations": ["zz"]}, "Did you mean: z?"),
        ({"directions": ["denoise"]}, "Did you mean: denoising?"),
        ({"estimator": "exat"}, "Did you mean: exact?"),
        ({"kv_mode": "groups"}, "Did you mean: group?"),
        ({"positions": ["S3"]}, "Use all, each, named, X, END"),
        ({"positions": "each"}, "one length"),
        ({"metric": "los"}, "Did you mean: loss?"),
        ({"bootstrap": -1}, "bootstrap"),
        ({"batch_size": 0}, "batch_size"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(HeadscopeError) as e:
            api.patch(model, tt, **kwargs)
        assert msg in str(e.value) and "\n" not in str(e.value), kwargs
    with pytest.raises(HeadscopeError, match="encoder"):
        api.patch(tiny_bert, tt)
    with pytest.raises(HeadscopeError, match="Did you mean: ioi"):
        api.patch(model, "ioii")


@pytest.mark.real
def test_ioi_on_smollm2_end_to_end(smollm2):
    r = api.patch(
        smollm2,
        "ioi",
        n_pairs=8,
        activations="z",
        positions=["END"],
        estimator="attribution",
        bootstrap=100,
    )
    b = r.baseline.set_index("prompt")
    assert b.loc["clean", "mean"] > 2 and b.loc["clean", "share_correct"] >= 0.75
    assert b.loc["clean - corrupt", "ci_low"] > 0
    assert len(r.table) == 2 * 270 and torch.isfinite(r.per_pair["m_patched"]).all()
    assert (
        r.metadata["task_provenance"]["kit"] == "ioi"
        and r.metadata["settings"]["estimator"] == "attribution"
    )


# ------------------------------------------------------------------------------ the run directory


@pytest.fixture(scope="module")
def result(tiny_gqa_llama):
    tt = random_task(tiny_gqa_llama, n_pairs=3, length=8)
    return api.patch(
        tiny_gqa_llama,
        tt,
        activations=["z", "v"],
        positions=["all", "X", "each"],
        estimator="both",
        bootstrap=20,
    )


def test_writes_every_file_and_reads_it_back(result, tiny_gqa_llama, tmp_path):
    out = api.save_patching(result, tmp_path / "run")
    names = sorted(p.name for p in out.iterdir())
    meta = json.loads((out / "metadata.json").read_text())
    assert names == meta["files"] and meta["run_format"] == "headscope-patching/1"
    assert {
        "patching.csv",
        "baseline.csv",
        "dla.csv",
        "tokens.jsonl",
        "report.html",
        "dla.png",
        "z-all-denoising-exact.png",
        "z-all-denoising-attribution.png",
        "v-group-X-noising-exact.png",
        "z-by-position-denoising-exact.png",
    } <= set(names)
    assert "figures_skipped" not in meta and "report_skipped" not in meta
    back = api.load_patching(out)
    assert list(back.table.columns) == list(result.table.columns) and len(back.table) == len(
        result.table
    )
    pd.testing.assert_series_equal(
        back.table["effect"], result.table["effect"], rtol=1e-6, check_dtype=False
    )
    assert (back.table["position"] == result.table["position"]).all()  # "7" stays a string, not 7
    lines = [json.loads(x) for x in (out / "tokens.jsonl").read_text().splitlines()]
    assert (
        lines[1]["clean"] == result.tokens.clean[1]
        and lines[1]["corrupt"] == result.tokens.corrupt[1]
    )
    assert lines[1]["answer"] == result.tokens.answer[1] and lines[1]["positions"] == {
        "X": result.tokens.positions["X"][1],
        "END": 7,
    }
    assert back.tokens.clean == result.tokens.clean
    # as complete as a scan's record: model and weights, task, settings, seed, versions, timings
    assert (
        meta["settings"]["estimator"] == "both"
        and meta["seed"] == 0
        and "clean" in meta["baseline"]
    )
    assert meta["source"]["state_dict_sha256"] == tiny_gqa_llama.fingerprint()
    assert meta["task_provenance"] == {"source": "tokenized in code"} and meta["n_pairs"] == 3
    assert {"headscope", "torch", "transformers", "transformer-lens"} <= set(meta["versions"])
    assert {"attribution_s", "exact_s", "dla_s", "write_s"} <= set(meta["timings"])
    assert meta["example"]["clean"] == tiny_gqa_llama.str_tokens(result.tokens.clean[0])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    page = (out / "report.html").read_text()
    assert "<script src" not in page and "http" not in page.split("</title>")[1]  # nothing fetched


def test_force_rules(result, tmp_path, runs):
    out = tmp_path / "run"
    api.save_patching(result, out, figures=False)
    before = (out / "patching.csv").read_bytes()
    with pytest.raises(HeadscopeError, match="already exists"):
        api.save_patching(result, out, figures=False)
    api.save_patching(result, out, force=True, figures=False)  # our own run: replaced
    assert (out / "patching.csv").read_bytes() == before
    (out / "notes.txt").write_text("mine")
    with pytest.raises(HeadscopeError, match="notes.txt"):
        api.save_patching(result, out, force=True, figures=False)
    assert (out / "notes.txt").read_text() == "mine"
    other = tmp_path / "thesis"
    other.mkdir()
    (other / "chapter1.tex").write_text("x")
    with pytest.raises(HeadscopeError, match="not a headscope patching run"):
        api.save_patching(result, other, force=True, figures=False)
    assert (other / "chapter1.tex").read_text() == "x"
    scan_run = runs["gpt2"]  # a scan's run directory is not a patching run: never replaced by one
    with pytest.raises(HeadscopeError, match="not a headscope patching run"):
        api.save_patching(result, scan_run, force=True, figures=False)
    assert (scan_run / "scores.csv").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    api.save_patching(result, empty, force=True, figures=False)  # an empty folder may be filled
    assert (empty / "patching.csv").is_file()


def test_an_error_while_writing_leaves_nothing(result, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", boom)
    with pytest.raises(OSError, match="disk full"):
        api.save_patching(result, tmp_path / "a" / "b" / "run")
    assert (
        list(tmp_path.iterdir()) == []
    )  # neither the run, its temporary folder, nor the parents made


def test_an_interrupt_while_writing_leaves_nothing(result, tmp_path, monkeypatch):
    import os
    import signal

    import headscope.report.patching as figs
    from headscope.rundir.signals import Interrupted, interruptible

    def sigterm(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)  # as Slurm would, in the middle of the figures
        raise AssertionError("not reached")

    monkeypatch.setattr(figs, "save_patch_figures", sigterm)
    with pytest.raises(Interrupted), interruptible():
        api.save_patching(result, tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


def test_a_figure_or_page_that_fails_costs_only_itself(result, tmp_path, monkeypatch):
    import headscope.report.patch_page as page
    import headscope.report.patching as figs

    def broken(*a, **k):
        raise ValueError("cannot draw")

    monkeypatch.setattr(figs, "save_patch_figures", broken)
    monkeypatch.setattr(page, "patch_page_html", broken)
    out = api.save_patching(result, tmp_path / "run", say=lambda m: None)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["figures_skipped"] == "the figures: ValueError: cannot draw"
    assert meta["report_skipped"] == "report.html: ValueError: cannot draw"
    assert sorted(p.name for p in out.iterdir()) == meta["files"]
    assert {"patching.csv", "baseline.csv", "dla.csv", "tokens.jsonl"} <= set(meta["files"])
    assert not [n for n in meta["files"] if n.endswith((".png", ".html"))]


def test_pattern_scores_of_the_same_model_only(tiny_gpt2, tiny_gqa_llama, runs, tmp_path):
    from headscope.apps import runs as api

    scores, meta = api.scan_scores(runs["gpt2"])
    assert {"induction", "previous_token", "sink"} <= set(scores["metric"])
    api.check_same_model(tiny_gpt2, meta, runs["gpt2"])  # the scan's own model
    with pytest.raises(HeadscopeError) as e:
        api.check_same_model(tiny_gqa_llama, meta, runs["gpt2"])
    assert "not of tiny-gqa-llama" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(HeadscopeError, match="not a headscope scan run"):
        api.scan_scores(tmp_path)
