"""Copy suppression: against plain HF modules, against headscope's copying, and its mirror."""

import pytest
import torch

from headscope.catalog import COPYING_K
from headscope.circuits.copy_suppression import copy_suppression_ranks, copy_suppression_scores
from headscope.circuits.copying import copying_ranks
from headscope.errors import HeadscopeError
from headscope.probes.pairs import repeat_probe
from tests.circuits import ov_oracle


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma3_sharp", "tiny_gpt2"])
def test_bottom_ranks_match_plain_hf(which, request):
    got = request.getfixturevalue(which)
    folder, model = (
        got if isinstance(got, tuple) else (request.getfixturevalue(which + "_dir"), got)
    )
    probe = repeat_probe(model, repeat_len=6, n_sequences=3, seed=1)
    ranks, vocab = copy_suppression_ranks(
        model, probe, max_sequences=3, batch_size=2
    )  # [seq, L, layer, head, 2]
    hf = ov_oracle.load(folder)
    ordinary = model.ordinary_vocab()
    L = probe.repeat_len
    for layer in range(model.n_layers):
        x = ov_oracle.hidden(hf, torch.tensor(probe.sequences), layer)[:, 1 : L + 1].reshape(
            -1, model.d_model
        )
        own = torch.tensor(probe.sequences)[:, 1 : L + 1].reshape(-1)
        for h in range(model.n_heads):
            logits = ov_oracle.head_logits(hf, x, layer, h)[:, ordinary]  # [seq * L, V]
            cols = torch.searchsorted(ordinary, own)
            want = (logits < logits.gather(1, cols[:, None])).sum(-1)
            assert ranks[..., layer, h, 0].reshape(-1).tolist() == want.tolist()
    assert vocab == len(ordinary)


def test_seam_copying_equals_headscope_copying_on_a_model_without_biases(tiny_llama):
    probe = repeat_probe(tiny_llama, repeat_len=6, n_sequences=3, seed=2)
    top, _ = copy_suppression_ranks(tiny_llama, probe, max_sequences=3, top=True)
    theirs, _ = copying_ranks(tiny_llama, probe, null=True)  # {(layer, head): [seq, L, 2]}
    for (layer, h), r in theirs.items():
        assert top[..., layer, h, :].tolist() == r.tolist()


def test_a_negated_head_suppresses_exactly_what_it_copied(tiny_llama_dir, tmp_path):
    import shutil

    import headscope

    model = headscope.load_model(str(tiny_llama_dir))
    hf = ov_oracle.load(tiny_llama_dir)
    dh = model.d_head
    with torch.no_grad():  # head 1 of layer 1 writes minus what it wrote
        hf.model.layers[1].self_attn.o_proj.weight[:, dh : 2 * dh] *= -1
    hf.save_pretrained(tmp_path)
    for f in tiny_llama_dir.iterdir():
        if "token" in f.name:
            shutil.copy2(f, tmp_path / f.name)
    flipped = headscope.load_model(str(tmp_path))
    probe = repeat_probe(model, repeat_len=8, n_sequences=2, seed=3)
    up, _ = copy_suppression_ranks(model, probe, max_sequences=2, top=True)
    down, _ = copy_suppression_ranks(flipped, probe, max_sequences=2)
    assert down[..., 1, 1, :].tolist() == up[..., 1, 1, :].tolist()
    assert down[..., 1, 0, :].tolist() != up[..., 1, 0, :].tolist()  # another head is not mirrored


def test_scores_pool_and_refuse(tiny_llama, tiny_bert):
    probe = repeat_probe(tiny_llama, repeat_len=6, n_sequences=4, seed=0)
    r = copy_suppression_scores(tiny_llama, probe, k=COPYING_K, max_sequences=4, resamples=50)
    ranks, vocab = copy_suppression_ranks(tiny_llama, probe, max_sequences=4)
    torch.testing.assert_close(r.score, (ranks[..., 0] < COPYING_K).double().mean((0, 1)))
    torch.testing.assert_close(r.null, (ranks[..., 1] < COPYING_K).double().mean((0, 1)))
    assert r.chance == COPYING_K / vocab and r.count == 4 * 6
    with pytest.raises(HeadscopeError) as err:
        copy_suppression_scores(tiny_bert, repeat_probe(tiny_bert, repeat_len=6, n_sequences=2))
    assert "no trained unembedding" in str(err.value)
