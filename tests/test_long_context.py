"""Long-context heads: the prose corpus, the long and needle probes, streaming and retrieval on every
engine, and the KV plan's restricted runs (kernel against masks), memory counting and CLI refusals.

The long prose corpus downloads once from PyPI (``brotli==1.2.1`` sdist, 7.4 MB) into the cache.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

import headscope
from headscope import kvplan
from headscope.cli import main
from headscope.corpus import long_text
from headscope.errors import HeadscopeError
from headscope.long_probes import long_text_probe, needle_probe
from headscope.probes import packed_text_probe
from scripts import conformance as conf

LONG = ["sink", "streaming", "retrieval", "retrieval_soft"]


@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama with grouped-query attention (4 query heads, 2 KV heads), 256 positions."""
    fam = next(f for f in conf.FAMILIES if f.model_type == "llama")
    hf, tok = conf.tiny_model(fam)
    return headscope.load_model(hf, tok, name="tiny-llama")


def test_corpus_is_real_prose_and_parts_are_apart():
    scan, held = long_text("scan"), long_text("heldout")
    assert len(scan) > 400_000 and len(held) > 140_000
    assert "Workshop on Electronic Texts" in scan and "Alice was beginning to get very tired" in held
    assert scan[:2000] not in held and held[5000:7000] not in scan
    assert "\r" not in scan and "***" not in scan


def test_long_text_probe_is_distinct_windows_never_wrapped(llama):
    p = long_text_probe(llama, 200, 5)
    assert [len(s) for s in p.sequences] == [200] * 5 and all(s[0] == llama.bos_id for s in p.sequences)
    flat = [t for s in p.sequences for t in s[1:]]
    from headscope.long_probes import corpus_ids

    assert flat == corpus_ids(llama)[: 5 * 199]  # consecutive, non-overlapping windows of the corpus
    assert p.settings["corpus"]["sha256"].startswith("5314ba1d")
    fits = len(corpus_ids(llama)) // 199
    with pytest.raises(HeadscopeError, match=f"enough for {fits} distinct sequences of 200 tokens"):
        long_text_probe(llama, 200, fits + 1)


def test_packing_short_prompts_refuses_to_wrap(tiny_gpt2):
    pairs = [("A cat sat.", "A dog ran.")]
    with pytest.raises(HeadscopeError, match="would repeat the text inside the probe"):
        packed_text_probe(tiny_gpt2, pairs, seq_len=60, n_sequences=3)
    wrapped = packed_text_probe(tiny_gpt2, pairs, seq_len=60, n_sequences=3, wrap=True)
    assert wrapped.settings["wrapped"] is True


def test_needle_layout_and_targets(llama):
    p = needle_probe(llama, [120, 200], depths=(0.0, 0.5, 1.0), k=5, seed=3)
    assert [len(s) for s in p.sequences] == [120] * 3 + [200] * 3
    for i, (ids, nd) in enumerate(zip(p.sequences, p.needles, strict=True)):
        needle = ids[nd["needle_start"]: nd["needle_start"] + 5]
        assert ids[nd["answer_start"]:] == needle  # given back at the very end
        targets = p.targets(i)
        assert sorted(targets) == list(range(nd["answer_start"] - 1, nd["answer_start"] + 4))
        assert [ids[k] for k in targets.values()] == needle  # the key each answer query should copy
    assert p.needles[0]["needle_start"] < p.needles[2]["needle_start"]  # depth 0 before depth 1
    with pytest.raises(HeadscopeError, match="does not fit 30 tokens"):
        needle_probe(llama, [30], k=8)
    with pytest.raises(HeadscopeError, match="depths must lie in 0..1"):
        needle_probe(llama, [120], depths=(1.5,))


def test_streaming_and_retrieval_agree_across_engines(llama):
    text = long_text_probe(llama, 240, 2)
    text.settings["band"] = [2, 16]
    needle = needle_probe(llama, [150, 240], depths=(0.2, 0.8), k=4)
    got = {e: headscope.scan(llama, [text, needle], metrics=LONG, engine=e, bootstrap=0, null=False,
                             examples=False).scores for e in ("fused", "blocked", "hooks")}
    ref = got["fused"]
    for e in ("blocked", "hooks"):
        assert np.allclose(got[e].score, ref.score, atol=1e-5, equal_nan=True), e
        assert np.allclose(got[e].chance, ref.chance, atol=1e-7) and (got[e].n == ref.n).all()
    stream = ref[ref.metric == "streaming"]
    assert int(stream.n.iloc[0]) == 2 * (240 - 18)  # queries q >= sinks + window
    # closed form chance: a uniform head keeps 18 of q+1 keys
    want = np.mean([18 / (q + 1) for _ in range(2) for q in range(18, 240)])
    assert stream.chance.iloc[0] == pytest.approx(want, abs=1e-6)
    assert int(ref[ref.metric == "retrieval"].n.iloc[0]) == 4 * 4


