"""KV-cache plans: memory counted only for fully restricted KV heads, the ranking, restricted runs
(kernel against masks, greedy decoding against full forwards), every condition verified, the
figure's ties and a figure that fails keeping the tables."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import headscope
from headscope.apps import conformance as conf
from headscope.apps import kvplan
from headscope.errors import HeadscopeError
from headscope.probes.long import long_text_probe, needle_probe

LONG = ["sink", "streaming", "retrieval", "retrieval_soft"]


@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama with grouped-query attention (4 query heads, 2 KV heads), 256
    positions."""
    fam = next(f for f in conf.FAMILIES if f.model_type == "llama")
    hf, tok = conf.tiny_model(fam)
    return headscope.load_model(hf, tok, name="tiny-llama")


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
    for (layer, head), stream, ret in [
        ((0, 0), 0.99, "retrieval head"),
        ((0, 1), 0.5, ""),
        ((1, 0), 0.9, ""),
    ]:
        rows += [
            {"metric": "streaming", "layer": layer, "head": head, "score": stream, "label": ""},
            {"metric": "retrieval", "layer": layer, "head": head, "score": 0.0, "label": ret},
        ]
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
    monkeypatch.setattr(kvplan.kernel, "supports", lambda *a: False)  # force the mask path
    masked = llama.run(x, handler=handler, output="logits")
    full = llama.run(x, output="logits")
    torch.testing.assert_close(fast, masked, atol=2e-5, rtol=1e-5)
    assert float((fast - full).abs().max()) > 1e-3  # restricting changed the model
    # a window holding every key: no change
    wide = kvplan.Restricted(heads, llama.n_heads, 0, 10_000)
    torch.testing.assert_close(
        llama.run(x, handler=wide, output="logits"), full, atol=2e-5, rtol=1e-5
    )


def test_greedy_decoding_matches_full_forwards(llama):
    prompt = long_text_probe(llama, 60, 1).sequences[0]
    got = llama.greedy(prompt, 5)
    ids = list(prompt)
    for _ in range(5):  # no cache: the argmax of a full forward, one token at a time
        ids.append(int(llama.logits(torch.tensor([ids]))[0, -1].argmax()))
    assert got == ids[len(prompt) :]


@pytest.mark.parametrize("path", ["kernel", "mask"])
def test_restricted_greedy_decoding_matches_restricted_full_forwards(llama, monkeypatch, path):
    """Needle accuracy decodes with a KV cache: one query against every cached key at each step. The
    restriction must hold there exactly as in a full forward (same band, counted from the query's
    own position), on the kernel and on the mask path."""
    if path == "mask":
        monkeypatch.setattr(kvplan.kernel, "supports", lambda *a: False)
    prompt = long_text_probe(llama, 120, 1).sequences[0]
    every = frozenset((la, h) for la in range(llama.n_layers) for h in range(llama.n_heads))
    handler = kvplan.Restricted(every, llama.n_heads, 1, 4)
    got = llama.greedy(prompt, 6, handler=handler)
    ids = list(prompt)
    for _ in range(6):  # no cache: the argmax of a full restricted forward, one token at a time
        ids.append(
            int(llama.run(torch.tensor([ids]), handler=handler, output="logits")[0, -1].argmax())
        )
    assert got == ids[len(prompt) :]
    # the restriction changes what is decoded: the check has teeth
    assert got != llama.greedy(prompt, 6)


