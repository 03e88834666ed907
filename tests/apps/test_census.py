"""A census run directory: complete, recomputable from its files alone, --force like a scan's, and
nothing left behind on bad input."""

import json
import random
import sys

import pandas as pd
import pytest

from headscope.apps.census import census, census_to_dir
from headscope.apps.census import load_census as load_census_dir
from headscope.apps.settings import CensusSettings
from headscope.errors import HeadscopeError
from headscope.probes import parser, sentences

RELATIONS = ["nsubj", "dobj", "det", "amod", "prep", "pobj"]
SMALL = dict(
    n_sentences=12,
    min_count=5,
    noop_sequences=3,
    repeat_len=6,
    repeat_sequences=2,
    bootstrap=20,
    n_null=10,
    n_prompts=4,
)


def fake_parses(nlp, text):
    """Silver-parse stand-ins: real sentences of the prose, random trees (the protocol does not
    care)."""
    rng = random.Random(0)
    out = []
    for line in text.split("\n\n")[:60]:
        words = line.split()[:10]
        if len(words) < 4:
            continue
        sent = " ".join(words)
        spans, at = [], 0
        for w in words:
            spans.append((at, at + len(w)))
            at += len(w) + 1
        root = rng.randrange(len(words))
        heads = [
            -1 if i == root else rng.choice([j for j in range(len(words)) if j != i])
            for i in range(len(words))
        ]
        rels = ["ROOT" if i == root else rng.choice(RELATIONS) for i in range(len(words))]
        out.append((sent, words, [True] * (len(words) - 1) + [False], spans, heads, rels))
    return out


@pytest.fixture
def no_spacy_parser(monkeypatch):
    monkeypatch.setattr(parser, "require_spacy", lambda: None)
    monkeypatch.setattr(parser, "load_parser", lambda progress=None: None)
    monkeypatch.setattr(
        parser, "provenance", lambda: {"name": "test stand-in", "uas": 0.0, "las": 0.0}
    )
    monkeypatch.setattr(sentences, "parsed_sentences", fake_parses)


@pytest.fixture(scope="module")
def gpt2_run(tiny_gpt2, tmp_path_factory):
    """A whole census of the tiny GPT-2 (every part), with fake parses."""
    mp = pytest.MonkeyPatch()
    mp.setattr(parser, "require_spacy", lambda: None)
    mp.setattr(parser, "load_parser", lambda progress=None: None)
    mp.setattr(parser, "provenance", lambda: {"name": "test stand-in", "uas": 0.0, "las": 0.0})
    mp.setattr(sentences, "parsed_sentences", fake_parses)
    try:
        out = census(tiny_gpt2, tmp_path_factory.mktemp("census") / "run", CensusSettings(**SMALL))
    finally:
        mp.undo()
    return out


def test_every_part_writes_its_rows_tables_and_records(gpt2_run, tiny_gpt2):
    scores = pd.read_csv(gpt2_run / "scores.csv")
    for col in (
        "model",
        "metric",
        "probe",
        "layer",
        "head",
        "head_name",
        "score",
        "chance",
        "n",
        "label",
        "null",
        "ci_low",
        "ci_high",
    ):
        assert col in scores.columns
    want = {
        "noop_weight",
        "effect_noop_text_loss",
        "effect_text_loss",
        "successor",
        "copy_suppression",
        "rare_word",
        "syntax_all.d2h",
        "syntax_all.h2d",
    }
    assert want <= set(scores.metric)
    assert (scores.groupby("metric").size() == tiny_gpt2.n_layers * tiny_gpt2.n_heads).all()
    measured = scores.dropna(subset=["score"])
    assert (measured.ci_low <= measured.score + 1e-9).all() and (
        measured.score <= measured.ci_high + 1e-9
    ).all()
    assert scores[scores.metric.str.startswith("syntax_")].null.notna().all()  # the best offset
    assert scores[scores.metric == "copy_suppression"].null.notna().all()  # the control token
    meta = json.loads((gpt2_run / "metadata.json").read_text())
    assert meta["run_format"] == "headscope-census/1" and sorted(meta["files"]) == sorted(
        p.name for p in gpt2_run.iterdir()
    )
    for key in (
        "model",
        "source",
        "parser",
        "settings",
        "seed",
        "versions",
        "timings",
        "sentences",
        "successor",
    ):
        assert key in meta, key
    assert "spacy" in meta["versions"] and meta["settings"]["parts"] == list(CensusSettings().parts)
    for f in (
        "syntax_table.csv",
        "syntax_heads.csv",
        "syntax_sentences.jsonl",
        "noop_sequences.csv",
        "tokens.jsonl",
        "summary.md",
        "report.html",
        "syntax_all.d2h.png",
        "rare_word.png",
        "noop_scatter.png",
    ):
        assert (gpt2_run / f).is_file(), f
    page = (gpt2_run / "report.html").read_text()
    assert "SILVER" in page and "UAS" in page
    assert "SILVER" in (gpt2_run / "summary.md").read_text()


