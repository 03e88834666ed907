"""Helpers behind the report notebooks in ``analyses/``: each one a small, tested function.

Not part of the headscope package (not in the wheel): the notebooks run from ``analyses/`` and
import these as ``lib``; the tests (``tests/analyses/``) and ``benchmarks/`` put ``analyses/`` on
``sys.path`` (pytest: ``pythonpath`` in ``pyproject.toml``). They use headscope's modules as a
user would.

* :mod:`lib.profiles`: per-layer means of a scan (Clark et al. 2019), labelled heads, heatmaps of
  several models side by side.
* :mod:`lib.induction`: one head's pattern on token ids, the induction stripe, the per-token loss
  on each copy of a repeated sequence, induction score against repeat length.
* :mod:`lib.copying`: how much a head's OV circuit raises the logit of the token it attends to (on
  real inputs, and Olsson et al.'s weights-only eigenvalue score).
* :mod:`lib.sinks`: sink rate (Gu et al. 2024) and probes without their first token.
* :mod:`lib.attention_math`: the seed article's attention by hand (its example, the causal mask,
  grouped-query ``repeat_kv``, the missing sense of order).
* :mod:`lib.score_scale`: why scores are divided by sqrt(d_k), as seeded simulations.
* :mod:`lib.model_checks`: from-scratch attention against a real model (every layer's pattern and
  head outputs, the KV-cache property, shuffled tokens).
* :mod:`lib.cost`: the score grid's size and FLOPs beside measured scan time (the timer and
  quadratic fit are :mod:`lib.timing`, shared with ``benchmarks/``).
* :mod:`lib.atlas`: several models' scores on one relative-depth axis (layer / (n_layers - 1)): a
  tidy table, per-depth-bin summaries (early/middle/late), a figure.
* :mod:`lib.phase_change`: the induction phase change of a small trained model.
* :mod:`lib.controls`: intervals (bootstrap over sequences, Wilson) and controls that can fail
  (size-matched random head groups, mean / zero / resample group ablation, sink controls, random
  KV groups, curve-change correlations against circular shifts).
* :mod:`lib.kv_baselines`: a KV plan among random whole-KV-group drops of the same memory saving
  (every way when there are few, a sample when many) and its rank there.
* :mod:`lib.discovery`: notebook 11's helpers: held-out pairs, notebook 09's class-rule circuit
  read from its saved outputs, Wang et al.'s chain as edges, sign agreement and curve areas with
  intervals over pairs, heads in the order a ranking adds them.
* :mod:`lib.timing`: one timer and one quadratic fit (notebooks and ``benchmarks/``).
* :mod:`lib.patching`: attribution against exact patching with intervals over pairs, attention
  from the last position, OV name copying, Wang et al.'s GPT-2 small IOI heads.
* :mod:`lib.weight_importance`: induction scores per sequence, many single-head ablations resumed
  from one clean pass (a control distribution), resample ablation (notebook 05).
* :mod:`lib.repeat_task`: the induction task as prompt pairs (``BOS + R + R[:m]``, and the same
  with ``R`` redrawn) for patching and circuits (notebooks 05 and 09).

Import the submodules directly (``from lib import copying``); nothing is imported here, so a
missing or broken submodule never breaks the others. The independent recomputations
(``recompute``, ``recompute_census``) that once sat beside these are in ``tests/oracles/``.
"""
