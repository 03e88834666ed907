"""The random whole-KV-group baselines of notebook 06 (``lib.kv_baselines``): closed forms, every
choice exactly once, the same runs as the seeded draws, ranks with ties counted as reached."""

from __future__ import annotations

import pytest

import headscope
import lib.kv_baselines as kb
from headscope.apps import kvplan
from headscope.errors import HeadscopeError
from headscope.probes.long import long_text_probe
from tests.apps.test_kvplan import small_plan
from tests.oracles import conformance as conf


@pytest.fixture(scope="module")
def llama():
    """The tiny random Llama of the kvplan tests (grouped-query attention, 256 positions)."""
    hf, tok = conf.tiny_model(next(f for f in conf.FAMILIES if f.model_type == "llama"))
    return headscope.load_model(hf, tok, name="tiny-llama")


def test_random_kv_losses_closed_forms(llama):
    """No KV head dropped, or a window holding every key: the loss does not move; a real
    restriction moves it; bad draws and mismatched sums get one clear line."""
    texts = long_text_probe(llama, 120, 2, part="heldout").sequences
    base, _ = kvplan.text_losses(llama, texts, None)
    none = kb.random_kv_losses(llama, texts, 0, 2, 2, 16, base)
    assert (none.loss_delta == 0).all() and (none.heads_restricted == 0).all()
    wide = kb.random_kv_losses(llama, texts, 2, 2, 0, 10_000, base)
    assert wide.loss_delta.abs().max() < 1e-5
    tight = kb.random_kv_losses(llama, texts, 2, 2, 0, 4, base, first_seed=5)
    assert list(tight.seed) == [5, 6] and tight.loss_delta.abs().min() > 1e-4
    with pytest.raises(HeadscopeError, match="at least one"):
        kb.random_kv_losses(llama, texts, 1, 0, 2, 16, base)
    with pytest.raises(HeadscopeError, match="per-text sums"):
        kb.random_kv_losses(llama, texts, 1, 1, 2, 16, base[:1])


def test_every_kv_group_set_is_each_choice_once_and_drops_exactly_that_many():
    sets = kb.every_kv_group_set(3, 6, 2, 2)  # 6 KV heads of 3 query heads each, choose 2
    assert len(sets) == len(set(sets)) == 15
    for heads in sets:
        assert len(heads) == 6
        assert kvplan.kv_saving(heads, 3, 6, 2, 8, 10, 0)["kv_heads_dropped"] == 2
    # a seeded draw is one of them
    assert {kvplan.random_kv_groups(3, 6, 2, 2, s) for s in range(20)} <= set(sets)
    # one KV head per layer (Gemma 3): dropping one is choosing a layer
    layers = kb.every_kv_group_set(18, 4, 1, 1)
    assert [sorted({la for la, _ in h}) for h in layers] == [[la] for la in range(18)]
    assert kb.every_kv_group_set(3, 6, 2, 0) == [frozenset()]
    with pytest.raises(HeadscopeError, match="more than limit=10"):
        kb.every_kv_group_set(3, 6, 2, 3, limit=10)
    with pytest.raises(HeadscopeError, match="Cannot choose 7"):
        kb.every_kv_group_set(3, 6, 2, 7)


def test_kv_group_losses_measure_given_sets_as_the_random_draws_do(llama):
    texts = long_text_probe(llama, 120, 2, part="heldout").sequences
    base, _ = kvplan.text_losses(llama, texts, None)
    drawn = kb.random_kv_losses(llama, texts, 1, 2, 2, 16, base)
    sets = [
        kvplan.random_kv_groups(llama.n_layers, llama.n_heads, llama.n_kv_heads, 1, s)
        for s in (0, 1)
    ]
    given = kb.kv_group_losses(llama, texts, sets, 2, 16, base)
    assert list(given.loss) == list(drawn.loss)  # bit for bit: the same runs
    assert list(given["set"]) == [0, 1] and (given.kv_heads_dropped == 1).all()
    assert given.attrs["text_sums"] == drawn.attrs["text_sums"]
    with pytest.raises(HeadscopeError, match="at least one head set"):
        kb.kv_group_losses(llama, texts, [], 2, 16, base)


def test_rank_in_counts_ties_as_reached():
    assert kb.rank_in([0.1, 0.2, 0.2, 0.4], 0.2) == {"at_or_below": 3, "n": 4, "p": 0.8}
    assert kb.rank_in([0.3] * 99, 0.1) == {"at_or_below": 0, "n": 99, "p": 0.01}
    with pytest.raises(HeadscopeError, match="at least one"):
        kb.rank_in([], 0.0)
    # every possible set: the exact share, not a permutation estimate
    assert kb.rank_in([0.1, 0.2, 0.2, 0.4], 0.2, exhaustive=True)["p"] == 0.75
    assert kb.rank_in([0.3] * 18, 0.1, exhaustive=True)["p"] == 0.0


def test_random_kv_losses_seed_s_is_kv_plans_random_kv_seed_s(llama):
    """The notebook's loss-only draws are the command's random_kv conditions: seed s there is seed
    s here, bit for bit, with the plan's number of KV heads dropped."""
    df, st = small_plan(llama)
    texts, _ = kvplan.plan_inputs(llama, st)
    full_sums = df.attrs["text_sums"][0]
    for b in (0.25, 1.0):
        plan = df[(df.condition == "plan") & (df.budget == b)].iloc[0]
        kv = df[(df.condition == "random_kv") & (df.budget == b)].reset_index(drop=True)
        dist = kb.random_kv_losses(llama, texts, int(plan.kv_heads_dropped), 3, 2, 16, full_sums)
        assert list(dist.seed) == [0, 1, 2]
        assert list(dist.loss[:2]) == list(kv.loss)
        assert list(dist.loss_delta[:2]) == list(kv.loss_delta)
        assert (dist.heads_restricted == plan.kv_heads_dropped * 2).all()
        rank = kb.rank_in(dist.loss_delta, plan.loss_delta)
        assert rank["n"] == 3 and rank["p"] == (1 + rank["at_or_below"]) / 4
