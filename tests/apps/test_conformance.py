"""The conformance suite: every family's tiny random model, every engine, against HF eager
attention.

Each family runs :func:`tests.oracles.conformance.check` (scan with every engine; compare every
score, chance and n with the 8 metrics computed from ``output_attentions=True``). A family passes
when no engine gives a wrong score or crashes, and when what the run found is what the shipped
table (``headscope/data/support.json``, the site's table, ``headscope models --support``) says.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers

from headscope.engines.support import load_support, support_markdown, support_meta, support_text
from tests.oracles import conformance as conf

SHIPPED = load_support()
MADE_WITH = support_meta()["transformers"]
REGENERATE = "python -m scripts.conformance --write"


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("family", conf.FAMILIES, ids=[f.model_type for f in conf.FAMILIES])
def test_family_is_exact_or_refused_as_the_table_says(family):
    outcomes = conf.check(family)
    shipped = SHIPPED[family.name]["engines"]
    exact = [o.engine for o in outcomes if o.status == "exact"]
    for o in outcomes:
        assert o.status in ("exact", "refused"), (
            f"{family.name} / {o.engine}: {o.status}: {o.detail}"
        )
        assert shipped[o.engine]["status"] == o.status, (
            f"{family.name} / {o.engine}: table says "
            f"{shipped[o.engine]['status']}, the run found {o.status} ({o.detail}). The table "
            f"was made with transformers {MADE_WITH}, this is {transformers.__version__}: "
            f"regenerate it with `{REGENERATE}` (and read what changed) or install "
            f"transformers=={MADE_WITH}"
        )
        if o.status == "refused":
            assert "\n" not in o.detail and o.detail == shipped[o.engine]["detail"]
            others = [e for e in exact if e != o.engine]
            if others:  # a refusal names an engine that can score the family
                assert any(f"--engine {e}" in o.detail for e in others), o.detail
        else:
            assert o.max_diff <= conf.TOL


def test_the_table_names_the_command_that_regenerates_it():
    assert support_meta()["generated_by"] == REGENERATE


def test_the_table_covers_enough_families():
    assert [f.name for f in conf.FAMILIES] == list(SHIPPED), f"support.json is stale: {REGENERATE}"
    scored = {
        n: row
        for n, row in SHIPPED.items()
        if any(o["status"] == "exact" for o in row["engines"].values())
    }
    assert len(scored) >= 20
    assert sum(row["kind"] == "encoder" for row in scored.values()) >= 4
    windowed = [n for n, row in scored.items() if "window" in row["note"]]
    assert len(windowed) >= 5, windowed


def test_the_site_table_is_generated_from_the_shipped_table():
    """The support table lives on the site's models page, generated from support.json when the site
    is built (docs/hooks.py; tests/docs/test_site.py checks the generator); the README holds no
    hand copy that could go stale (the test reads the files as text: it never imports ``docs/``)."""
    root = Path(__file__).resolve().parents[2]
    assert "<!-- headscope:support -->" in (root / "docs" / "models.md").read_text()
    assert support_markdown(SHIPPED).splitlines()[0] not in (root / "README.md").read_text()


def test_support_text_names_every_family_and_reason():
    text = support_text(SHIPPED)
    for name, row in SHIPPED.items():
        assert name in text
        for e, o in row["engines"].items():
            if o["status"] == "refused":
                assert o["detail"].replace(f"The {e} engine cannot run here: ", "") in text


# ------------------------------------------------------------------------------ the oracle can fail


def _llama():
    fam = next(f for f in conf.FAMILIES if f.model_type == "llama")
    import headscope

    hf, tok = conf.tiny_model(fam)
    model = headscope.load_model(hf, tok)
    probes = conf.probes_for(model)
    oracle = conf.oracle_scores(hf, tok, probes, model.causal)
    scores = headscope.scan(
        model, probes, engine="blocked", bootstrap=0, null=False, examples=False
    ).scores
    return fam, scores, oracle


def test_oracle_catches_a_wrong_score_chance_or_count():
    fam, scores, oracle = _llama()
    assert conf._compare(fam, "blocked", scores, oracle).status == "exact"
    for column, delta in (("score", 1e-4), ("chance", 1e-4), ("n", 1)):
        bad = scores.copy()
        rows = bad.index[(bad["metric"] == "sink") & (bad["layer"] == 1)]
        bad.loc[rows, column] = bad.loc[rows, column] + delta
        out = conf._compare(fam, "blocked", bad, oracle)
        assert out.status == "wrong" and "sink" in out.detail, (column, out)


def test_oracle_chance_on_a_sliding_window_is_the_closed_form():
    """Gemma 3's tiny config: layers 0-1 slide over 6 keys, layer 2 sees everything. A uniform
    head's previous-token score is 1/(keys it can see): 1/min(q+1, 6) in a sliding layer."""
    import headscope

    fam = next(f for f in conf.FAMILIES if f.model_type == "gemma3_text")
    hf, tok = conf.tiny_model(fam)
    model = headscope.load_model(hf, tok)
    assert model.reach == (conf.WINDOW - 1, conf.WINDOW - 1, None)
    probes = conf.probes_for(model)
    text = next(p for p in probes if p.name == "text")
    assert min(len(s) for s in text.sequences) > conf.WINDOW  # the window bites on every sequence
    qs = [q for s in text.sequences for q in range(1, len(s))]
    want_sliding = sum(1 / min(q + 1, conf.WINDOW) for q in qs) / len(qs)
    want_full = sum(1 / (q + 1) for q in qs) / len(qs)
    res = headscope.scan(
        model,
        [text],
        metrics=["previous_token", "sink"],
        engine="fused",
        bootstrap=0,
        null=False,
        examples=False,
    ).scores
    prev = res[res.metric == "previous_token"].groupby("layer")["chance"].first()
    assert prev.tolist() == pytest.approx([want_sliding, want_sliding, want_full], abs=1e-7)
    # the sink key lies outside the window for q >= 6: chance counts it only where it is visible
    sink = res[res.metric == "sink"].groupby("layer")["chance"].first()
    want_sink = sum(1 / (q + 1) for q in qs if q < conf.WINDOW) / len(qs)
    assert sink.tolist()[:2] == pytest.approx([want_sink] * 2, abs=1e-7)
    assert not math.isclose(sink.tolist()[0], sink.tolist()[2])
    # and the model's own attention puts exactly 0 on that key from every sliding-layer query past
    # the window
    A = conf.eager_attentions(hf, list(text.sequences[0]))
    assert (
        float(A[:2, :, conf.WINDOW :, 0].abs().max()) == 0.0
        and float(A[2, :, conf.WINDOW :, 0].min()) > 0
    )
