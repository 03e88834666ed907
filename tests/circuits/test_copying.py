"""The copying rows of a scan: copying@k through each head's OV circuit, as analysis.copying computes it."""

from __future__ import annotations

import torch

import headscope
from headscope.circuits.copying import COPYING, COPYING_K, copying_scores, ov_copying


def test_copying_scores_are_ov_copying_for_every_head(tiny_gpt2):
    probe = headscope.default_probes(tiny_gpt2, n_prompts=5, repeat_len=6)[1]
    got = copying_scores(tiny_gpt2, probe, max_sequences=3)
    table = ov_copying(tiny_gpt2, headscope.repeat_probe(tiny_gpt2, 6, n_sequences=5), k=COPYING_K)
    assert got.metric is COPYING and got.count == 3 * 6
    first3 = ov_copying(tiny_gpt2, type(probe)(probe.name, probe.sequences[:3], probe.repeat_len), k=COPYING_K)
    want = torch.tensor(first3.pivot(index="layer", columns="head", values="copying").to_numpy(), dtype=torch.float64)
    torch.testing.assert_close(got.score, want)
    assert got.chance == COPYING_K / (len(tiny_gpt2.ordinary_vocab())) and len(table) == 8
