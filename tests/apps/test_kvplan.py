"""KV-cache plans: memory counted only for fully restricted KV heads, the ranking, restricted runs
(kernel against masks, greedy decoding against full forwards), every condition verified, the
figure's ties and a figure that fails keeping the tables."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import headscope
from headscope.apps import kvplan
from headscope.engines import fused
from headscope.errors import HeadscopeError
from headscope.probes.long import long_text_probe, needle_probe
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
    monkeypatch.setattr(fused.kernel, "supports", lambda *a: False)  # force the mask path
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
        monkeypatch.setattr(fused.kernel, "supports", lambda *a: False)
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


def small_plan(llama):
    """``(table, settings)``: a kv plan of the tiny Llama at budgets 0.25 and 1 with 2 seeds (a
    200-token text, one needle), scored by a scan of the same probes."""
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
    return df, st


def test_kv_plan_runs_every_condition(llama):
    df, st = small_plan(llama)
    assert list(df.condition) == [
        "full",
        "streaming_all",
        "window_all",
        "plan",
        "random",
        "random",
        "random_kv",
        "random_kv",
        "plan",
        "random",
        "random",
        "random_kv",
        "random_kv",
    ]
    assert df.loc[0, "loss_delta"] == 0 and df.loc[0, "kv_saved_fraction"] == 0
    # random KV groups: exactly the plan's KV heads dropped, so the same memory saved
    for b in (0.25, 1.0):
        plan = df[(df.condition == "plan") & (df.budget == b)].iloc[0]
        kv = df[(df.condition == "random_kv") & (df.budget == b)]
        assert (kv.kv_heads_dropped == plan.kv_heads_dropped).all()
        assert (kv.kv_saved_fraction == plan.kv_saved_fraction).all()
        assert (kv.heads_restricted == plan.kv_heads_dropped * 2).all()  # 2 query heads a group
    # intervals hold their point; per-text sums give back the loss
    assert (df.loss_delta_low <= df.loss_delta + 1e-12).all()
    assert (df.loss_delta <= df.loss_delta_high + 1e-12).all()
    assert (df.needle_low <= df.needle_acc).all() and (df.needle_acc <= df.needle_high).all()
    sums, counts = df.attrs["text_sums"], df.attrs["text_counts"]
    for k in range(len(df)):
        assert sum(sums[k]) / sum(counts) == pytest.approx(df.loss[k], rel=1e-12)
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
    legend = [t.get_text() for key in fig.legends for t in key.get_texts()]
    assert any("3 seeds" in t and "min-max" in t for t in legend)


def test_a_figure_that_fails_keeps_the_plan_tables(tmp_path, monkeypatch):
    def broken(*_a, **_k):
        raise ValueError("'yerr' must not contain negative values")

    monkeypatch.setattr(kvplan, "figure", broken)
    heard = []
    kvplan.save(
        _plan_table(),
        tmp_path / "plan",
        kvplan.PlanSettings(),
        "tiny",
        {"0.25": ["L0H0"]},
        {},
        say=heard.append,
    )
    plan = tmp_path / "plan"
    assert sorted(p.name for p in plan.iterdir()) == ["kvplan.csv", "kvplan.json", "kvplan.md"]
    record = json.loads((plan / "kvplan.json").read_text())
    assert record["figures_skipped"].startswith(
        "the figures: ValueError: 'yerr' must not contain negative values"
    )
    assert len(heard) == 1 and "everything else was kept" in heard[0]
    assert len(pd.read_csv(plan / "kvplan.csv")) == len(_plan_table())


# ------------------------------------------------------------------------------ issue 24: intervals


def test_random_kv_groups_restrict_whole_groups_and_drop_exactly_that_many():
    # 3 layers x 6 query heads, 2 KV heads (groups of 3)
    for count in range(7):
        heads = kvplan.random_kv_groups(3, 6, 2, count, seed=count)
        assert len(heads) == 3 * count
        assert kvplan.kv_saving(heads, 3, 6, 2, 8, 100, 10)["kv_heads_dropped"] == count
        for layer, head in heads:  # each drawn group whole
            g = head // 3
            assert all((layer, g * 3 + j) in heads for j in range(3))
    assert kvplan.random_kv_groups(3, 6, 2, 3, 0) == kvplan.random_kv_groups(3, 6, 2, 3, 0)
    draws = {kvplan.random_kv_groups(3, 6, 2, 3, s) for s in range(10)}
    assert len(draws) > 1  # seeded, and the seed matters
    with pytest.raises(HeadscopeError, match="Cannot draw 7 KV groups from 6"):
        kvplan.random_kv_groups(3, 6, 2, 7, 0)


def _wilson_by_inversion(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson interval from its definition: the p0 with |h/n - p0| <= z sqrt(p0 (1 - p0) / n),
    found by bisection (no closed form)."""
    p = hits / n

    def inside(p0):
        return abs(p - p0) <= z * (p0 * (1 - p0) / n) ** 0.5

    def edge(a, b):  # a inside, b outside
        for _ in range(200):
            m = (a + b) / 2
            a, b = (m, b) if inside(m) else (a, m)
        return a

    return (edge(p, 0.0) if p > 0 else 0.0), (edge(p, 1.0) if p < 1 else 1.0)


