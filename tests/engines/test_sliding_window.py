"""Sliding-window layers (Gemma 3: every layer but the global ones sees only ``q - w < k <= q``):
headscope's patterns and scores follow the model's own mask. A random 2-layer Gemma 3 (layer 0
sliding with window 4, layer 1 global) on sequences longer than the window."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope
from headscope.result import Probe
from headscope.scanner.examples import example_patterns

WINDOW = 4  # tests/tiny_models.make_tiny_gemma3's default


@pytest.fixture(scope="module")
def tiny_gemma3(tiny_gemma3_dir):
    return headscope.load_model(str(tiny_gemma3_dir))


def _ids(model, n: int = 16) -> list[int]:
    g = torch.Generator().manual_seed(0)
    vocab = model.ordinary_vocab()
    return [model.bos_id, *vocab[torch.randperm(len(vocab), generator=g)[: n - 1]].tolist()]


def test_tiny_gemma3_loads_with_its_window(tiny_gemma3):
    m = tiny_gemma3
    assert (m.n_layers, m.n_heads, m.n_kv_heads, m.causal) == (2, 4, 1, True)
    assert m.hf.config.layer_types == ["sliding_attention", "full_attention"]
    assert m.attention_interface  # the fused and blocked engines reach its attention


@pytest.mark.parametrize("engine", ["blocked", "hooks"])
def test_sliding_layer_gives_no_attention_outside_its_window(tiny_gemma3, tiny_gemma3_dir, engine):
    from transformers import AutoModelForCausalLM

    m = tiny_gemma3
    ids = _ids(m)
    n = len(ids)
    heads = [(layer, h) for layer in range(2) for h in range(m.n_heads)]
    pattern = example_patterns(m, [Probe(name="text", sequences=[ids])], heads, engine=engine)[0][
        "pattern"
    ]
    q, k = np.arange(n)[:, None], np.arange(n)[None, :]
    outside = (q - k >= WINDOW) | (k > q)
    sliding, full = pattern[: m.n_heads], pattern[m.n_heads :]  # [head, query, key] each
    assert np.abs(pattern.sum(-1) - 1).max() < 1e-5
    assert sliding[:, outside].max() == 0.0
    assert (sliding[:, (q - k == WINDOW - 1)] > 0).all()  # the window's far edge is still seen
    # the global layer does look beyond the window (so the window above is the layer's, not the
    # test's)
    assert full[:, (q - k >= WINDOW)].sum(-1).min() > 0.05
    assert full[:, k > q].max() == 0.0
    # and both are the model's own eager attention
    eager = AutoModelForCausalLM.from_pretrained(
        str(tiny_gemma3_dir), attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        att = eager.model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    np.testing.assert_allclose(sliding, att[0][0].numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(full, att[1][0].numpy(), atol=1e-5, rtol=0)


def test_engines_agree_on_a_sliding_window_model(tiny_gemma3):
    """Sequences (2 x 10 + 1 and text pairs) longer than the window: same scores from all three
    engines."""
    probes = headscope.default_probes(tiny_gemma3, n_prompts=6, repeat_len=10)
    assert max(len(s) for p in probes for s in p.sequences) > 2 * WINDOW
    scores = {
        e: headscope.scan(
            tiny_gemma3, probes, engine=e, null=False, examples=False, bootstrap=0
        ).scores
        for e in ("fused", "blocked", "hooks")
    }
    base = scores["hooks"].set_index(["metric", "layer", "head"]).sort_index()
    for engine in ("fused", "blocked"):
        other = scores[engine].set_index(["metric", "layer", "head"]).sort_index()
        np.testing.assert_allclose(
            other["score"].to_numpy(float),
            base["score"].to_numpy(float),
            atol=1e-5,
            rtol=0,
            err_msg=engine,
        )
        assert (other["n"] == base["n"]).all()
