"""Helpers behind the report notebooks in ``analyses/``: each one a small, tested function.

* :mod:`headscope.analysis.profiles`: per-layer means of a scan (Clark et al. 2019), labelled heads,
  heatmaps of several models side by side.
* :mod:`headscope.analysis.induction`: one head's pattern on token ids, the induction stripe, the
  per-token loss on each copy of a repeated sequence, induction score against repeat length.
* :mod:`headscope.analysis.copying`: how much a head's OV circuit raises the logit of the token it
  attends to (on real inputs, and Olsson et al.'s weights-only eigenvalue score).
* :mod:`headscope.analysis.sinks`: sink rate (Gu et al. 2024) and probes without their first token.

Import the submodules directly (``from headscope.analysis import copying``); nothing is imported
here, so a missing or broken submodule never breaks the others.
"""
