"""head_effects: modes, which heads get exact ablation, the tables it returns, and what it
refuses."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import headscope
from headscope.effects.heads import EffectSettings, choose_heads, head_effects
from headscope.metrics import get_metric


@pytest.fixture(scope="module")
def probes(tiny_gpt2):
    return headscope.default_probes(tiny_gpt2, n_prompts=3, repeat_len=5, seed=2)


def test_modes_say_which_estimator_gave_each_row(tiny_gpt2, probes):
    exact = {r.metric.name: r for r in head_effects(tiny_gpt2, probes, EffectSettings("exact"))}
    assert set(exact) == {"effect_repeat_loss", "effect_text_loss"}
    assert all((r.estimator == "exact").all() for r in exact.values())
    attr = {
        r.metric.name: r for r in head_effects(tiny_gpt2, probes, EffectSettings("attribution"))
    }
    assert set(attr) == {"effect_repeat_loss", "effect_text_loss"}
    assert all((r.estimator == "attribution").all() for r in attr.values())
    both = {r.metric.name: r for r in head_effects(tiny_gpt2, probes, EffectSettings("both"))}
    assert set(both) == {
        "effect_repeat_loss",
        "attribution_repeat_loss",
        "effect_text_loss",
        "attribution_text_loss",
    }
    for name in ("effect_repeat_loss", "effect_text_loss"):
        # exact is exact, whatever the mode
        torch.testing.assert_close(both[name].score, exact[name].score)
        assert both[name].count == exact[name].count == attr[name].count
        torch.testing.assert_close(both["attribution_" + name[7:]].score, attr[name].score)
        assert both[name].chance == 0.0


def test_auto_ablates_exactly_the_top_heads_and_estimates_the_rest(tiny_gpt2, probes, monkeypatch):
    import headscope.effects.heads as effects

    monkeypatch.setattr(effects, "TOP_BY_ATTRIBUTION", 0.0)  # at least 10 heads... of 8: all
    res = {r.metric.name: r for r in head_effects(tiny_gpt2, probes, EffectSettings("auto"))}
    assert (res["effect_repeat_loss"].estimator == "exact").all()
    attribution = torch.tensor([[0.1, -3.0, 0.0, 0.2], [0.0, 0.0, 2.0, 0.0]])
    assert set(choose_heads(attribution, None, "repeat")) == {
        (la, h) for la in range(2) for h in range(4)
    }
    big = torch.zeros(10, 10)
    big[3, 4], big[7, 1] = 5.0, -6.0
    big[1, :8] = torch.arange(1, 9) / 10  # 10 distinct non-zero |attribution|: the top 10

    def result(name, cells):  # a pattern score of the 10 x 10 model, NaN but at `cells`
        score = torch.full((10, 10), float("nan"))
        for (la, h), v in cells.items():
            score[la, h] = v
        return SimpleNamespace(metric=get_metric(name), score=score)

    scores = [
        result("induction", {(9, 9): 0.9, (8, 8): 0.7, (5, 5): 0.5, (2, 2): 0.5, (0, 1): 0.1}),
        result("entropy", {(0, 0): 0.01}),  # another probe: not read
    ]
    by_attribution = {(3, 4), (7, 1)} | {(1, h) for h in range(8)}
    # + the top 3 induction heads, the tie at 0.5 going to the lower (layer, head)
    assert choose_heads(big, scores, "repeat") == sorted(by_attribution | {(9, 9), (8, 8), (2, 2)})
    entropy = [result("entropy", {(4, 4): 0.2, (6, 6): 0.1, (8, 8): 0.9, (3, 3): 0.15})]
    # entropy is a below score: its lowest 3
    assert choose_heads(big, entropy, "text") == sorted(by_attribution | {(6, 6), (3, 3), (4, 4)})


def test_estimators_and_labels_in_the_table(tiny_gpt2, probes):
    result = headscope.scan(
        tiny_gpt2, probes, effects=EffectSettings("both"), thresholds={"effect_repeat_loss": -10.0}
    )
    s = result.scores
    assert list(s.columns)[-1] == "estimator"
    assert set(s.loc[s.metric == "effect_repeat_loss", "estimator"]) == {"exact"}
    assert set(s.loc[s.metric == "attribution_repeat_loss", "estimator"]) == {"attribution"}
    assert set(s.loc[s.metric == "induction", "estimator"]) == {""}
    # threshold -10
    assert (s.loc[s.metric == "effect_repeat_loss", "label"] == "matters for copying").all()
    # estimates are never labelled
    assert (s.loc[s.metric == "attribution_repeat_loss", "label"] == "").all()
    assert {"copying", "value_sink"} <= set(s.metric)
    assert result.metadata["effects"]["exact_heads"] == {
        "effect_repeat_loss": 8,
        "effect_text_loss": 8,
    }


def test_what_effects_refuse(tiny_bert, tiny_gpt2, probes):
    with pytest.raises(
        headscope.HeadscopeError, match="Unknown effects mode 'exactly'. Did you mean: exact"
    ):
        EffectSettings("exactly").validate()
    with pytest.raises(headscope.HeadscopeError, match="Unknown ablation 'half'"):
        EffectSettings(ablation="half").validate()
    text = headscope.default_probes(tiny_bert, n_prompts=2)
    with pytest.raises(headscope.HeadscopeError, match="is an encoder: .*use --effects exact"):
        head_effects(tiny_bert, text, EffectSettings("attribution"))
    bridge_model = headscope.load_model(tiny_gpt2.bridge)
    with pytest.raises(
        headscope.HeadscopeError, match="effects ablate heads at the attention seam"
    ):
        headscope.scan(bridge_model, probes, effects=EffectSettings())
    from transformers import GPT2Model

    from tests.tiny_models import tiny_gpt2_in_memory

    hf, tok = tiny_gpt2_in_memory()
    base = GPT2Model(hf.config)  # a decoder without its LM head
    with pytest.raises(headscope.HeadscopeError, match="has no unembedding"):
        head_effects(headscope.load_model(base, tok), probes, EffectSettings("exact"))


def test_encoders_get_exact_embedding_effects_in_auto_mode(tiny_bert):
    probes = headscope.default_probes(tiny_bert, n_prompts=3)
    (res,) = head_effects(tiny_bert, probes, EffectSettings("auto"))
    assert res.metric.name == "effect_embedding" and (res.estimator == "exact").all()
    assert (res.score >= 0).all() and np.isfinite(res.score.numpy()).all()  # 1 - cos >= 0
