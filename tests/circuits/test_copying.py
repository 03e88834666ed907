"""The copying rows of a scan: copying@k through each head's OV circuit (the notebooks' per-head
table, ``lib.copying.ov_copying``, is checked against them in tests/analyses/test_copying.py)."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.circuits.copying import (
    copying_ranks,
    copying_scores,
    null_columns,
    own_token_ranks,
)
from headscope.probes.pairs import repeat_probe

# ------------------------------------------------------------------------------ the control


def test_the_control_tells_a_copier_from_a_head_that_raises_every_token_of_r():
    """Hand-built OV circuits on a 20-token vocabulary, R = tokens 0..7 (inputs one-hot):
    a copier writes the attended token; a 'topic' head writes all of R's tokens equally."""
    vocab, L = 20, 8
    x = torch.eye(vocab)[:L]  # input k holds token k
    own = torch.arange(L)[None, :]  # [1 sequence, L]
    cols = torch.stack([own.flatten(), null_columns(own).flatten()], 1)  # [L, 2]
    assert (cols[:, 0] != cols[:, 1]).all() and sorted(cols[:, 1].tolist()) == list(range(L))
    eye = torch.eye(vocab)
    copier = own_token_ranks(x, cols, eye, eye, eye)  # [L, 2]
    topic_out = torch.zeros(vocab, vocab)
    topic_out[:, :L] = 1.0  # every input raises tokens 0..7 alike
    topic = own_token_ranks(x, cols, eye, topic_out, eye)
    k = 1
    # copies, null 0
    assert (copier[:, 0] < k).float().mean() == 1 and (copier[:, 1] < k).float().mean() == 0
    # ties: null = score
    assert (topic[:, 0] < k).float().mean() == 1 and (topic[:, 1] < k).float().mean() == 1
    # [n] columns: as before
    assert torch.equal(copier[:, 0], own_token_ranks(x, cols[:, 0], eye, eye, eye))


def test_copying_null_is_in_the_scan_table(tiny_gpt2):
    from headscope.effects.heads import EffectSettings

    probes = headscope.default_probes(tiny_gpt2, n_prompts=3, repeat_len=6)
    result = headscope.scan(
        tiny_gpt2,
        probes,
        metrics=["induction"],
        bootstrap=0,
        effects=EffectSettings(mode="exact", n_sequences=3),
    )
    rows = result.scores[result.scores.metric == "copying"]
    direct = copying_scores(tiny_gpt2, probes[1], max_sequences=3)
    assert rows["null"].notna().all()
    torch.testing.assert_close(torch.tensor(rows["null"].to_numpy()).view(2, 4), direct.null)


# ------------------------------------------------------------------------------ against plain HF
# modules


def _oracle_ranks(folder, model, probe, gemma_gain: bool = True):
    """Own-token ranks through each head, read with plain HF modules (tests/circuits/ov_oracle.py):
    ``{(layer, head): [sequence * L]}``; ``gemma_gain=False`` reads Gemma's norms as ``w`` (the old
    bug)."""
    from tests.circuits import ov_oracle

    hf = ov_oracle.load(folder)
    if not gemma_gain:  # what headscope computed before the fix: raw w, no post-attention norm
        with torch.no_grad():
            for blk in hf.model.layers:
                blk.post_attention_layernorm.weight.fill_(0.0)  # (1 + 0): gain 1, as if absent
            hf.model.norm.weight.sub_(1.0)  # (1 + (w - 1)) = w
    ordinary = model.ordinary_vocab()
    L = probe.repeat_len
    tokens = torch.tensor(probe.sequences)
    own = torch.searchsorted(ordinary, tokens[:, 1 : L + 1].reshape(-1))
    out = {}
    for layer in range(model.n_layers):
        x = ov_oracle.hidden(hf, tokens, layer)[:, 1 : L + 1].reshape(-1, model.d_model)
        for h in range(model.n_heads):
            logits = ov_oracle.head_logits(hf, x, layer, h)[:, ordinary]  # [seq * L, V]
            out[(layer, h)] = (logits > logits.gather(1, own[:, None])).sum(-1)
    return out


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma3_sharp"])
def test_copying_ranks_equal_plain_hf_modules(which, request):
    """Gemma 3 applies x (1 + w) in its RMSNorms and normalises the attention output before the
    residual add: copying reads both (Model.circuit_weights), so its ranks are the exact ones."""
    got = request.getfixturevalue(which)
    folder, model = (
        got if isinstance(got, tuple) else (request.getfixturevalue(which + "_dir"), got)
    )
    probe = repeat_probe(model, repeat_len=6, n_sequences=3, seed=1)
    ranks, _ = copying_ranks(model, probe)
    want = _oracle_ranks(folder, model, probe)
    for key, r in ranks.items():
        assert r.reshape(-1).tolist() == want[key].tolist(), key
    if which == "tiny_gemma3_sharp":  # the test can fail: the old reading gives other ranks
        old = _oracle_ranks(folder, model, probe, gemma_gain=False)
        assert any(r.reshape(-1).tolist() != old[key].tolist() for key, r in ranks.items())
        cw = model.circuit_weights()
        torch.testing.assert_close(cw.ln_final, 1 + model.hf.model.norm.weight.float())
        assert cw.post_attn is not None and cw.post_attn.shape == (model.n_layers, model.d_model)


def test_models_without_gemma_norms_read_their_weights_unchanged(tiny_llama, tiny_gpt2):
    for model in (tiny_llama, tiny_gpt2):
        cw = model.circuit_weights()
        assert cw.post_attn is None
        assert torch.equal(cw.ln_final, model.bridge.ln_final.w.detach().float().cpu())