@pytest.mark.parametrize("hits,n", [(0, 10), (1, 10), (5, 10), (37, 100), (100, 100), (3, 7)])
def test_wilson_interval_matches_its_definition(hits, n):
    got = kvplan.wilson(hits, n)
    want = _wilson_by_inversion(hits, n)
    assert got == pytest.approx(want, abs=1e-9)
    assert got[0] <= hits / n <= got[1]
    assert kvplan.wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # textbook value


def test_paired_loss_interval_is_paired_and_is_the_pooled_delta():
    counts = [100, 50, 200, 80, 120]
    base = [250.0, 400.0, 300.0, 90.0, 700.0]  # per-token losses differ a lot across texts
    # every text 0.1 nats per token worse: paired, the interval is that point
    shifted = [b + 0.1 * n for b, n in zip(base, counts, strict=True)]
    lo, hi = kvplan.paired_loss_ci(shifted, base, counts, resamples=500)
    assert lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
    # an independent loop over the same draws gives the same percentiles
    cond = [b + d * n for b, d, n in zip(base, [0.3, -0.1, 0.05, 0.2, 0.0], counts, strict=True)]
    lo, hi = kvplan.paired_loss_ci(cond, base, counts, resamples=400, seed=3)
    gen = torch.Generator().manual_seed(3)
    draws = torch.randint(len(counts), (400, len(counts)), generator=gen).tolist()
    deltas = sorted(
        (sum(cond[i] for i in d) - sum(base[i] for i in d)) / sum(counts[i] for i in d)
        for d in draws
    )
    import numpy as np

    want = np.quantile(np.array(deltas), [0.025, 0.975])
    assert (lo, hi) == pytest.approx(tuple(want), abs=1e-12)
    pooled = (sum(cond) - sum(base)) / sum(counts)
    assert lo < pooled < hi and lo < hi
    assert all(map(np.isnan, kvplan.paired_loss_ci(cond, base, counts, resamples=0)))


def test_text_losses_match_a_plain_hf_forward(llama):
    texts = long_text_probe(llama, 100, 3, part="heldout").sequences
    sums, counts = kvplan.text_losses(llama, texts, None)
    assert counts == [99, 99, 99]
    for ids, s in zip(texts, sums, strict=True):
        x = torch.tensor([list(ids)])
        with torch.no_grad():
            logits = llama.hf(input_ids=x).logits[0, :-1]
        want = float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
        assert s == pytest.approx(want, rel=1e-5)
    assert kvplan.text_loss(llama, texts, None) == pytest.approx(sum(sums) / sum(counts), rel=1e-12)


class _Needles:
    """A needle probe whose answers are what the model itself decodes (so greedy decoding gets
    them right), and the same with one answer token changed (so it does not)."""

    def __init__(self, llama, handler, k=4):
        self.sequences, self.needles = [], []
        for n, length in enumerate((60, 60, 60, 75)):
            prompt = list(long_text_probe(llama, length, 1).sequences[0])
            prompt[1] = (
                prompt[1] + n
            ) % llama.hf.config.vocab_size  # distinct prompts of one length
            got = llama.greedy(prompt, k, handler=handler)
            if n % 2:  # a miss at the last answer token
                got = got[:-1] + [(got[-1] + 1) % llama.hf.config.vocab_size]
            self.sequences.append(prompt + got)
            a = len(prompt)
            self.needles.append({"needle_start": a, "answer_start": a, "k": k})


