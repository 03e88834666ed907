"""One check shared by the engine tests: every engine against the hooks engine on the same
probes."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.engines.extract import score_probe
from headscope.metrics import REGISTRY


def assert_engines_agree(
    model, n_prompts, repeat_len, batch_size, engines=("fused", "blocked"), probes=None
):
    """Each engine against hook_pattern, same probes (default: the default probes): scores to
    1e-5, identical counts and chance."""
    metrics = list(REGISTRY.values())
    if probes is None:
        probes = headscope.default_probes(model, n_prompts=n_prompts, repeat_len=repeat_len, seed=2)
    for probe in probes:
        b = score_probe(model, probe, metrics, batch_size=batch_size, engine="hooks")
        for engine in engines:
            a = score_probe(model, probe, metrics, batch_size=batch_size, engine=engine)
            assert set(a) == set(b)
            for name in a:
                torch.testing.assert_close(
                    a[name].score,
                    b[name].score,
                    atol=1e-5,
                    rtol=0,
                    equal_nan=True,
                    msg=lambda m, e=engine, n=name: f"{e} vs hooks, {n}: {m}",
                )
                assert a[name].count == b[name].count
                assert a[name].chance == pytest.approx(b[name].chance, nan_ok=True)
