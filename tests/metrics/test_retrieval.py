"""Long-context heads: the prose corpus, the long and needle probes, streaming and retrieval on every
engine, and the KV plan's restricted runs (kernel against masks), memory counting and CLI refusals.

The long prose corpus downloads once from PyPI (``brotli==1.2.1`` sdist, 7.4 MB) into the cache.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope
from headscope.probes.long import long_text_probe, needle_probe
from headscope.apps import conformance as conf

LONG = ["sink", "streaming", "retrieval", "retrieval_soft"]


@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama with grouped-query attention (4 query heads, 2 KV heads), 256 positions."""
    fam = next(f for f in conf.FAMILIES if f.model_type == "llama")
    hf, tok = conf.tiny_model(fam)
    return headscope.load_model(hf, tok, name="tiny-llama")

# ------------------------------------------------------------------------------ the KV plan



def test_streaming_and_retrieval_agree_across_engines(llama):
    text = long_text_probe(llama, 240, 2)
    text.settings["band"] = [2, 16]
    needle = needle_probe(llama, [150, 240], depths=(0.2, 0.8), k=4)
    got = {e: headscope.scan(llama, [text, needle], metrics=LONG, engine=e, bootstrap=0, null=False,
                             examples=False).scores for e in ("fused", "blocked", "hooks")}
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


def test_retrieval_hits_are_the_argmax_on_the_target(llama):
    """An oracle over HF eager attention (no headscope metric code): hits where arg-max == target."""
    needle = needle_probe(llama, [160], depths=(0.5,), k=6)
    res = headscope.scan(llama, [needle], metrics=["retrieval", "retrieval_soft"], engine="fused", bootstrap=0,
                         null=False, examples=False).scores
    A = conf.eager_attentions(llama.hf, needle.sequences[0])  # [layer, head, q, k]
    t = needle.targets(0)
    qs, ks = torch.tensor(list(t)), torch.tensor(list(t.values()))
    hits = (A[:, :, qs].argmax(-1) == ks).double().mean(-1)
    soft = A[:, :, qs, ks].mean(-1)
    r = res[res.metric == "retrieval"].sort_values(["layer", "head"]).score.to_numpy().reshape(hits.shape)
    s = res[res.metric == "retrieval_soft"].sort_values(["layer", "head"]).score.to_numpy().reshape(soft.shape)
    assert np.allclose(r, hits.numpy()) and np.allclose(s, soft.numpy(), atol=1e-6)