@pytest.mark.parametrize("restricted", [False, True])
def test_forced_needle_reading_equals_greedy_decoding_on_exact_match(llama, restricted):
    every = frozenset((la, h) for la in range(llama.n_layers) for h in range(llama.n_heads))
    handler = kvplan.Restricted(every, llama.n_heads, 1, 8) if restricted else None
    probe = _Needles(llama, handler)
    greedy, g_tokens = kvplan.needle_hits(llama, probe, handler, "greedy")
    forced, f_tokens = kvplan.needle_hits(llama, probe, handler, "forced", batch=2)
    assert greedy == forced == [True, False, True, False]
    assert f_tokens == [1.0, 0.75, 1.0, 0.75] == g_tokens  # a miss at the last token only
    with pytest.raises(HeadscopeError, match="'greedy' or 'forced'"):
        kvplan.needle_hits(llama, probe, handler, "beam")


def _curve(ax, label: str):
    """The (x, y) of the curve labelled ``label`` on ``ax`` (a plain line or an errorbar's)."""
    for c in ax.containers:
        if c.get_label().startswith(label):
            return list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata())
    for line in ax.lines:
        if line.get_label().startswith(label):
            return list(line.get_xdata()), list(line.get_ydata())
    raise AssertionError(f"no curve {label!r} on {[c.get_label() for c in ax.containers]}")


def test_the_figure_puts_each_condition_at_the_share_of_heads_it_restricts():
    """12 query heads in 4 KV groups of 3: the plan and count-matched random heads restrict 3 and
    6 heads at budgets 0.25 and 0.5; random whole KV groups matched to the plan's KV heads dropped
    restrict 6 and 9 (two and three groups), so they sit at 0.5 and 0.75, not at the budgets."""
    base = {"sinks": 4, "window": 64, "kv_saved_fraction": 0.0, "needle_token_acc": 0.5}
    rows = [{**base, "condition": "full", "budget": 0.0, "seed": None, "heads_restricted": 0}]
    rows.append({**base, "condition": "streaming_all", "budget": 1.0, "seed": None})
    rows.append({**base, "condition": "window_all", "budget": 1.0, "seed": None})
    rows[-1]["heads_restricted"] = rows[-2]["heads_restricted"] = 12
    for b, n, kv in ((0.25, 3, 6), (0.5, 6, 9)):
        rows.append({**base, "condition": "plan", "budget": b, "seed": None, "heads_restricted": n})
        for seed in range(2):
            rows.append(
                {**base, "condition": "random", "budget": b, "seed": seed, "heads_restricted": n}
            )
            rows.append(
                {
                    **base,
                    "condition": "random_kv",
                    "budget": b,
                    "seed": seed,
                    "heads_restricted": kv,
                }
            )
    df = pd.DataFrame(rows).assign(loss_delta=0.1, needle_acc=0.5)
    df.loc[df.condition == "full", "loss_delta"] = 0.0
    fig = kvplan.figure(df, "tiny", 512, needle_len=256)
    assert "held-out texts of 512 tokens, needles of 256" in fig.texts[0].get_text()
    loss, zoom, needles = fig.axes
    (key,) = fig.legends  # one key below the panels names every curve once
    keys = [t.get_text() for t in key.get_texts()]
    assert len(keys) == len(set(keys)) == 6
    for ax in (loss, zoom, needles):
        assert _curve(ax, "plan")[0] == pytest.approx([0.0, 0.25, 0.5])
        assert _curve(ax, "random heads")[0] == pytest.approx([0.25, 0.5])
        assert _curve(ax, "random KV groups")[0] == pytest.approx([0.5, 0.75])
        # each random KV point says which budget it matches (it does not sit at that budget)
        notes = sorted(t.get_text() for t in ax.texts)
        assert notes == ["b=0.25", "b=0.5"]
        # the full-attention point is drawn over the plan's first point, not under it
        (full,) = [ln for ln in ax.lines if ln.get_label().startswith("full attention")]
        (plan,) = [ln for ln in ax.lines if ln.get_label().startswith("plan")]
        assert full.get_zorder() > plan.get_zorder()
    for ax in (loss, needles):
        # the two all-heads baselines side by side at 1, not one over the other
        a, b = _curve(ax, "all heads: sinks")[0], _curve(ax, "all heads: window")[0]
        assert a[0] < 1.0 < b[0] and b[0] - a[0] < 0.05
    # the zoom leaves the all-heads points out, so its scale is the budgets' own
    labels = [str(c.get_label()) for c in zoom.containers] + [ln.get_label() for ln in zoom.lines]
    assert not any(t.startswith("all heads") for t in labels)
    assert "own scale" in zoom.get_title() and "every condition" in loss.get_title()
    assert "needles of" not in kvplan.figure(df, "tiny", 512).texts[0].get_text()
    # the full-attention point keyed on its own; the all-heads points carry their intervals
    assert "full attention (nothing restricted)" in keys
    assert _curve(loss, "full attention")[0] == pytest.approx([0.0])
    assert "nats per token" in loss.get_ylabel()
    lo, hi = needles.get_ylim()
    assert lo < 0.0 and hi > 1.0  # points at 0 and 1 not half clipped
    wide = df.assign(
        loss_delta_low=0.05, loss_delta_high=0.2, needle_low=0.3, needle_high=0.7
    )  # every row an interval
    loss = kvplan.figure(wide, "tiny", 512).axes[0]
    bars = [
        c
        for c in loss.containers
        if str(c.get_label()).startswith("all heads: sinks") and c.has_yerr
    ]
    assert len(bars) == 1
    (segments,) = [b.get_segments() for b in bars[0].lines[2]]
    assert [float(segments[0][0][1]), float(segments[0][1][1])] == pytest.approx([0.05, 0.2])