def test_the_per_sequence_sums_rebuild_every_noop_row_and_its_interval(gpt2_run, tiny_gpt2):
    """noop_sequences.csv holds what each no-op, weight and ablation row is pooled from: summing
    it gives scores.csv's score, and resampling it (same seed and draws) its interval."""
    from headscope.apps.census import load_census
    from lib.controls import joint_interval, sequence_sums

    run = load_census(gpt2_run)
    table, scores = run["noop_sequences"], run["scores"]
    assert set(table.metric) == {"effect_noop_text_loss", "noop_weight", "effect_text_loss"}
    for metric in set(table.metric):
        total, count = sequence_sums(table, metric)
        assert total.shape == (SMALL["noop_sequences"], tiny_gpt2.n_layers, tiny_gpt2.n_heads)
        rows = scores[scores.metric == metric].sort_values(["layer", "head"])
        pooled = total.sum(0) / count.sum()
        assert pooled.flatten() == pytest.approx(rows.score.to_numpy(), rel=1e-6, abs=1e-9)
        for i in (0, 5):  # two heads' intervals, as the census drew them
            la, h = divmod(i, tiny_gpt2.n_heads)
            _, lo, hi = joint_interval(
                {"x": (total, count)}, lambda s, la=la, h=h: s["x"][la, h], resamples=20
            )
            r = rows.iloc[i]
            assert (lo, hi) == pytest.approx((r.ci_low, r.ci_high), rel=1e-5, abs=1e-9)
    with pytest.raises(HeadscopeError, match="has no rows for 'sink'"):
        sequence_sums(table, "sink")


def test_a_census_without_effects_writes_no_sequence_file(tiny_gpt2, tmp_path):
    out = census(tiny_gpt2, tmp_path / "run", CensusSettings(**SMALL, parts=("rare_word",)))
    assert not (out / "noop_sequences.csv").exists()
    assert load_census_dir(out)["noop_sequences"] is None


def test_the_page_is_self_contained(gpt2_run):
    page = (gpt2_run / "report.html").read_text()
    assert 'name="generator" content="headscope"' in page and "data:image/png;base64," in page
    for fetch in ('src="http', 'href="http', "<script src", "<link"):
        assert fetch not in page


def test_the_run_recomputes_from_its_files_alone(gpt2_run, tiny_gpt2_dir):
    """Plain HF modules and loops (tests.oracles.recompute_census), sharing no census code."""
    from tests.oracles.recompute_census import compare, recompute

    theirs = pd.read_csv(gpt2_run / "scores.csv")
    ours = recompute(gpt2_run, tiny_gpt2_dir)
    n, problems = compare(ours, theirs)
    assert problems == [] and n == len(theirs)


def test_an_encoder_census_with_the_embeddings_readout(
    tiny_bert, tmp_path, no_spacy_parser, tiny_bert_dir
):
    from tests.oracles.recompute_census import compare, recompute

    out = census(tiny_bert, tmp_path / "run", CensusSettings(**SMALL, readout="embeddings"))
    scores = pd.read_csv(out / "scores.csv")
    assert {
        "successor_embeddings",
        "copy_suppression_embeddings",
        "effect_noop_embedding",
        "effect_embedding",
        "noop_weight",
    } <= set(scores.metric)
    assert "successor" not in set(
        scores.metric
    )  # an encoder's rows never pass for an unembedding's
    table = pd.read_csv(out / "syntax_table.csv")
    assert "either" in set(table.direction)
    n, problems = compare(recompute(out, tiny_bert_dir), scores)
    assert problems == [] and n == len(scores)


def test_auto_readout_on_an_encoder_writes_nan_rows_saying_why(tiny_bert, tmp_path):
    out = census(tiny_bert, tmp_path / "run", CensusSettings(**SMALL, parts=("successor",)))
    scores = pd.read_csv(out / "scores.csv")
    assert scores.score.isna().all() and set(scores.metric) == {"successor"}
    assert "no trained unembedding" in (out / "summary.md").read_text()


