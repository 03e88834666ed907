"""Tidy tables, labels and summaries (headscope/report/tables.py) on hand-built per-head sums."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from headscope.engines.extract import MetricScores
from headscope.errors import HeadscopeError
from headscope.metrics import get_metric
from headscope.report.tables import (
    headline,
    relabel,
    summary_markdown,
    summary_table,
    to_frame,
    top_heads,
)
from headscope.result import COLUMNS, ScanResult

COUNT = 4.0  # a power of two: total = score * COUNT and back are exact in float64

# [layer][head] scores of a 2 x 2 model, and each metric's chance value
SCORES = {
    "induction": ([[0.1, 0.9], [0.5, 0.3]], 0.1),
    "entropy": ([[0.2, 1.5], [0.05, 2.0]], 1.2),
    # causal: NaN by construction
    "next_token": ([[math.nan, math.nan], [math.nan, math.nan]], math.nan),
    "sink": ([[0.9, 0.2], [0.4, 0.35]], 0.3),
}


def metric_scores(name: str, scores, chance: float, count: float = COUNT) -> MetricScores:
    total = torch.tensor(scores, dtype=torch.float64) * count
    return MetricScores(get_metric(name), total, count, chance * count)


def frame(thresholds: dict | None = None, model: str = "org/tiny") -> pd.DataFrame:
    results = [metric_scores(name, s, c) for name, (s, c) in SCORES.items()]
    return to_frame(model, 2, 2, results, thresholds or {})


def result(thresholds: dict | None = None) -> ScanResult:
    md = {
        "n_layers": 2,
        "n_heads": 2,
        "causal": True,
        "source": {"kind": "local", "source": "/ckpt/tiny"},
    }
    return ScanResult(
        "org/tiny", frame(thresholds), probes=[], metadata=md, thresholds=thresholds or {}
    )


# ------------------------------------------------------------------------------ to_frame


def test_to_frame_rows_scores_chance_n():
    t = frame()
    assert list(t.columns) == COLUMNS
    assert len(t) == 4 * 4
    ind = t[t.metric == "induction"]
    assert ind["head_name"].tolist() == ["L0H0", "L0H1", "L1H0", "L1H1"]  # layer-major
    assert ind["layer"].tolist() == [0, 0, 1, 1] and ind["head"].tolist() == [0, 1, 0, 1]
    assert ind["score"].tolist() == [0.1, 0.9, 0.5, 0.3]
    assert set(ind["chance"]) == {0.1} and set(ind["n"]) == {4}
    assert set(ind["model"]) == {"org/tiny"} and set(ind["probe"]) == {"repeat"}
    assert set(t.loc[t.metric == "entropy", "probe"]) == {"text"}
    assert t["n"].dtype.kind == "i"


def test_to_frame_labels_pass_the_threshold():
    t = frame()
    labels = t.set_index(["metric", "head_name"])["label"]
    assert labels["induction"].tolist() == ["", "induction head", "induction head", ""]  # >= 0.4
    assert labels["entropy"].tolist() == ["focused head", "", "focused head", ""]  # <= 0.3: below
    assert labels["sink"].tolist() == ["sink head", "", "", ""]  # >= 0.5
    assert labels["next_token"].tolist() == ["", "", "", ""]  # NaN never passes


def test_to_frame_threshold_overrides():
    t = frame({"induction": 0.2, "entropy": 1.5})
    labels = t.set_index(["metric", "head_name"])["label"]
    assert labels["induction"].tolist() == [
        "",
        "induction head",
        "induction head",
        "induction head",
    ]
    assert labels["entropy"].tolist() == ["focused head", "focused head", "focused head", ""]
    assert labels["sink"].tolist() == ["sink head", "", "", ""]  # not overridden: its default


def test_to_frame_divides_sums_by_count():
    res = MetricScores(
        get_metric("sink"), torch.tensor([[3.0, 1.5]], dtype=torch.float64), 6.0, 2.0
    )
    t = to_frame("m", 1, 2, [res], {})
    assert t["score"].tolist() == [0.5, 0.25]
    assert t["chance"].tolist() == [pytest.approx(1 / 3)] * 2 and t["n"].tolist() == [6, 6]


def test_to_frame_no_qualifying_query():
    res = MetricScores(get_metric("separator"), torch.zeros(1, 2, dtype=torch.float64), 0.0, 0.0)
    t = to_frame("m", 1, 2, [res], {})
    assert t["score"].isna().all() and t["chance"].isna().all()
    assert t["n"].tolist() == [0, 0] and t["label"].tolist() == ["", ""]


# ------------------------------------------------------------------------------ top heads, relabel


def test_top_heads_highest_first():
    top = top_heads(frame(), "induction", k=3)
    assert top["head_name"].tolist() == ["L0H1", "L1H0", "L1H1"]
    assert top["score"].tolist() == [0.9, 0.5, 0.3]


def test_top_heads_lowest_first_for_a_below_metric():
    top = top_heads(frame(), "entropy", k=2)
    assert top["head_name"].tolist() == ["L1H0", "L0H0"] and top["score"].tolist() == [0.05, 0.2]


def test_top_heads_skips_nan_and_caps_k():
    assert top_heads(frame(), "next_token").empty
    assert top_heads(frame(), "sink", k=10)["head_name"].tolist() == [
        "L0H0",
        "L1H0",
        "L1H1",
        "L0H1",
    ]


def test_relabel_under_new_thresholds():
    t = frame()
    before = t.copy()
    out = relabel(t, {"induction": 0.6, "entropy": 0.1})
    pd.testing.assert_frame_equal(t, before)  # the input is not changed
    labels = out.set_index(["metric", "head_name"])["label"]
    assert labels["induction"].tolist() == ["", "induction head", "", ""]
    assert labels["entropy"].tolist() == ["", "", "focused head", ""]
    keep = ~out["metric"].isin(["induction", "entropy"])
    pd.testing.assert_frame_equal(out[keep], t[keep])  # other metrics untouched
    pd.testing.assert_frame_equal(out.drop(columns="label"), t.drop(columns="label"))
    # back to the defaults
    pd.testing.assert_frame_equal(relabel(out, {"induction": 0.4, "entropy": 0.3}), t)


def test_relabel_unknown_metric():
    with pytest.raises(
        HeadscopeError,
        match=r"^Unknown metric 'inductoin'\. Did you mean: "
        r"induction\? Known: ",
    ):
        relabel(frame(), {"inductoin": 0.5})


# ------------------------------------------------------------------------------ summaries


def test_summary_table_lines():
    assert summary_table(frame()).splitlines() == [
        "metric            chance  labelled  top heads",
        "induction          0.100         2  L0H1 0.900, L1H0 0.500, L1H1 0.300",
        "entropy            1.200         2  L1H0 0.050, L0H0 0.200, L0H1 1.500",
        "next_token           NaN         0  NaN (see summary.md)",
        "sink               0.300         1  L0H0 0.900, L1H0 0.400, L1H1 0.350",
    ]
    assert summary_table(frame(), k=1).splitlines()[1].endswith("  L0H1 0.900")


def test_headline_sentences():
    assert headline(frame()) == [
        "induction: 2/4 heads labelled 'induction head'; strongest L0H1 = 0.900 (chance 0.100).",
        "entropy: 2/4 heads labelled 'focused head'; lowest L1H0 = 0.050 (chance 1.200).",
        # next_token is all NaN: no sentence
        "sink: 1/4 heads labelled 'sink head'; strongest L0H0 = 0.900 (chance 0.300).",
        "sink rate (share of heads with mean attention to position 0 > 0.3): 0.75.",
    ]


def test_headline_without_sink_has_no_sink_rate():
    t = frame()
    lines = headline(t[t.metric != "sink"])
    assert len(lines) == 2 and not any(line.startswith("sink") for line in lines)


def test_summary_markdown_content():
    md = summary_markdown(result())
    lines = md.splitlines()
    assert lines[:3] == [
        "# headscope scan: org/tiny",
        "",
        "2 layers x 2 heads, causal decoder. Source: /ckpt/tiny.",
    ]
    i = lines.index("## Headline findings")
    assert lines[i + 2 : i + 7] == [f"- {s}" for s in headline(frame())] + [""]
    i = lines.index("## Top heads per behaviour")
    assert lines[i + 2 : i + 8] == [
        "| metric | chance | top heads |",
        "| --- | --- | --- |",
        "| induction | 0.100 | L0H1 0.900, L1H0 0.500, L1H1 0.300, L0H0 0.100 |",
        "| entropy | 1.200 | L1H0 0.050, L0H0 0.200, L0H1 1.500, L1H1 2.000 |",
        "| next_token | NaN | NaN |",
        "| sink | 0.300 | L0H0 0.900, L1H0 0.400, L1H1 0.350, L0H1 0.200 |",
    ]
    i = lines.index("## Labelled heads")
    assert lines[i + 2 : i + 6] == [
        "- **induction head** (induction >= 0.4): L0H1, L1H0",
        "- **focused head** (entropy <= 0.3): L0H0, L1H0",
        "- **next-token head** (next_token >= 0.5): none",
        "- **sink head** (sink >= 0.5): L0H0",
    ]
    i = lines.index("## Not measurable on this model")
    assert lines[i + 2] == (
        "- `next_token` is NaN: causal model: the mask hides every later "
        "token, "
        "so A[q, q+1] is 0 by construction."
    )
    assert "`chance` is the score of a head that spreads attention evenly" in md
    assert md.endswith("\n")


def test_summary_markdown_shows_the_thresholds_used():
    lines = summary_markdown(result({"induction": 0.85})).splitlines()
    assert "- **induction head** (induction >= 0.85): L0H1" in lines


def test_summary_markdown_encoder_without_nan_section():
    r = result()
    r.metadata["causal"] = False
    r.scores = r.scores[r.scores.metric != "next_token"]
    md = summary_markdown(r)
    assert "2 layers x 2 heads, bidirectional encoder. Source: /ckpt/tiny." in md.splitlines()
    assert "## Not measurable on this model" not in md


def test_summary_markdown_nan_without_a_registered_reason():
    """A metric with no nan_reason that has no qualifying query anywhere (e.g. no separator
    seen)."""
    res = MetricScores(get_metric("separator"), torch.zeros(2, 2, dtype=torch.float64), 0.0, 0.0)
    r = result()
    r.scores = to_frame("org/tiny", 2, 2, [res], {})
    lines = summary_markdown(r).splitlines()
    assert "- `separator` is NaN: no qualifying queries." in lines
    assert "| separator | NaN | NaN |" in lines


def test_console_summary_counts_scored_sequences_apart_from_controls_and_lists_what_was_written(
    tmp_path,
):
    from headscope.probes.pairs import NULL_PROBE
    from headscope.report.tables import console_summary
    from headscope.result import Probe

    r = result()
    r.probes = [
        Probe("text", [[1, 2, 3]] * 4),
        Probe("repeat", [[1, 2, 1, 2]] * 3, repeat_len=2),
        Probe(NULL_PROBE, [[1, 2, 3, 4]] * 3, repeat_len=2),
    ]
    for name in [
        "scores.csv",
        "metadata.json",
        "tokens.jsonl",
        "controls.jsonl",
        "summary.md",
        "per_sequence.npz",
        "sink.png",
        "summary.png",
    ]:
        (tmp_path / name).write_text("x")
    text = console_summary(r, tmp_path)
    assert "7 sequences (+ 3 positional-null controls)" in text.splitlines()[0]
    assert text.splitlines()[-1] == (
        f"wrote {tmp_path}/ (scores.csv, metadata.json, tokens.jsonl, "
        "controls.jsonl, "
        "summary.md, per_sequence.npz, *.png)"
    )
    r.probes = r.probes[:2]
    assert console_summary(r).splitlines()[0].endswith(", 7 sequences")
