"""The retrieval metrics (needle copy-paste): hits are the arg-max on the needle token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope
from headscope.probes.long import needle_probe
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


def test_retrieval_hits_are_the_argmax_on_the_target(llama):
    """An oracle over HF eager attention (no headscope metric code): hits where arg-max ==
    target."""
    needle = needle_probe(llama, [160], depths=(0.5,), k=6)
    res = headscope.scan(
        llama,
        [needle],
        metrics=["retrieval", "retrieval_soft"],
        engine="fused",
        bootstrap=0,
        null=False,
        examples=False,
    ).scores
    A = conf.eager_attentions(llama.hf, needle.sequences[0])  # [layer, head, q, k]
    t = needle.targets(0)
    qs, ks = torch.tensor(list(t)), torch.tensor(list(t.values()))
    hits = (A[:, :, qs].argmax(-1) == ks).double().mean(-1)
    soft = A[:, :, qs, ks].mean(-1)
    r = (
        res[res.metric == "retrieval"]
        .sort_values(["layer", "head"])
        .score.to_numpy()
        .reshape(hits.shape)
    )
    s = (
        res[res.metric == "retrieval_soft"]
        .sort_values(["layer", "head"])
        .score.to_numpy()
        .reshape(soft.shape)
    )
    assert np.allclose(r, hits.numpy()) and np.allclose(s, soft.numpy(), atol=1e-6)