def test_retrieval_hits_are_the_argmax_on_the_target(llama):
    """An oracle over HF eager attention (no headscope metric code): hits where arg-max == target."""
    needle = needle_probe(llama, [160], depths=(0.5,), k=6)
    res = headscope.scan(llama, [needle], metrics=["retrieval", "retrieval_soft"], engine="fused", bootstrap=0,
                         null=False, examples=False).scores
    A = conf.eager_attentions(llama.hf, needle.sequences[0])  # [layer, head, q, k]
    t = needle.targets(0)
    qs, ks = torch.tensor(list(t)), torch.tensor(list(t.values()))
    hits = (A[:, :, qs].argmax(-1) == ks).double().mean(-1)
    soft = A[:, :, qs, ks].mean(-1)
    r = res[res.metric == "retrieval"].sort_values(["layer", "head"]).score.to_numpy().reshape(hits.shape)
    s = res[res.metric == "retrieval_soft"].sort_values(["layer", "head"]).score.to_numpy().reshape(soft.shape)
    assert np.allclose(r, hits.numpy()) and np.allclose(s, soft.numpy(), atol=1e-6)


# ------------------------------------------------------------------------------ the KV plan


def test_kv_saving_counts_only_fully_restricted_kv_heads():
    # 2 layers x 4 query heads, 2 KV heads (heads 0,1 -> KV 0; 2,3 -> KV 1)
    some = frozenset({(0, 0), (0, 2), (1, 2), (1, 3)})
    out = kvplan.kv_saving(some, 2, 4, 2, 8, 1000, 68)
    assert out["kv_heads_dropped"] == 1  # only layer 1's KV head 1
    assert out["kv_saved_bytes"] == (1000 - 68) * 2 * 8 * 4
    assert out["kv_saved_fraction"] == pytest.approx((1000 - 68) / (4 * 1000))


def test_ranking_puts_streaming_first_and_retrieval_heads_last():
    rows = []
    for (layer, head), stream, ret in [((0, 0), 0.99, "retrieval head"), ((0, 1), 0.5, ""), ((1, 0), 0.9, "")]:
        rows += [{"metric": "streaming", "layer": layer, "head": head, "score": stream, "label": ""},
                 {"metric": "retrieval", "layer": layer, "head": head, "score": 0.0, "label": ret}]
    assert kvplan.ranking(pd.DataFrame(rows)) == [(1, 0), (0, 1), (0, 0)]
    with pytest.raises(HeadscopeError, match="no streaming scores"):
        kvplan.ranking(pd.DataFrame(rows[1::2]))


def test_restricted_kernel_run_equals_the_masked_run(llama, monkeypatch):
    """The kernel (tiles skipped) and a per-head mask through the model's own sdpa: same logits."""
    text = long_text_probe(llama, 250, 1, part="heldout")
    x = torch.tensor(text.sequences)
    heads = frozenset({(0, 1), (1, 0), (1, 3)})
    handler = kvplan.Restricted(heads, llama.n_heads, 2, 16)
    fast = llama.run(x, handler=handler, output="logits")
    monkeypatch.setattr(kvplan.kernels, "supports", lambda *a: False)  # force the mask path
    masked = llama.run(x, handler=handler, output="logits")
    full = llama.run(x, output="logits")
    torch.testing.assert_close(fast, masked, atol=2e-5, rtol=1e-5)
    assert float((fast - full).abs().max()) > 1e-3  # restricting changed the model
    wide = kvplan.Restricted(heads, llama.n_heads, 0, 10_000)  # a window holding every key: no change
    torch.testing.assert_close(llama.run(x, handler=wide, output="logits"), full, atol=2e-5, rtol=1e-5)


def test_greedy_decoding_matches_full_forwards(llama):
    prompt = long_text_probe(llama, 60, 1).sequences[0]
    got = llama.greedy(prompt, 5)
    ids = list(prompt)
    for _ in range(5):  # no cache: the argmax of a full forward, one token at a time
        ids.append(int(llama.logits(torch.tensor([ids]))[0, -1].argmax()))
    assert got == ids[len(prompt):]


