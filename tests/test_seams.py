"""Each seam of the upper floors is one file plus one registration (docs/develop/): a task kit, a
head score and a kind of run directory added the way their pages say work end to end, with
nothing else edited."""

from __future__ import annotations

import json

import pytest

import headscope
from headscope import catalog
from headscope.errors import HeadscopeError
from headscope.probes import kits
from headscope.probes.kits.base import Kit, fill
from headscope.probes.tasks import Pair
from headscope.result import ScoreInfo


def _repeat_word(words, data, rng, i, template, t) -> Pair:
    a, b = rng.sample(words["names"], 2)
    clean, spans = fill(template, {"WORD": a})
    corrupt, _ = fill(template, {"WORD": b})
    return Pair(clean, corrupt, " " + a, " " + b, {"WORD": {"char": spans[0][1]}}, {})


def test_a_task_kit_is_one_module_and_one_register_line(tiny_gpt2, words, monkeypatch):
    data = {"provenance": {"what": "x", "source": "test"}, "templates": ["the [WORD] and the"]}
    monkeypatch.setattr(kits.base, "kit_data", lambda name: dict(data, names=words[:6]))
    monkeypatch.setattr(kits.base, "KITS", dict(kits.KITS))  # registered for this test only
    kit = Kit("repeat_word", _repeat_word, (("names", 2),), ("clean -> a", "b", "WORD"))
    kits.base.register(kit)
    with pytest.raises(HeadscopeError, match="already registered"):
        kits.base.register(kit)
    task = kits.load_kit("repeat_word", tiny_gpt2, n_pairs=3)
    assert len(task.pairs) == 3 and task.provenance["kit"] == "repeat_word"
    with pytest.raises(HeadscopeError, match="Did you mean: repeat_word"):
        kits.check_task("repeat_wrd")  # the did-you-mean reads the registry
    import sys

    sys.path.insert(0, "docs")
    try:
        import hooks
    finally:
        sys.path.remove("docs")
    monkeypatch.setattr(kits, "KITS", kits.base.KITS)
    assert "`repeat_word`" in hooks.kit_table()  # so does the site's table


def _constant_score(model, probes, batch_size, progress=None):
    import torch

    from headscope.engines.extract import MetricScores

    probe = probes.get("text")
    if probe is None:
        return None
    n = len(probe)
    per_seq = torch.full((n, model.n_layers, model.n_heads), 0.25, dtype=torch.float64)
    return MetricScores(catalog.CIRCUIT["demo_score"], per_seq.sum(0), n, 0.0, per_seq,
                        torch.ones(n, dtype=torch.float64))  # fmt: skip


def test_a_head_score_is_one_module_and_one_catalog_entry(tiny_gpt2, monkeypatch):
    info = ScoreInfo("demo_score", "text", "a quarter", "", float("nan"),
                     impl=f"{__name__}:_constant_score")  # fmt: skip
    monkeypatch.setattr(catalog, "CIRCUIT", {**catalog.CIRCUIT, "demo_score": info})
    from headscope.scanner import runner

    monkeypatch.setattr(runner, "CIRCUIT", catalog.CIRCUIT)
    probes = headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=5)
    got = {r.metric.name: r for r in runner.circuit_scores(tiny_gpt2, probes, 2)}
    assert {"copying", "value_sink", "demo_score"} <= set(got)
    assert float(got["demo_score"].score[0, 0]) == 0.25


def test_a_run_directory_kind_is_one_line_and_one_write_run_call(tmp_path, monkeypatch):
    import pandas as pd

    from headscope.rundir import kinds, store

    probe = kinds.RunKind("probe", "headscope-probe/1", "probe.csv", "probe run")
    monkeypatch.setattr(kinds, "FORMATS", {**kinds.FORMATS, probe.run_format: probe})
    monkeypatch.setattr(store, "FORMATS", kinds.FORMATS)
    table = pd.DataFrame({"score": [0.5]})
    saved = store.write_run(
        tmp_path / "run", probe, lambda tmp: store.write_csv(table, tmp / "probe.csv"), {"x": 1}
    )
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta == saved and meta["run_format"] == "headscope-probe/1" and meta["x"] == 1
    assert store.read_record(tmp_path / "run", probe)["files"] == ["metadata.json", "probe.csv"]
    with pytest.raises(HeadscopeError, match="already exists"):
        store.write_run(tmp_path / "run", probe, lambda tmp: None, {})
    store.write_run(tmp_path / "run", probe, lambda tmp: None, {}, force=True)  # its own kind
    with pytest.raises(HeadscopeError, match="not a headscope probe run"):
        store.check_out_dir(tmp_path, force=True, kind=probe)