def test_bad_input_is_one_line_and_leaves_nothing(tiny_gpt2, tiny_bert, tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setitem(sys.modules, "spacy", None)  # spaCy not installed
    with pytest.raises(HeadscopeError) as err:
        census(tiny_gpt2, out, CensusSettings(parts=("syntax",)))
    assert "pip install 'headscope[syntax]'" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(HeadscopeError) as err:
        census(tiny_bert, out, CensusSettings(parts=("copy_suppression",), readout="unembedding"))
    assert "no trained unembedding" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(HeadscopeError) as err:
        CensusSettings(parts=("syntax", "noop", "nope"))
    assert "Unknown census part 'nope'" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_tokenizer_without_offsets_is_refused_before_any_work(
    tiny_gpt2, tmp_path, no_spacy_parser
):
    from dataclasses import replace

    real = tiny_gpt2.tokenizer

    class NoOffsets:  # a Python ("slow") tokenizer: everything but offsets
        def __call__(self, text, return_offsets_mapping=False, **kw):
            if return_offsets_mapping:
                raise NotImplementedError(
                    "return_offset_mapping is not available when using Python tokenizers"
                )
            return real(text, **kw)

        def __getattr__(self, name):
            return getattr(real, name)

    model = replace(tiny_gpt2, tokenizer=NoOffsets())
    with pytest.raises(HeadscopeError) as err:
        census(model, tmp_path / "run", CensusSettings(parts=("syntax",)))
    assert "cannot map words to tokens" in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_an_empty_ordinal_set_is_refused_before_any_work(tiny_gpt2, tmp_path, monkeypatch):
    from headscope.circuits import successor

    monkeypatch.setattr(successor, "SETS", {"number_words": successor.SETS["number_words"]})
    with pytest.raises(HeadscopeError) as err:
        census(tiny_gpt2, tmp_path / "run", CensusSettings(parts=("successor",)))
    assert "No ordinal set" in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_force_follows_a_scans_rules(gpt2_run, tiny_gpt2, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(gpt2_run, run)
    st = CensusSettings(parts=("rare_word",), n_prompts=2, bootstrap=10)
    with pytest.raises(HeadscopeError, match="already exists"):
        census(tiny_gpt2, run, st)
    from headscope.rundir.store import check_out_dir

    with pytest.raises(HeadscopeError, match="not a headscope run"):
        check_out_dir(run, force=True)  # a scan's --force never replaces a census run
    census(tiny_gpt2, run, st, force=True, figures=False)  # a census run: replaced whole
    assert set(pd.read_csv(run / "scores.csv").metric) == {"rare_word"}
    (run / "notes.txt").write_text("mine")
    with pytest.raises(HeadscopeError, match="did not write"):
        census(tiny_gpt2, run, st, force=True)
    other = tmp_path / "thesis"
    other.mkdir()
    (other / "chapter.tex").write_text("x")
    with pytest.raises(HeadscopeError, match="not a headscope census run"):
        census_to_dir(tiny_gpt2, other, st, force=True)
    assert (other / "chapter.tex").read_text() == "x" and (run / "notes.txt").is_file()


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_bert"])
def test_the_syntax_patterns_agree_across_engines(fixture, request):
    """Word maps need each head's full pattern: the blocked and hooks engines hand over the same
    one (1e-5), one sequence at a time or batched with padding."""
    import torch

    from headscope.census.syntax import attention_maps

    model = request.getfixturevalue(fixture)
    texts = ("The cat sat on the mat.", "A dog.", "Rivers flood in the spring rain")
    seqs = [model.wrap(model.encode(t)) for t in texts]
    got = {}
    for engine, bs in (("hooks", 1), ("blocked", 3), ("hooks", 3), ("blocked", 1)):
        maps = {}
        attention_maps(
            model,
            seqs,
            lambda i, p, maps=maps: maps.__setitem__(i, p),
            batch_size=bs,
            engine=engine,
        )
        got[(engine, bs)] = maps
    ref = got[("hooks", 1)]
    for maps in got.values():
        for i, ids in enumerate(seqs):
            assert maps[i].shape == (model.n_layers, model.n_heads, len(ids), len(ids))
            torch.testing.assert_close(maps[i], ref[i], atol=1e-5, rtol=0)
    rows = ref[0].sum(-1)  # each query's attention sums to 1
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)