@pytest.mark.parametrize("path", ["kernel", "mask"])
def test_restricted_greedy_decoding_matches_restricted_full_forwards(llama, monkeypatch, path):
    """Needle accuracy decodes with a KV cache: one query against every cached key at each step. The
    restriction must hold there exactly as in a full forward (same band, counted from the query's
    own position), on the kernel and on the mask path."""
    if path == "mask":
        monkeypatch.setattr(kvplan.kernels, "supports", lambda *a: False)
    prompt = long_text_probe(llama, 120, 1).sequences[0]
    every = frozenset((la, h) for la in range(llama.n_layers) for h in range(llama.n_heads))
    handler = kvplan.Restricted(every, llama.n_heads, 1, 4)
    got = llama.greedy(prompt, 6, handler=handler)
    ids = list(prompt)
    for _ in range(6):  # no cache: the argmax of a full restricted forward, one token at a time
        ids.append(int(llama.run(torch.tensor([ids]), handler=handler, output="logits")[0, -1].argmax()))
    assert got == ids[len(prompt):]
    assert got != llama.greedy(prompt, 6)  # the restriction changes what is decoded: the check has teeth


def test_kv_plan_runs_every_condition(llama):
    text = long_text_probe(llama, 200, 2)
    text.settings["band"] = [2, 16]
    scores = headscope.scan(llama, [text, needle_probe(llama, [200], (0.5,), k=4)], metrics=LONG,
                            bootstrap=0, null=False, examples=False).scores
    st = kvplan.PlanSettings(budgets=(0.25, 1.0), seeds=2, sinks=2, window=16, seq_len=200, n_texts=1,
                             depths=(0.5,), needles_per_depth=1, needle_tokens=4)
    df = kvplan.kv_plan(llama, scores, st)
    assert list(df.condition) == ["full", "streaming_all", "window_all", "plan", "random", "random", "plan",
                                  "random", "random"]
    assert df.loc[0, "loss_delta"] == 0 and df.loc[0, "kv_saved_fraction"] == 0
    every = df[df.budget == 1.0]
    assert (every.heads_restricted == 8).all() and (every.kv_heads_dropped == 4).all()
    plan_all = df[(df.condition == "plan") & (df.budget == 1.0)].iloc[0]
    stream_all = df[df.condition == "streaming_all"].iloc[0]
    assert plan_all.loss == pytest.approx(stream_all.loss)  # the same heads, the same run
    summary = kvplan.summary(df)
    assert list(summary.budget) == [0.25, 1.0]


def test_kvplan_cli_refuses_bad_input_and_writes_nothing(tmp_path, llama):
    run = tmp_path / "run"
    runner = CliRunner()
    for args, msg in [(["--budgets", "0.5,1.5"], "in 0..1"), (["--budgets", "a"], "numbers separated by commas"),
                      (["--window", "5000", "--seq-len", "256"], "keep every key"),
                      (["--needle-tokens", "500", "--seq-len", "256"], "does not fit"),
                      (["--seeds", "-1"], "seeds")]:
        r = runner.invoke(main, ["kvplan", str(run), *args])
        assert r.exit_code == 2 and msg in r.output and len(r.output.strip().splitlines()) == 1, (args, r.output)
    assert not run.exists()
    (run).mkdir()
    (run / "notes.txt").write_text("mine")
    r = runner.invoke(main, ["kvplan", str(run)])
    assert r.exit_code == 2 and "neither a headscope run directory nor a model checkpoint" in r.output
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]


def test_scan_cli_long_context_refusals(tmp_path):
    runner = CliRunner()
    out = tmp_path / "x"
    for args, msg in [(["--long-context", "--seq-len", "64", "--window", "64"], "keep every key"),
                      (["--sinks", "2"], "add --long-context"),
                      (["--long-context", "--needle-tokens", "0"], "needle_tokens")]:
        r = runner.invoke(main, ["scan", "smollm2-135m", "--out", str(out), *args])
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and msg in lines[0], (args, r.output)
        assert not out.exists()


def test_long_context_on_an_encoder_is_refused_before_any_corpus_is_read(tmp_path, monkeypatch):
    from headscope import long_probes
    from tests.tiny_models import make_tiny_bert

    def fetched(*_args, **_kw):
        raise AssertionError("the corpus was read before the encoder was refused")

    monkeypatch.setattr(long_probes, "corpus_ids", fetched)
    bert, out = make_tiny_bert(tmp_path / "bert"), tmp_path / "x"
    r = CliRunner().invoke(main, ["scan", str(bert), "--out", str(out), "--long-context", "--quiet"])
    assert r.exit_code == 2 and r.output.strip().splitlines()[-1].endswith("is an encoder."), r.output
    assert "are for decoders" in r.output and not out.exists()


