"""Helpers behind the report notebooks in ``analyses/``: each one a small, tested function.

* :mod:`headscope.analysis.profiles`: per-layer means of a scan (Clark et al. 2019), labelled heads,
  heatmaps of several models side by side.
* :mod:`headscope.analysis.induction`: one head's pattern on token ids, the induction stripe, the
  per-token loss on each copy of a repeated sequence, induction score against repeat length.
* :mod:`headscope.analysis.copying`: how much a head's OV circuit raises the logit of the token it
  attends to (on real inputs, and Olsson et al.'s weights-only eigenvalue score).
* :mod:`headscope.analysis.sinks`: sink rate (Gu et al. 2024) and probes without their first token.
* :mod:`headscope.analysis.attention_math`: the seed article's attention by hand (its example, the
  causal mask, grouped-query ``repeat_kv``, the missing sense of order).
* :mod:`headscope.analysis.score_scale`: why scores are divided by sqrt(d_k), as seeded simulations.
* :mod:`headscope.analysis.model_checks`: from-scratch attention against a real model (every layer's
  pattern and head outputs, the KV-cache property, shuffled tokens).
* :mod:`headscope.analysis.cost`: the score grid's size and FLOPs beside measured scan time (the
  timer and quadratic fit are :mod:`headscope.analysis.timing`, shared with ``benchmarks/``).
* :mod:`headscope.analysis.atlas`: several models' scores on one relative-depth axis (layer /
  (n_layers - 1)): a tidy table, per-depth-bin summaries (early/middle/late), a figure.
* :mod:`headscope.analysis.phase_change`: the induction phase change of a small trained model.
* :mod:`headscope.analysis.controls`: intervals (bootstrap over sequences, Wilson) and controls
  that can fail (size-matched random head groups, mean / zero / resample group ablation, sink
  controls, random KV groups, curve-change correlations against circular shifts).
* :mod:`headscope.analysis.timing`: one timer and one quadratic fit (notebooks and ``benchmarks/``).
* :mod:`headscope.analysis.patching`: attribution against exact patching with intervals over pairs,
  attention from the last position, OV name copying, Wang et al.'s GPT-2 small IOI heads.
* :mod:`headscope.analysis.weight_importance`: induction scores per sequence, many single-head
  ablations resumed from one clean pass (a control distribution), resample ablation (notebook 05).

Import the submodules directly (``from headscope.analysis import copying``); nothing is imported
here, so a missing or broken submodule never breaks the others.
"""
