"""What every run's record (``metadata.json``) says about the model, where it ran and with what.

One builder for every command: :func:`run_record` gives the model as typed and where its weights
came from (with their sha256: a packaged model's file, or the weights themselves for a model built
in memory), its shape and special tokens, the device, dtype and threads, the versions of what
decides the numbers, the settings (all of them, and those changed from their defaults) and when
it was made. Each command adds what only it knows (probes, task, engine, timings).
"""

from __future__ import annotations

import platform
import time
from importlib.metadata import PackageNotFoundError, version

from headscope.result import __version__

#: The libraries whose versions each record names (beside headscope and Python).
LIBRARIES = ("torch", "transformers", "transformer-lens", "spacy")


def versions() -> dict:
    """``{"headscope", "torch", "transformers", "transformer-lens", "spacy", "python"}`` (None:
    not installed)."""
    out = {"headscope": __version__}
    for dist in LIBRARIES:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    out["python"] = platform.python_version()
    return out


def source_record(model) -> dict:
    """Where ``model``'s weights came from, with their sha256 (a model built in memory: the sha256
    of its state dict)."""
    source = {"kind": model.source.kind, **model.provenance}
    if model.source.kind == "memory":  # no weights file to hash: hash the weights themselves
        source["state_dict_sha256"] = model.fingerprint()
    return source


def model_record(model) -> dict:
    """The model and where it ran: name, source, shape, special tokens, device, dtype, threads,
    versions."""
    import torch

    return {
        "model": model.name,
        "source": source_record(model),
        "n_layers": model.n_layers,
        "n_heads": model.n_heads,
        "n_kv_heads": model.n_kv_heads,
        "d_head": model.d_head,
        "n_ctx": model.n_ctx,
        "causal": model.causal,
        "special_tokens": {
            "bos_or_cls": model.bos_id,
            "separator": model.sep_id,
            "pad": model.pad_id,
        },
        "device": str(model.device),
        **(
            {"device_map": model.device_map}
            if getattr(model, "device_map", None) is not None
            else {}
        ),
        "dtype": str(model.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "versions": versions(),
    }


def run_record(model, settings=None, **fields) -> dict:
    """A run's record: :func:`model_record`, the ``settings`` object's fields (all, and those
    changed from their defaults) and its seed, then ``fields``, then the time it was made."""
    out = model_record(model)
    if settings is not None:
        out["settings"] = settings.record()
        out["settings_changed"] = settings.changed()
        if hasattr(settings, "seed"):
            out["seed"] = settings.seed
    out.update(fields)
    out["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return out