def test_long_context_run_saves_needles_and_reloads(tmp_path, tiny_gpt2):
    from headscope.config import ScanConfig
    from headscope.rundir import load_run
    from headscope.runner import scan_to_dir

    cfg = ScanConfig(long_context=True, seq_len=128, n_prompts=2, window=16, needle_tokens=4, bootstrap=20)
    res = scan_to_dir(tiny_gpt2, tmp_path / "run", cfg, figures=False)
    recs = [json.loads(line) for line in (tmp_path / "run" / "tokens.jsonl").read_text().splitlines()]
    needles = [r for r in recs if r["probe"] == "needle"]
    lengths = next(p for p in res.probes if p.name == "needle").settings["lengths"]
    assert lengths[-1] == 128 and len(lengths) >= 2  # the full length and shorter ones that fit a needle
    assert len(needles) == 5 * len(lengths) and all("needle" in r for r in needles)  # x 5 depths
    back = load_run(tmp_path / "run")
    probe = next(p for p in back.probes if p.name == "needle")
    assert probe.targets(0) == next(p for p in res.probes if p.name == "needle").targets(0)
    assert {"streaming", "retrieval", "retrieval_soft"} <= set(back.scores.metric)


def test_recompute_script_agrees_on_a_long_context_run(tmp_path, tiny_gpt2_dir):
    """scripts/recompute_scores.py (no headscope metric code) recomputes streaming and retrieval from
    tokens.jsonl and HF eager attention, and agrees with the run."""
    from headscope.config import ScanConfig
    from headscope.runner import scan_to_dir
    from scripts import recompute_scores as rc

    cfg = ScanConfig(long_context=True, seq_len=128, n_prompts=2, sinks=2, window=16, needle_tokens=4, bootstrap=0,
                     metrics=("sink", "streaming", "retrieval", "retrieval_soft", "induction"))
    scan_to_dir(str(tiny_gpt2_dir), tmp_path / "run", cfg, figures=False)
    theirs = pd.read_csv(tmp_path / "run" / "scores.csv")
    ours = rc.recompute(tmp_path / "run")
    summary, problems = rc.compare(ours, theirs, tol=1e-5)
    assert problems == [] and {"streaming", "retrieval", "retrieval_soft"} <= set(summary.index)


def test_kvplan_cli_writes_the_plan_into_the_run(tmp_path, tiny_gpt2_dir):
    from headscope.config import ScanConfig
    from headscope.rundir import foreign_entries
    from headscope.runner import scan_to_dir

    run = tmp_path / "run"
    scan_to_dir(str(tiny_gpt2_dir), run, ScanConfig(long_context=True, seq_len=128, n_prompts=2, window=16,
                                                    needle_tokens=4, bootstrap=0), figures=False)
    args = ["kvplan", str(run), "--budgets", "0.5", "--seeds", "1", "--window", "16", "--seq-len", "128",
            "--texts", "1", "--depths", "0.5", "--needles-per-depth", "1", "--needle-tokens", "4", "-q"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (run / "kvplan").iterdir()) == ["kvplan.csv", "kvplan.json", "kvplan.md",
                                                                  "kvplan.png"]
    df = pd.read_csv(run / "kvplan" / "kvplan.csv")
    assert list(df.condition) == ["full", "streaming_all", "window_all", "plan", "random"]
    assert foreign_entries(run) == []  # the plan counts as headscope's own inside the run
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2 and "already exists" in again.output
    assert CliRunner().invoke(main, [*args, "--force"]).exit_code == 0


def test_kvplan_cli_from_a_model_checks_the_plan_before_it_scans(tmp_path, tiny_gpt2_dir):
    out = tmp_path / "planned"
    small = ["--budgets", "0.5", "--seeds", "1", "--window", "16", "--seq-len", "128", "--depths", "0.5",
             "--needles-per-depth", "1", "--needle-tokens", "4", "-q"]
    # far more held-out text than the corpus holds: refused before the scan writes its run directory
    r = CliRunner().invoke(main, ["kvplan", str(tiny_gpt2_dir), "--out", str(out), *small, "--texts", "100000"])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "distinct" in lines[0], r.output
    assert not out.exists()
    r = CliRunner().invoke(main, ["kvplan", str(tiny_gpt2_dir), "--out", str(out), *small, "--texts", "1"])
    assert r.exit_code == 0, r.output
    assert (out / "scores.csv").is_file() and (out / "kvplan" / "kvplan.csv").is_file()
    scores = pd.read_csv(out / "scores.csv")
    assert {"streaming", "retrieval"} <= set(scores["metric"])
