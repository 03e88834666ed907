"""The long-context metrics: registered but not default, chance in closed form on uniform heads,
and streaming and retrieval equal on every engine of a tiny grouped-query Llama."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope
from headscope.metrics import REGISTRY, PatternBatch, uniform_pattern
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


def test_streaming_and_retrieval_agree_across_engines(llama):
    text = long_text_probe(llama, 240, 2)
    text.settings["band"] = [2, 16]
    needle = needle_probe(llama, [150, 240], depths=(0.2, 0.8), k=4)
    got = {
        e: headscope.scan(
            llama, [text, needle], metrics=LONG, engine=e, bootstrap=0, null=False, examples=False
        ).scores
        for e in ("fused", "blocked", "hooks")
    }
    ref = got["fused"]
    for e in ("blocked", "hooks"):
        assert np.allclose(got[e].score, ref.score, atol=1e-5, equal_nan=True), e
        assert np.allclose(got[e].chance, ref.chance, atol=1e-7) and (got[e].n == ref.n).all()
    stream = ref[ref.metric == "streaming"]
    assert int(stream.n.iloc[0]) == 2 * (240 - 18)  # queries q >= sinks + window
    # closed form chance: a uniform head keeps 18 of q+1 keys
    want = np.mean([18 / (q + 1) for _ in range(2) for q in range(18, 240)])
    assert stream.chance.iloc[0] == pytest.approx(want, abs=1e-6)
    assert int(ref[ref.metric == "retrieval"].n.iloc[0]) == 4 * 4


def test_long_context_metrics_are_registered_but_not_default():
    from headscope.metrics import retrieval, streaming

    assert [n for n in REGISTRY if not REGISTRY[n].default] == [
        "streaming",
        "retrieval",
        "retrieval_soft",
        "rare_word",
    ]
    assert REGISTRY["streaming"] is streaming.METRIC and REGISTRY["retrieval"] is retrieval.METRIC
    assert (
        REGISTRY["retrieval_soft"] is retrieval.SOFT
        and retrieval.METRIC.chance_fn is retrieval.retrieval_soft
    )
    assert streaming.METRIC.needs == ("band",) and retrieval.METRIC.needs == ("argmax",)
    assert REGISTRY["retrieval"].probe == "needle" and REGISTRY["streaming"].probe == "text"


def test_long_context_chance_closed_forms():
    """A uniform causal head over n = 9 keys: streaming with 1 sink + 2-key window keeps 3 of q+1
    keys at q >= 3; retrieval's chance (a head picking a visible key at random) is 1/(q+1)."""
    n = 9
    targets = torch.full((1, n), -1)
    targets[0, 6], targets[0, 8] = 2, 3
    b = PatternBatch(torch.tensor([n]), True, band=(1, 2), targets=targets)
    U = uniform_pattern((1, 1, n, n), b)
    want = sum(3 / (q + 1) for q in range(3, n)) / (n - 3)
    assert REGISTRY["streaming"](U, b).score().item() == pytest.approx(want)
    assert REGISTRY["retrieval_soft"](U, b).score().item() == pytest.approx((1 / 7 + 1 / 9) / 2)
    assert REGISTRY["retrieval"].chance_fn(U, b).score().item() == pytest.approx(
        (1 / 7 + 1 / 9) / 2
    )
    # the arg-max of equal weights is key 0
    assert REGISTRY["retrieval"](U, b).score().item() == 0.0
