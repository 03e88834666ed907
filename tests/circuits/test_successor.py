"""Successor scores against an independent reading through plain HF modules; refusals."""

import pytest
import torch

from headscope.circuits.successor import ordinal_sets, successor_scores
from headscope.errors import HeadscopeError
from tests.circuits import ov_oracle


def oracle_hits(folder, model):
    hf = ov_oracle.load(folder)
    sets = ordinal_sets(model)
    rows = []
    for layer in range(model.n_layers):
        for s in sets:
            ids = torch.tensor(s.ids).view(-1, 1)  # each token alone
            x = ov_oracle.hidden(hf, ids, 0 if layer == 0 else 1)[
                :, 0
            ]  # raw embedding, or after block 0
            for h in range(model.n_heads):
                logits = ov_oracle.head_logits(hf, x, layer, h)[:, s.ids]  # [|S|, |S|]
                top = logits.argmax(-1)
                rows.append((layer, h, s.name, [int(top[a]) == b for a, b in s.pairs]))
    hits = torch.zeros(model.n_layers, model.n_heads)
    n = sum(len(s.pairs) for s in sets)
    for layer, h, _, ok in rows:
        hits[layer, h] += sum(ok)
    return hits / n


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gemma3_sharp", "tiny_gpt2"])
def test_successor_scores_match_plain_hf(which, request):
    got = request.getfixturevalue(which)
    folder, model = (
        got if isinstance(got, tuple) else (request.getfixturevalue(which + "_dir"), got)
    )
    r = successor_scores(model, n_null=50, resamples=100)
    want = oracle_hits(folder, model)
    torch.testing.assert_close(r.score.float(), want, rtol=0, atol=1e-6)
    assert {s.name for s in r.sets} >= {
        "digits",
        "letters",
    }  # byte tokens: single tokens in any BPE
    assert r.chance == pytest.approx(sum(len(s.pairs) / len(s.ids) for s in r.sets) / r.count)
    assert (r.null_q95 >= r.null_mean).all() and (r.ci_low <= r.score + 1e-12).all()


def test_the_null_of_a_head_that_always_answers_one_token():
    """A head whose top token never depends on t hits one pair per set under any successor map."""
    from headscope.circuits.successor import OrdinalSet

    s = OrdinalSet("letters", list(range(26)), [(i, i + 1) for i in range(25)])
    perms = torch.stack(
        [torch.randperm(26, generator=torch.Generator().manual_seed(i)) for i in range(500)]
    )
    top = torch.zeros(25, dtype=torch.long)  # always "A"
    shuffled = perms[:, torch.tensor([b for _, b in s.pairs])]
    null = (top[None] == shuffled).double().mean(1)  # the module's null, for this head
    assert float(null.mean()) == pytest.approx(
        25 / 26 / 25, abs=0.01
    )  # sigma(succ t) = A for one t in 26


def test_encoders_are_refused_and_empty_sets_are_refused(tiny_bert, tiny_llama):
    with pytest.raises(HeadscopeError) as err:
        successor_scores(tiny_bert)
    assert "no trained unembedding" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(HeadscopeError) as err:
        ordinal_sets(tiny_llama, ["number_words"])
    assert "no (t, successor) pair" in str(err.value)
    r = successor_scores(
        tiny_bert, readout_kind="embeddings", n_null=10, resamples=10
    )  # the explicit opt-in
    assert r.readout == "embeddings" and r.score.shape == (tiny_bert.n_layers, tiny_bert.n_heads)
