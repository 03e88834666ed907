"""Causal effects: what happens to the model without each head, and
counterfactual patching on the user's own prompt pairs.

============  =======================================================================================
settings      how effects are estimated: mode and ablation (light: checked before anything loads)
targets       what an effect is measured on: a probe's loss, an encoder's embedding
ablation      exact ablation: one forward per head, the clean prefix reused, a layer's heads batched
attribution   attribution patching: a first-order estimate for every head from one backward
heads         :func:`~headscope.effects.heads.head_effects`: both estimators, and which heads get exact
noop          the [SEP] / BOS no-op test: a head's effect when its attention there is removed (census)
============  =======================================================================================
"""
