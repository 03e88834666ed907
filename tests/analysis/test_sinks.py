"""Sink rate and probes without their first token."""

from __future__ import annotations

import pandas as pd
import pytest

import headscope
from headscope.analysis.sinks import (
    attention_to_position,
    first_word_attention,
    sink_comparison,
    sink_rate,
    without_first_token,
)
from headscope.errors import HeadscopeError


def _sink(scores):
    n = len(scores)
    return pd.DataFrame({"model": "m", "metric": "sink", "layer": [i // 2 for i in range(n)], "head": [i % 2 for i in range(n)],
                         "head_name": [f"L{i // 2}H{i % 2}" for i in range(n)], "score": scores, "chance": 0.1})


def test_sink_rate_counts_heads_strictly_above_the_threshold():
    scores = _sink([0.3, 0.31, 0.9, 0.0])
    assert sink_rate(scores) == 0.5
    assert sink_rate(scores, threshold=0.05) == 0.75
    assert sink_rate(scores, per_layer=True).tolist() == [0.5, 0.5]
    with pytest.raises(HeadscopeError, match="no 'sink' rows"):
        sink_rate(scores.assign(metric="entropy"))


def test_sink_comparison_one_row_per_run():
    out = sink_comparison({"BOS first": _sink([0.9, 0.8, 0.7, 0.1]), "word first": _sink([0.1, 0.2, 0.4, 0.0])})
    assert out["run"].tolist() == ["BOS first", "word first"]
    assert out["sink_rate"].tolist() == [0.75, 0.25]
    assert out["top_head"].tolist() == ["L0H0", "L1H0"]
    assert out["mean_sink"].tolist() == pytest.approx([0.625, 0.175])


def test_without_first_token_on_both_kinds(tiny_gpt2, tiny_bert):
    for model in (tiny_gpt2, tiny_bert):
        probe = headscope.text_probe(model, n_prompts=3)
        dropped = without_first_token(probe)
        assert [s[0] for s in probe.sequences] == [model.bos_id] * 3
        assert dropped.sequences == [s[1:] for s in probe.sequences]
        assert dropped.settings["first_token_dropped"] and dropped.name == "text"
        result = headscope.scan(model, [dropped], metrics=["sink"])
        assert result.scores["score"].between(0, 1).all()
    with pytest.raises(HeadscopeError, match="text probes"):
        without_first_token(headscope.repeat_probe(tiny_gpt2, repeat_len=4, n_sequences=1))


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_bert"])
def test_attention_to_position_zero_is_the_sink_score(fixture, request):
    model = request.getfixturevalue(fixture)
    probe = headscope.text_probe(model, n_prompts=5)  # different lengths: padded batches
    assert len({len(s) for s in probe.sequences}) > 1
    table = attention_to_position(model, probe, 0, batch_size=3)
    sink = headscope.scan(model, [probe], metrics=["sink"]).scores
    pd.testing.assert_series_equal(table["score"], sink["score"], check_names=False, atol=1e-5, rtol=0)
    assert table["n"].iloc[0] == sum(len(s) - 1 for s in probe.sequences)


def test_attention_to_position_one_counts_later_queries(tiny_gpt2):
    probe = headscope.text_probe(tiny_gpt2, n_prompts=3)
    table = attention_to_position(tiny_gpt2, probe, 1)
    assert table["n"].iloc[0] == sum(len(s) - 2 for s in probe.sequences)
    assert table["score"].between(0, 1).all()
    with pytest.raises(HeadscopeError, match="needs a query after"):
        attention_to_position(tiny_gpt2, probe, 500)


def test_first_word_attention_rows(tiny_gpt2):
    probe = headscope.text_probe(tiny_gpt2, n_prompts=3)
    table = first_word_attention(tiny_gpt2, probe)
    assert len(table) == 3 and table.index[1] == "first word at position 1, behind it"
    sink = headscope.scan(tiny_gpt2, [probe], metrics=["sink"]).scores["score"]
    assert table["mean"].iloc[0] == pytest.approx(sink.mean(), abs=1e-6)
    assert table["heads > 0.3"].dtype.kind == "i"
