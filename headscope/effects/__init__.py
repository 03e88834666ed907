"""Causal effects: what happens to the model without each head, and
counterfactual patching on the user's own prompt pairs.

============  ======================================================================================
settings      how effects are estimated: mode and ablation (light: checked before anything loads)
targets       what an effect is measured on: a probe's loss, an encoder's embedding
loop          the one intervention loop: clean once, then jobs sharing forwards from its prefix
ablation      exact ablation: one forward per head, the clean prefix reused, a layer's heads batched
attribution   attribution patching: a first-order estimate for every head from one backward
heads         :func:`~headscope.effects.heads.head_effects`: both estimators; which heads get exact
noop          the [SEP] / BOS no-op test: a head's effect when its attention there is removed
stages        one layer's attention computed explicitly: q, k, v, pattern, z read and replaced
readout       a patching task's metric at the last position (logit_diff, prob, loss)
patching      exact patching of every head's z, q, k, v, pattern: cached runs, resume, layer batches
patch_attribution  attribution patching: every head and activation from one forward + backward
logit_attribution  direct logit attribution of every head through frozen norms
patch_table   effects as ratios of means, bootstrap intervals over pairs, the tidy tables
function_vectors  function-vector heads: mean outputs, indirect effects from a cached prefix
icl_stats     means over tasks of means over prompts, rank agreement, overlaps with chance
============  ======================================================================================
"""
