"""The whole scan as one function: scan() on a loaded model, and scan_to_dir(), which is what
`headscope scan` does (every check before the model loads, complete metadata, an atomic run)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import headscope
from headscope.errors import HeadscopeError
from headscope.scanner.config import ScanSettings
from headscope.scanner.runner import default_probes, scan, scan_to_dir
from tests.tiny_models import tiny_gpt2_in_memory

SMALL = ScanSettings(n_prompts=3, repeat_len=5, batch_size=2)


def test_default_probes_builds_only_what_is_asked(tiny_gpt2):
    text, repeat = default_probes(tiny_gpt2, n_prompts=3, repeat_len=5, seed=2)
    assert (text.name, len(text), repeat.name, len(repeat), repeat.repeat_len) == (
        "text",
        3,
        "repeat",
        3,
        5,
    )
    only = default_probes(tiny_gpt2, n_prompts=2, probes=("repeat",))
    assert [p.name for p in only] == ["repeat"] and only[0].repeat_len == ScanSettings().repeat_len
    packed = default_probes(tiny_gpt2, n_prompts=2, seq_len=21)
    assert [len(s) for p in packed for s in p.sequences] == [21, 21, 21, 21]


def test_scan_reports_its_engine_timings_and_thresholds(tiny_gpt2):
    probes = default_probes(tiny_gpt2, n_prompts=3, repeat_len=5)
    result = scan(
        tiny_gpt2, probes, metrics=["sink", "induction"], thresholds={"sink": 0.0}, engine="blocked"
    )
    assert result.metadata["engine"] == "blocked" and set(result.metadata["timings"]) == {
        "scan_text_s",
        "scan_repeat_s",
        "scan_repeat_null_s",
        "examples_s",
    }
    assert [p.name for p in result.probes] == ["text", "repeat", "repeat_null"]
    null = result.scores[result.scores.metric == "induction"]["null"]
    assert (
        null.notna().all()
        and result.scores.loc[result.scores.metric == "sink", "null"].isna().all()
    )
    assert result.thresholds == {"sink": 0.0, "induction": 0.4}
    sink = result.scores[result.scores.metric == "sink"]
    assert (sink.label == "sink head").all() and len(sink) == tiny_gpt2.n_layers * tiny_gpt2.n_heads
    with pytest.raises(HeadscopeError, match="Did you mean: induction"):
        scan(tiny_gpt2, probes, thresholds={"inductoin": 0.5})
    with pytest.raises(HeadscopeError, match=r"batch_size \(--batch-size\) must be at least 1"):
        scan(tiny_gpt2, probes, batch_size=0)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"n_prompts": 0}, "n_prompts"),
        ({"engine": "fastest"}, "Unknown engine"),
        ({"prompts": "/no/such/file.tsv"}, "does not exist"),
    ],
)
def test_scan_to_dir_checks_everything_before_loading(
    settings, message, tmp_path, monkeypatch, tiny_gpt2_dir
):
    monkeypatch.setattr(
        "headscope.scanner.runner.load_model", lambda *a, **k: pytest.fail("the model was loaded")
    )
    with pytest.raises(HeadscopeError, match=message):
        scan_to_dir(str(tiny_gpt2_dir), tmp_path / "run", **settings)
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "mine.txt").write_text("x")
    with pytest.raises(HeadscopeError, match="already exists"):
        scan_to_dir(str(tiny_gpt2_dir), existing, SMALL)
    with pytest.raises(HeadscopeError, match="Did you mean: smollm2-135m"):
        scan_to_dir("smolm2-135m", tmp_path / "run", SMALL)
    with pytest.raises(HeadscopeError, match=r"threads \(--threads\) must be at least 1"):
        scan_to_dir(str(tiny_gpt2_dir), tmp_path / "run", SMALL, threads=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]


def test_scan_to_dir_writes_a_complete_run(tmp_path, tiny_gpt2_dir):
    lines = []
    result = scan_to_dir(
        str(tiny_gpt2_dir), tmp_path / "run", SMALL, figures=False, say=lines.append
    )
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta == result.metadata
    assert {"load_s", "scan_text_s", "scan_repeat_s", "write_s", "total_s"} <= set(meta["timings"])
    assert meta["timings"]["total_s"] >= meta["timings"]["load_s"] + meta["timings"]["write_s"]
    assert (
        meta["settings"] == SMALL.record() and meta["engine"] == "fused" and meta["batch_size"] == 2
    )
    assert meta["source"]["kind"] == "local" and len(meta["source"]["weights_sha256"]) == 64
    assert set(meta["versions"]) == {  # the one run record's (headscope.rundir.record)
        "headscope",
        "torch",
        "transformers",
        "transformer-lens",
        "spacy",
        "python",
    }
    assert meta["files"] == sorted(p.name for p in (tmp_path / "run").iterdir())
    assert any("fused engine" in line for line in lines)
    assert [p.name for p in result.probes] == ["text", "repeat", "repeat_null"]
    want = scan(headscope.load_model(str(tiny_gpt2_dir)), result.probes[:2], batch_size=2).scores
    saved = headscope.load_run(tmp_path / "run").scores
    pd.testing.assert_frame_equal(saved, want.fillna({"label": ""}), check_exact=False, rtol=1e-7)
    fin = saved["score"].notna()
    assert fin.sum() > 0 and (saved.loc[fin, "ci_low"] <= saved.loc[fin, "ci_high"]).all()
    # no interval where there is no score (next_token, causal)
    assert saved.loc[~fin, "ci_low"].isna().all()


def test_scan_to_dir_takes_an_in_memory_model(tmp_path):
    hf, tok = tiny_gpt2_in_memory()
    result = scan_to_dir(
        headscope.load_model(hf, tok, name="notebook-gpt2"), tmp_path / "run", SMALL, figures=False
    )
    assert (
        result.metadata["source"]["kind"] == "memory"
        and result.metadata["model"] == "notebook-gpt2"
    )
    assert set(pd.read_csv(tmp_path / "run" / "scores.csv")["model"]) == {"notebook-gpt2"}


def test_a_failure_of_the_report_views_never_loses_the_scan(tiny_gpt2, monkeypatch):
    def refuse(*_a, **_k):
        raise HeadscopeError(
            "This model's attention uses softcap, which the blocked engine does not model."
        )

    monkeypatch.setattr("headscope.scanner.runner.example_patterns", refuse)
    said = []
    result = headscope.scan(
        tiny_gpt2, headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=4), say=said.append
    )
    assert result.views == {} and result.scores["score"].notna().any()
    assert "softcap" in result.metadata["examples_skipped"] and said == [
        f"scanning 2 layers x 4 heads on cpu ({result.metadata['engine']} engine)",
        "no example patterns for the report: " + result.metadata["examples_skipped"],
    ]
