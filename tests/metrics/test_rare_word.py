"""rare_word: closed forms on hand-built patterns, every engine agrees, and an independent
recount."""

import os

import pytest
import torch

from headscope.engines.extract import score_probe
from headscope.metrics import PatternBatch, get_metric
from headscope.metrics.rare_word import rare_word, rare_word_chance
from headscope.probes.pairs import text_probe
from headscope.probes.unigrams import key_counts, unigram_counts

INF = float("inf")


def test_closed_forms_causal_with_ties_specials_and_padding():
    # one sequence of 5 real tokens + 1 padding; key 3 is special (inf), keys 1 and 4 tie as the
    # rarest
    counts = torch.tensor([[INF, 2.0, 7.0, INF, 2.0, 1.0]])
    A = torch.zeros(1, 2, 6, 6)
    A[0, :, 0, 0] = 1
    A[0, 0, 1:, 0] = 1.0  # head 0: a sink head, never a hit
    for q in range(
        1, 6
    ):  # head 1: attends to the last key <= q with count 2 (keys 1, 4), else to itself
        k = 4 if q >= 4 else 1
        A[0, 1, q, k] = 1.0
    b = PatternBatch(lengths=torch.tensor([5]), causal=True, key_counts=counts)
    pooled = rare_word(A, b)
    # qualifying: q = 2 (counts key 1), q = 3 (keys 1, 2; 3 is special), q = 4 (keys 1, 2; not
    # itself)
    assert pooled.count.tolist() == [3.0]
    # head 1: q=2 -> key 1 (rarest) hit; q=3 -> key 1 hit; q=4 -> key 4 is the query itself: miss
    assert pooled.score().tolist() == [[0.0, 2 / 3]]
    assert rare_word_chance(A, b).score()[0, 0].item() == pytest.approx((1 + 1 / 2 + 1 / 2) / 3)


def test_closed_forms_encoder_sees_both_sides():
    counts = torch.tensor([[INF, 3.0, 1.0, 3.0, INF]])  # [CLS] a b a [SEP]
    A = torch.zeros(1, 1, 5, 5)
    A[0, 0, :, 2] = 1.0  # every query attends to key 2, the rarest
    b = PatternBatch(lengths=torch.tensor([5]), causal=False, key_counts=counts)
    p = rare_word(A, b)
    assert p.count.tolist() == [5.0]  # every query has counted keys (1..3 but itself)
    # q = 2 attends to itself, which is never counted: a miss; every other query hits
    assert p.score().item() == pytest.approx(4 / 5)
    assert rare_word_chance(A, b).score().item() == pytest.approx(
        (1 / 3 + 1 / 2 + 1 / 2 + 1 / 2 + 1 / 3) / 5
    )


def test_padded_batch_scores_like_one_sequence_at_a_time():
    gen = torch.Generator().manual_seed(0)
    A = torch.rand(2, 3, 7, 7, generator=gen).tril().softmax(-1).tril()
    A = A / A.sum(-1, keepdim=True)
    counts = torch.randint(0, 4, (2, 7), generator=gen).double()
    counts[:, 0] = INF
    lengths = torch.tensor([7, 4])
    both = rare_word(A, PatternBatch(lengths=lengths, causal=True, key_counts=counts))
    for i, n in enumerate(lengths.tolist()):
        one = rare_word(
            A[i : i + 1, :, :n, :n],
            PatternBatch(lengths=torch.tensor([n]), causal=True, key_counts=counts[i : i + 1, :n]),
        )
        torch.testing.assert_close(both.total[i], one.total[0])
        assert both.count[i] == one.count[0]


@pytest.mark.skipif(os.environ.get("HEADSCOPE_KERNEL") == "0", reason="fused kernel disabled")
@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_bert"])
def test_every_engine_agrees(fixture, request):
    model = request.getfixturevalue(fixture)
    probe = text_probe(model, n_prompts=6)
    metric = [get_metric("rare_word")]
    ref = score_probe(model, probe, metric, batch_size=4, engine="hooks")["rare_word"]
    from headscope.engines.registry import get_engine

    engines = ["fused", "blocked"] + (
        ["flex"] if get_engine("flex").unavailable(model, metric) is None else []
    )
    assert "flex" in engines or get_engine("flex").unavailable(
        model, metric
    )  # says why it cannot run here
    for engine in engines:
        got = score_probe(model, probe, metric, batch_size=3, engine=engine)["rare_word"]
        torch.testing.assert_close(got.score, ref.score, atol=1e-5, rtol=0)
        assert got.count == ref.count and got.chance == pytest.approx(ref.chance)
    assert 0 < float(ref.score.max()) and ref.count > 0


def test_independent_recount_with_hf_eager(tiny_gpt2_dir, tiny_gpt2):
    """Plain HF eager attention (output_attentions) and a loop; shares nothing with the metric."""
    from transformers import AutoModelForCausalLM

    from headscope.probes.corpus import long_text

    hf = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir, attn_implementation="eager").eval()
    tok = tiny_gpt2.tokenizer
    table = {}
    for part in ("scan", "heldout"):
        for i in tok(long_text(part), add_special_tokens=False)["input_ids"]:
            table[i] = table.get(i, 0) + 1
    special = set(tok.all_special_ids)
    probe = text_probe(tiny_gpt2, n_prompts=4)
    hits = torch.zeros(hf.config.n_layer, hf.config.n_head)
    n = 0
    for ids in probe.sequences:
        with torch.no_grad():
            att = hf(
                input_ids=torch.tensor([ids]), output_attentions=True
            ).attentions  # per layer [1, head, q, k]
        for q in range(len(ids)):
            keys = [k for k in range(1, q + 1) if k != q and ids[k] not in special]
            if not keys:
                continue
            n += 1
            rarest = min(table.get(ids[k], 0) for k in keys)
            for layer, a in enumerate(att):
                for h in range(a.shape[1]):
                    top = int(a[0, h, q, : q + 1].argmax())
                    hits[layer, h] += top in keys and table.get(ids[top], 0) == rarest
    got = score_probe(tiny_gpt2, probe, [get_metric("rare_word")], batch_size=2, engine="blocked")[
        "rare_word"
    ]
    assert got.count == n
    torch.testing.assert_close(got.score.float(), hits / n, atol=1e-6, rtol=0)
    counts = unigram_counts(tiny_gpt2)
    kc = key_counts(
        tiny_gpt2,
        torch.tensor([probe.sequences[0]]),
        torch.ones(1, len(probe.sequences[0]), dtype=torch.bool),
    )
    assert kc[0, 0] == INF and counts[probe.sequences[0][1]] == table.get(probe.sequences[0][1], 0)
