"""Engines: the ways headscope reads attention during a forward pass, behind one registry.

=========  =========================================================================================
base       what an engine is (:class:`~headscope.engines.base.Engine`)
registry   the engines by name, in the order ``--engine auto`` tries them; one line registers one
kernel     the C++ fused kernel (``csrc/head_stats.cpp``), built on first use
blocked    the model's sdpa for outputs, exact ``softmax`` pattern blocks a few query rows at a time
fused      the kernel replaces each layer's attention: output plus per-row statistics, one pass
flex_stats the same statistics from FlexAttention's log-sum-exp and extra value channels (the maths)
flex       the flex engine: compiled on CUDA, chosen by auto there (on the CPU only when named)
hooks      transformer-lens ``hook_pattern`` (eager attention), the reference
extract    streaming per-head sums over a probe's batches, on any engine
support    which families each engine scores exactly (the conformance table), as text or Markdown
=========  =========================================================================================

Nothing is imported here: ``headscope.engines.registry`` lists the engines without loading torch.
"""