def test_figure_merges_random_kv_points_of_budgets_with_the_same_sets():
    """Gemma 3's plan drops one KV head at both budgets, so both budgets' random-KV draws are the
    same sets: one point, one note naming both budgets (two notes printed over each other read as
    'b=0.35'). The all-heads points' bars are keyed."""
    base = {"sinks": 4, "window": 64, "kv_saved_fraction": 0.0, "needle_token_acc": 0.5}
    rows = [{**base, "condition": "full", "budget": 0.0, "seed": None, "heads_restricted": 0}]
    for name in ("streaming_all", "window_all"):
        rows.append({**base, "condition": name, "budget": 1.0, "seed": None, "heads_restricted": 8})
    for b, n in ((0.25, 2), (0.5, 4)):
        rows.append({**base, "condition": "plan", "budget": b, "seed": None, "heads_restricted": n})
        for seed in range(2):
            rows.append(
                {
                    **base,
                    "condition": "random_kv",
                    "budget": b,
                    "seed": seed,
                    "heads_restricted": 4,
                    "loss_delta": 0.01 * (seed + 1),
                }
            )
    df = pd.DataFrame(rows)
    df["loss_delta"] = df["loss_delta"].fillna(0.1)
    df.loc[df.condition == "full", "loss_delta"] = 0.0
    df = df.assign(
        needle_acc=0.5,
        loss_delta_low=df.loss_delta - 0.01,
        loss_delta_high=df.loss_delta + 0.01,
        needle_low=0.4,
        needle_high=0.6,
    )
    fig = kvplan.figure(df, "tiny", 512)
    for ax in fig.axes:
        assert [t.get_text() for t in ax.texts] == ["b=0.25, 0.5"]
        assert _curve(ax, "random KV groups")[0] == pytest.approx([0.5])
    keys = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(k.startswith("all heads: sinks + window; bars 95%") for k in keys)
    # budgets whose draws differ keep a point and a note each
    df.loc[(df.condition == "random_kv") & (df.budget == 0.5), "loss_delta"] += 0.05
    fig = kvplan.figure(df, "tiny", 512)
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["b=0.25", "b=0.5"]