def test_kv_plan_runs_every_condition(llama):
    text = long_text_probe(llama, 200, 2)
    text.settings["band"] = [2, 16]
    scores = headscope.scan(
        llama,
        [text, needle_probe(llama, [200], (0.5,), k=4)],
        metrics=LONG,
        bootstrap=0,
        null=False,
        examples=False,
    ).scores
    st = kvplan.PlanSettings(
        budgets=(0.25, 1.0),
        seeds=2,
        sinks=2,
        window=16,
        seq_len=200,
        n_texts=1,
        depths=(0.5,),
        needles_per_depth=1,
        needle_tokens=4,
    )
    df = kvplan.kv_plan(llama, scores, st)
    assert list(df.condition) == [
        "full",
        "streaming_all",
        "window_all",
        "plan",
        "random",
        "random",
        "plan",
        "random",
        "random",
    ]
    assert df.loc[0, "loss_delta"] == 0 and df.loc[0, "kv_saved_fraction"] == 0
    every = df[df.budget == 1.0]
    assert (every.heads_restricted == 8).all() and (every.kv_heads_dropped == 4).all()
    plan_all = df[(df.condition == "plan") & (df.budget == 1.0)].iloc[0]
    stream_all = df[df.condition == "streaming_all"].iloc[0]
    assert plan_all.loss == pytest.approx(stream_all.loss)  # the same heads, the same run
    summary = kvplan.summary(df)
    assert list(summary.budget) == [0.25, 1.0]


def _plan_table(needle: float = 0.2) -> pd.DataFrame:
    """A kvplan table whose three random seeds all score the same needle accuracy (needles are
    coarse:
    ties are common) and whose mean differs from them in the last bit (mean([0.2] * 3) != 0.2)."""
    base = {
        "sinks": 4,
        "window": 64,
        "heads_restricted": 2,
        "kv_heads_dropped": 0,
        "kv_saved_bytes": 0,
        "kv_saved_fraction": 0.0,
        "needle_token_acc": 0.5,
        "seconds": 1.0,
    }
    rows = [
        {**base, "condition": "full", "budget": 0.0, "seed": None, "loss": 3.0, "needle_acc": 0.3}
    ]
    for b in (0.25, 0.5):
        rows.append(
            {
                **base,
                "condition": "plan",
                "budget": b,
                "seed": None,
                "loss": 3.0 + 0.1 * b,
                "needle_acc": needle,
            }
        )
        rows += [
            {
                **base,
                "condition": "random",
                "budget": b,
                "seed": s,
                "loss": 3.0 + 0.3 * b,
                "needle_acc": needle,
            }
            for s in range(3)
        ]
    rows.append(
        {
            **base,
            "condition": "streaming_all",
            "budget": 1.0,
            "seed": None,
            "loss": 3.3,
            "needle_acc": 0.0,
        }
    )
    df = pd.DataFrame(rows)
    df["loss_delta"] = df["loss"] - 3.0
    return df


def test_tied_random_seeds_draw_a_zero_error_bar():
    """Issue 19: three seeds at 20% needles gave a mean of 0.20000000000000004 and a negative error
    bar, and matplotlib's refusal lost 13 minutes of verified runs."""
    df = _plan_table()
    # the tie's last bit
    assert df[df.condition == "random"].groupby("budget")["needle_acc"].mean().iloc[0] != 0.2
    fig = kvplan.figure(df, "tiny", 128)
    assert "tiny" in fig.texts[0].get_text() and "128-token" in fig.texts[0].get_text()
    legend = [
        t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()
    ]
    assert any("3 seeds" in t and "min-max" in t for t in legend)


def test_a_figure_that_fails_keeps_the_plan_tables(tmp_path, monkeypatch):
    def broken(*_a, **_k):
        raise ValueError("'yerr' must not contain negative values")

    monkeypatch.setattr(kvplan, "figure", broken)
    heard = []
    kvplan.save(
        _plan_table(),
        tmp_path,
        kvplan.PlanSettings(),
        "tiny",
        {"0.25": ["L0H0"]},
        {},
        say=heard.append,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvplan.csv", "kvplan.json", "kvplan.md"]
    record = json.loads((tmp_path / "kvplan.json").read_text())
    assert record["figures_skipped"].startswith(
        "kvplan.png: ValueError: 'yerr' must not contain negative values"
    )
    assert len(heard) == 1 and "everything else was kept" in heard[0]
    assert len(pd.read_csv(tmp_path / "kvplan.csv")) == len(_plan_table())
