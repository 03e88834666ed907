"""Sink rate and probes without their first token."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import headscope
from headscope.errors import HeadscopeError
from lib import sinks
from lib.sinks import (
    attention_to_position,
    first_word_attention,
    sink_comparison,
    sink_rate,
    without_first_token,
)


def _sink(scores):
    n = len(scores)
    return pd.DataFrame(
        {
            "model": "m",
            "metric": "sink",
            "layer": [i // 2 for i in range(n)],
            "head": [i % 2 for i in range(n)],
            "head_name": [f"L{i // 2}H{i % 2}" for i in range(n)],
            "score": scores,
            "chance": 0.1,
        }
    )


def test_sink_rate_counts_heads_strictly_above_the_threshold():
    scores = _sink([0.3, 0.31, 0.9, 0.0])
    assert sink_rate(scores) == 0.5
    assert sink_rate(scores, threshold=0.05) == 0.75
    assert sink_rate(scores, per_layer=True).tolist() == [0.5, 0.5]
    with pytest.raises(HeadscopeError, match="no 'sink' rows"):
        sink_rate(scores.assign(metric="entropy"))


def test_sink_comparison_one_row_per_run():
    out = sink_comparison(
        {"BOS first": _sink([0.9, 0.8, 0.7, 0.1]), "word first": _sink([0.1, 0.2, 0.4, 0.0])}
    )
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
    pd.testing.assert_series_equal(
        table["score"], sink["score"], check_names=False, atol=1e-5, rtol=0
    )
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


# ------------------------------------------------------------------------------ Gu et al.'s recipe


def _gu_oracle(hf, sequences):
    """Gu et al.'s eval_sink_open_source.py, restated: eager attentions of each sequence,
    importance = sum over queries of A[q, k] / (T - k); returns importance of key 0 [sequence,
    layer, head]."""
    out = []
    with torch.no_grad():
        for ids in sequences:
            # per layer [1, h, T, T]
            att = hf(input_ids=torch.tensor([ids]), output_attentions=True).attentions
            A = torch.cat(att).double()  # [layer, head, T, T]
            T = A.shape[-1]
            out.append((A / torch.arange(T, 0, -1, dtype=torch.float64)).sum(-2)[..., 0])
    return torch.stack(out)


def test_gu_sink_rate_is_their_recipe(tiny_gpt2):
    probe = sinks.gu_probe(tiny_gpt2, n_sequences=5, length=40)
    assert {len(s) for s in probe.sequences} == {40} and len(
        {tuple(s) for s in probe.sequences}
    ) == 5
    hf = tiny_gpt2.hf
    hf.set_attn_implementation("eager")
    try:
        alpha = _gu_oracle(hf, probe.sequences)
    finally:
        hf.set_attn_implementation("headscope")
    # thresholds between the values: every triple's side of epsilon must agree
    values = alpha.flatten().sort().values
    cuts = [
        (values[i] + values[i + 1]).item() / 2
        for i in (len(values) // 10, len(values) // 2, 9 * len(values) // 10)
    ]
    for epsilon in [*cuts, 0.3]:
        want = (alpha > epsilon).double().mean().item()
        assert sinks.gu_sink_rate(tiny_gpt2, probe, epsilon, batch_size=2) == pytest.approx(
            want, abs=1e-12
        ), epsilon


def test_gu_probe_is_running_text_cut_to_length(tiny_gpt2):
    pairs = [("one two three", "four five"), ("six seven", "eight nine ten")]
    probe = sinks.gu_probe(tiny_gpt2, pairs, n_sequences=3, length=12)
    text = " ".join(f"{a} {b}" for a, b in pairs * 8)
    assert probe.sequences[0] == tiny_gpt2.tokenizer(text)["input_ids"][:12]
    assert (
        probe.sequences[1]
        == tiny_gpt2.tokenizer(" ".join(f"{a} {b}" for a, b in (pairs[1:] + pairs) * 8))[
            "input_ids"
        ][:12]
    )
    per_layer = sinks.gu_sink_rate(tiny_gpt2, probe, 0.1, per_layer=True)
    assert list(per_layer.index) == [0, 1] and per_layer.mean() == pytest.approx(
        sinks.gu_sink_rate(tiny_gpt2, probe, 0.1)
    )


def test_gu_recipe_refusals(tiny_gpt2, tiny_bert):
    with pytest.raises(HeadscopeError, match="causal language models"):
        sinks.gu_probe(tiny_bert)
    with pytest.raises(HeadscopeError, match="one length"):
        sinks.gu_sink_rate(tiny_gpt2, headscope.text_probe(tiny_gpt2, n_prompts=4))
    with pytest.raises(HeadscopeError, match="longer than the model's context"):
        sinks.gu_probe(tiny_gpt2, length=1000)


def test_attention_to_position_sums_add_up_to_the_pooled_score(tiny_gpt2):
    from lib.sinks import attention_to_position, attention_to_position_sums

    probe = headscope.text_probe(tiny_gpt2, n_prompts=3)
    total, count = attention_to_position_sums(tiny_gpt2, probe, 1, batch_size=2)
    table = attention_to_position(tiny_gpt2, probe, 1, batch_size=2)
    assert total.shape == (3, tiny_gpt2.n_layers, tiny_gpt2.n_heads)
    assert count.tolist() == [len(s) - 2 for s in probe.sequences]
    pooled = (total.sum(0) / count.sum()).flatten().tolist()
    assert pooled == pytest.approx(table["score"].tolist())
