"""value_sink: position 0's share of a head's output norm, against an independent recomputation
from the transformer-lens bridge's own pattern and values."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.circuits.value_weighted import value_norms, value_sink_scores, value_weighted_share


def test_closed_forms():
    A = torch.tensor([[[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.4, 0.4]]]])  # [1, 1, 3, 3]
    same = torch.ones(1, 1, 3)
    # equal norms: the weight
    torch.testing.assert_close(value_weighted_share(A, same)[0, 0], A[0, 0, :, 0].double())
    norms = torch.tensor([[[0.0, 1.0, 1.0]]])  # position 0 sends nothing
    # row 0 weighs nothing: 0
    assert value_weighted_share(A, norms)[0, 0].tolist() == [0.0, 0.0, 0.0]
    # [head, dim, d_model]
    W = torch.eye(2)[None].repeat(3, 1, 1) * torch.tensor([1.0, 2.0, 3.0])[:, None, None]
    v = torch.tensor([[[[3.0, 4.0]]]])  # [batch, kv_head=1, key, dim]: |v| = 5
    # three query heads share the KV head
    assert value_norms(v, W)[0, :, 0].tolist() == [5.0, 10.0, 15.0]


def test_value_sink_matches_the_bridges_pattern_and_values(tiny_gpt2):
    probe = headscope.default_probes(tiny_gpt2, n_prompts=3)[0]
    got = value_sink_scores(tiny_gpt2, probe, batch_size=2)
    W_O = tiny_gpt2.bridge.W_O.detach().double()  # [layer, head, d_head, d_model]
    total = torch.zeros(tiny_gpt2.n_layers, tiny_gpt2.n_heads, dtype=torch.float64)
    count = 0
    for ids in probe.sequences:
        acts = tiny_gpt2.attention_activations(ids, range(tiny_gpt2.n_layers))
        for layer, a in acts.items():
            # [head, key, d_model] (no GQA here)
            f = torch.einsum("hkd,hde->hke", a["v"].double(), W_O[layer])
            norms = f.norm(dim=-1)  # [head, key]
            p = a["pattern"].double()  # [head, query, key]
            # [head, query]
            share = p[:, :, 0] * norms[:, None, 0] / (p * norms[:, None, :]).sum(-1)
            total[layer] += share[:, 1:].sum(-1)
        count += len(ids) - 1
    torch.testing.assert_close(got.score, total / count, atol=1e-5, rtol=0)
    assert got.count == count and got.chance != got.chance  # NaN: no single chance


@pytest.mark.real
def test_smollm2_sinks_by_weight_and_by_norm(smollm2):
    probe = headscope.default_probes(smollm2, n_prompts=4)[0]
    got = value_sink_scores(smollm2, probe)
    weight = headscope.scan(smollm2, [probe], metrics=["sink"]).scores
    by_weight = torch.tensor(headscope.matrix(weight, "sink").to_numpy())
    # a share by norm of a head whose weight on position 0 is ~1 stays ~1; elsewhere they differ
    assert float(got.score[by_weight > 0.99].min()) > 0.9
    assert float((got.score - by_weight).abs().max()) > 0.2
