"""Long prose and needle probes: the corpus is real prose whose parts stay apart, windows never
wrap, needles sit where they say, and a long-context run saves and reloads them (and the independent
recomputation agrees). The corpus downloads once from PyPI (``brotli==1.2.1`` sdist, 7.4 MB)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

import headscope
from headscope.cli.main import main
from headscope.errors import HeadscopeError
from headscope.probes.corpus import long_text
from headscope.probes.long import long_text_probe, needle_probe
from headscope.probes.pairs import packed_text_probe
from tests.oracles import conformance as conf

LONG = ["sink", "streaming", "retrieval", "retrieval_soft"]


@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama with grouped-query attention (4 query heads, 2 KV heads), 256
    positions."""
    fam = next(f for f in conf.FAMILIES if f.model_type == "llama")
    hf, tok = conf.tiny_model(fam)
    return headscope.load_model(hf, tok, name="tiny-llama")


# ------------------------------------------------------------------------------ the KV plan


def test_corpus_is_real_prose_and_parts_are_apart():
    scan, held = long_text("scan"), long_text("heldout")
    assert len(scan) > 400_000 and len(held) > 140_000
    assert (
        "Workshop on Electronic Texts" in scan and "Alice was beginning to get very tired" in held
    )
    assert scan[:2000] not in held and held[5000:7000] not in scan
    assert "\r" not in scan and "***" not in scan


def test_long_text_probe_is_distinct_windows_never_wrapped(llama):
    p = long_text_probe(llama, 200, 5)
    assert [len(s) for s in p.sequences] == [200] * 5 and all(
        s[0] == llama.bos_id for s in p.sequences
    )
    flat = [t for s in p.sequences for t in s[1:]]
    from headscope.probes.long import corpus_ids

    # consecutive, non-overlapping windows of the corpus
    assert flat == corpus_ids(llama)[: 5 * 199]
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
        needle = ids[nd["needle_start"] : nd["needle_start"] + 5]
        assert ids[nd["answer_start"] :] == needle  # given back at the very end
        targets = p.targets(i)
        assert sorted(targets) == list(range(nd["answer_start"] - 1, nd["answer_start"] + 4))
        assert [ids[k] for k in targets.values()] == needle  # the key each answer query should copy
    assert p.needles[0]["needle_start"] < p.needles[2]["needle_start"]  # depth 0 before depth 1
    with pytest.raises(HeadscopeError, match="does not fit 30 tokens"):
        needle_probe(llama, [30], k=8)
    with pytest.raises(HeadscopeError, match="depths must lie in 0..1"):
        needle_probe(llama, [120], depths=(1.5,))


def test_long_context_on_an_encoder_is_refused_before_any_corpus_is_read(tmp_path, monkeypatch):
    from headscope.probes import long as long_probes
    from tests.tiny_models import make_tiny_bert

    def fetched(*_args, **_kw):
        raise AssertionError("the corpus was read before the encoder was refused")

    monkeypatch.setattr(long_probes, "corpus_ids", fetched)
    bert, out = make_tiny_bert(tmp_path / "bert"), tmp_path / "x"
    r = CliRunner().invoke(
        main, ["scan", str(bert), "--out", str(out), "--long-context", "--quiet"]
    )
    assert r.exit_code == 2 and r.output.strip().splitlines()[-1].endswith("is an encoder."), (
        r.output
    )
    assert "are for decoders" in r.output and not out.exists()


def test_long_context_run_saves_needles_and_reloads(tmp_path, tiny_gpt2):
    from headscope.rundir.store import load_run
    from headscope.scanner.config import ScanSettings
    from headscope.scanner.runner import scan_to_dir

    cfg = ScanSettings(
        long_context=True, seq_len=128, n_prompts=2, window=16, needle_tokens=4, bootstrap=20
    )
    res = scan_to_dir(tiny_gpt2, tmp_path / "run", cfg, figures=False)
    recs = [
        json.loads(line) for line in (tmp_path / "run" / "tokens.jsonl").read_text().splitlines()
    ]
    needles = [r for r in recs if r["probe"] == "needle"]
    lengths = next(p for p in res.probes if p.name == "needle").settings["lengths"]
    # the full length and shorter ones that fit a needle
    assert lengths[-1] == 128 and len(lengths) >= 2
    assert len(needles) == 5 * len(lengths) and all("needle" in r for r in needles)  # x 5 depths
    back = load_run(tmp_path / "run")
    probe = next(p for p in back.probes if p.name == "needle")
    assert probe.targets(0) == next(p for p in res.probes if p.name == "needle").targets(0)
    assert {"streaming", "retrieval", "retrieval_soft"} <= set(back.scores.metric)


def test_recompute_script_agrees_on_a_long_context_run(tmp_path, tiny_gpt2_dir):
    """scripts/recompute_scores.py (no headscope metric code) recomputes streaming and retrieval
    from
    tokens.jsonl and HF eager attention, and agrees with the run."""
    from headscope.scanner.config import ScanSettings
    from headscope.scanner.runner import scan_to_dir
    from tests.oracles import recompute as rc

    cfg = ScanSettings(
        long_context=True,
        seq_len=128,
        n_prompts=2,
        sinks=2,
        window=16,
        needle_tokens=4,
        bootstrap=0,
        metrics=("sink", "streaming", "retrieval", "retrieval_soft", "induction"),
    )
    scan_to_dir(str(tiny_gpt2_dir), tmp_path / "run", cfg, figures=False)
    theirs = pd.read_csv(tmp_path / "run" / "scores.csv")
    ours = rc.recompute(tmp_path / "run")
    summary, problems = rc.compare(ours, theirs, tol=1e-5)
    assert problems == [] and {"streaming", "retrieval", "retrieval_soft"} <= set(summary.index)
