"""Independent oracles: headscope's results recomputed from scratch, to check headscope.

An oracle is a second implementation of what a path of headscope computes, written with plain
Hugging Face modules and loops and sharing no code with the path it checks (each one's docstring
says what it may import, and a test reads its imports). They are not part of the package (not in
the wheel): the tests use them, and so do ``scripts/`` (run from the repository root,
``python -m scripts.X``).

* :mod:`tests.oracles.recompute`: every score, chance and n of a scan's run directory, from its
  ``tokens.jsonl`` alone, with HF eager attention (``scripts/recompute_scores.py``).
* :mod:`tests.oracles.recompute_census`: the same for a census run (syntax tables, no-op test,
  successor, copy suppression, rare word), plain HF modules (``scripts/recompute_census.py``).
* :mod:`tests.oracles.conformance`: the conformance suite: every transformers family's tiny random
  model scanned by every engine against HF eager attention (``scripts/conformance.py`` writes
  ``headscope/data/support.json`` from it; ``tests/apps/test_conformance.py`` reruns it). Its tiny
  models' tokenizers are also the tests' (``tests/tiny_models.py``).
"""
