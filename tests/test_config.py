"""ScanConfig: the one home of a scan's defaults and of every check that needs no model."""

from __future__ import annotations

import pytest

from headscope.config import ScanConfig, parse_thresholds
from headscope.errors import HeadscopeError
from headscope.metrics import REGISTRY


@pytest.mark.parametrize("kwargs, message", [
    ({"n_prompts": 0}, r"^n_prompts \(--n-prompts\) must be at least 1, got 0\.$"),
    ({"repeat_len": -1}, r"^repeat_len \(--repeat-len\) must be at least 1, got -1\.$"),
    ({"batch_size": 0}, r"^batch_size \(--batch-size\) must be at least 1, got 0\.$"),
    ({"seq_len": 0}, r"^seq_len \(--seq-len\) must be at least 1, got 0\.$"),
    ({"engine": "fsued"}, r"^Unknown engine 'fsued'\. Did you mean: fused\?"),
    ({"metrics": ("sink", "entropi")}, r"^Unknown metric 'entropi'\. Did you mean: entropy\?"),
    ({"metrics": (" ",)}, r"^metrics \(--metrics\) is empty"),
    ({"thresholds": {"inductoin": 0.5}}, r"Did you mean: induction\?"),
    ({"thresholds": {"induction": float("nan")}}, r"must be a number"),
    ({"n_prompts": 1000}, r"^n_prompts \(--n-prompts\) 1000 asks for more pairs than the built-in corpus holds "
                          r"\(68\); use at most 68\.$"),
    ({"prompts": "/nonexistent/pairs.tsv"}, r"does not exist"),
    ({"text_join": "chatml"}, r"^Unknown text_join \(--text-join\) 'chatml'\. Did you mean: chat\? Use one of plain, chat\.$"),
    ({"text_join": "chat", "seq_len": 64}, r"^text_join \(--text-join\) chat and token_types \(--token-types\) shape "
                                           r"the pair probe; seq_len \(--seq-len\) packs text instead\."),
    ({"token_types": True, "seq_len": 64}, r"seq_len \(--seq-len\) packs text instead\. Use one or the other\.$"),
])
def test_every_check_is_one_line(kwargs, message):
    with pytest.raises(HeadscopeError, match=message) as exc:
        ScanConfig(**kwargs).validate()
    assert "\n" not in str(exc.value)


def test_what_passes_and_what_it_means():
    assert ScanConfig().validate() == ScanConfig()
    assert ScanConfig(n_prompts=1000, seq_len=64).validate().n_prompts == 1000  # packed text: no limit
    assert ScanConfig(n_prompts=1000, metrics=("induction",)).validate()  # no text probe, no pair limit
    assert [m.name for m in ScanConfig().metric_objects()] == [m.name for m in REGISTRY.values() if m.default]
    assert [m.name for m in ScanConfig(metrics=(" sink", "induction ")).metric_objects()] == ["sink", "induction"]
    assert ScanConfig(metrics=("induction",)).probe_names() == ["repeat"]
    assert ScanConfig(metrics=("induction", "sink")).probe_names() == ["text", "repeat"]
    record = ScanConfig(metrics=("sink",), thresholds={"sink": 0.2}).record()
    assert record == {"n_prompts": 64, "repeat_len": 50, "seed": 0, "seq_len": None, "prompts": None,
                      "text_join": "plain", "token_types": False, "metrics": ["sink"], "thresholds": {"sink": 0.2}, "batch_size": None, "engine": "auto",
                      "effects": None, "ablation": "mean", "effects_sequences": 16, "bootstrap": 1000, "ci": 0.95,
                      "long_context": False, "sinks": 4, "window": 64, "needle_tokens": 8}


def test_parse_thresholds():
    assert parse_thresholds(["induction=0.6", " sink = 0.25"]) == {"induction": 0.6, "sink": 0.25}
    with pytest.raises(HeadscopeError, match=r"^Threshold 'induction' must look like METRIC=VALUE"):
        parse_thresholds(["induction"])
    with pytest.raises(HeadscopeError, match="'high' is not a number"):
        parse_thresholds(["induction=high"])
