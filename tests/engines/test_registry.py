"""The engine registry: auto's order, one-line refusals with the engine that can, and a fourth
engine
added as one class plus one register line (here, an eager engine written in the test)."""

from __future__ import annotations

import pytest
import torch

import headscope
from headscope.engines import kernel, registry
from headscope.engines.extract import score_probe
from headscope.engines.registry import Engine, engine_names, get_engine, register, resolve_engine
from headscope.metrics import REGISTRY, Metric
from headscope.metrics.base import pool, query_range
from headscope.metrics.rows import DenseRows
from headscope.models.attention import StopForward

OWN = Metric(
    name="own",
    probe="text",
    definition="A[q, 0] read from the pattern itself",
    label="l",
    threshold=0.5,
    fn=lambda p, b: pool(p[..., 0], query_range(p, b, 1, b.lengths - 1)),
)


def test_builtin_order_and_lazy_import():
    assert engine_names() == ["fused", "flex", "blocked", "hooks"]
    assert get_engine("blocked").name == "blocked" and get_engine("hooks").reads_model_attention


def test_auto_takes_the_first_engine_that_can_run(tiny_gpt2, monkeypatch):
    metrics = list(REGISTRY.values())
    assert resolve_engine(tiny_gpt2, "auto", metrics).name == "fused"
    # OWN needs the pattern
    assert resolve_engine(tiny_gpt2, "auto", metrics + [OWN]).name == "blocked"
    monkeypatch.setattr(kernel, "_module", None)
    monkeypatch.setattr(kernel, "_reason", "no compiler")
    assert resolve_engine(tiny_gpt2, "auto", metrics).name == "blocked"


def test_a_named_engine_that_cannot_run_says_why_and_names_one_that_can(tiny_gpt2, monkeypatch):
    with pytest.raises(
        headscope.HeadscopeError,
        match=r"^The fused engine cannot run here: metric\(s\) own need the pattern "
        r"itself .*; "
        r"use --engine blocked\.$",
    ):
        resolve_engine(tiny_gpt2, "fused", [OWN])
    monkeypatch.setattr(tiny_gpt2, "attention_interface", False)
    with pytest.raises(headscope.HeadscopeError, match="attention interface; use --engine hooks"):
        resolve_engine(tiny_gpt2, "blocked", list(REGISTRY.values()))
    assert resolve_engine(tiny_gpt2, "auto", list(REGISTRY.values())).name == "hooks"


def test_unknown_and_duplicate_names():
    with pytest.raises(
        headscope.HeadscopeError, match="Unknown engine 'fsued'. Did you mean: fused"
    ):
        get_engine("fsued")
    with pytest.raises(ValueError, match="already registered"):
        register("hooks", "headscope.engines.hooks")
    with pytest.raises(ValueError, match="already registered"):
        register("auto", "headscope.engines.hooks")


class EagerEngine(Engine):
    """A fourth engine, the whole of it: eager softmax of each call's q and k through the seam."""

    name = "eager-test"
    summary = "eager softmax(q k^T) from the attention seam (a test engine)"

    def unavailable(self, model, metrics):
        return None if model.attention_interface else "no attention interface"

    def run(self, model, tokens, mask, batch, on_rows, layers=None, interventions=()):
        last = model.n_layers - 1

        def handler(call):
            g = call.group
            s = (
                call.query.float()
                @ call.key.float().repeat_interleave(g, 1).transpose(-1, -2)
                * call.scale
            )
            s = s.masked_fill(~call.full_mask(), float("-inf"))  # [b, h, q, k]
            on_rows(call.layer, DenseRows(torch.nan_to_num(s.softmax(-1))), 0)
            if call.layer == last:
                raise StopForward
            return call.output()

        model.run(tokens, mask, handler=handler, interventions=interventions)


def test_a_fourth_engine_is_one_class_and_one_register_line(tiny_gpt2, monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # undone after the test
    register("eager-test", EagerEngine())
    assert engine_names()[-1] == "eager-test"
    metrics = list(REGISTRY.values())
    for probe in headscope.default_probes(tiny_gpt2, n_prompts=3, repeat_len=6):
        got = score_probe(tiny_gpt2, probe, metrics, batch_size=2, engine="eager-test")
        want = score_probe(tiny_gpt2, probe, metrics, batch_size=2, engine="hooks")
        for name in want:
            torch.testing.assert_close(
                got[name].score, want[name].score, atol=1e-5, rtol=0, equal_nan=True
            )
    result = headscope.scan(
        tiny_gpt2,
        headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=4),
        engine="eager-test",
    )
    assert result.metadata["engine"] == "eager-test"


def test_an_engine_that_misses_a_layer_is_an_error_not_zero_scores(tiny_gpt2, monkeypatch):
    """If a model's attention never reaches the seam, its layers would score 0 with no error."""

    class Lazy(EagerEngine):
        name = "lazy-test"

        def run(self, model, tokens, mask, batch, on_rows, layers=None):
            super().run(
                model,
                tokens,
                mask,
                batch,
                lambda layer, rows, qs: layer == 0 and on_rows(layer, rows, qs),
            )

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register("lazy-test", Lazy())
    probe = headscope.default_probes(tiny_gpt2, n_prompts=2, repeat_len=4)[1]
    with pytest.raises(
        headscope.HeadscopeError,
        match="lazy-test engine never saw layer\\(s\\) 1 of .*use --engine hooks",
    ):
        score_probe(tiny_gpt2, probe, list(REGISTRY.values()), engine="lazy-test")


def test_a_plug_in_that_cannot_be_imported_is_one_line_and_auto_moves_on(tiny_gpt2, monkeypatch):
    monkeypatch.setattr(
        registry, "_REGISTRY", {"broken": "headscope.engines.no_such_module", **registry._REGISTRY}
    )
    with pytest.raises(
        headscope.HeadscopeError,
        match="The broken engine cannot be loaded from headscope.engines.no_such_module",
    ):
        get_engine("broken")
    assert resolve_engine(tiny_gpt2, "auto", list(REGISTRY.values())).name == "fused"


def test_a_scan_under_an_intervention_uses_an_engine_that_takes_it(tiny_gpt2):
    """Where heads look with another head ablated: the fused and blocked engines apply interventions
    through the seam; the hooks engine (transformer-lens' own forward) cannot, and says so."""
    from headscope.models.attention import ReplaceHeadOutput

    probe = headscope.default_probes(tiny_gpt2, n_prompts=3, repeat_len=5)[1]
    ablate = [ReplaceHeadOutput(layer=0, head=1, value=0.0)]
    metrics = [REGISTRY["induction"]]
    plain = score_probe(tiny_gpt2, probe, metrics, batch_size=2)["induction"].score
    fused = score_probe(tiny_gpt2, probe, metrics, batch_size=2, interventions=ablate)[
        "induction"
    ].score
    blocked = score_probe(
        tiny_gpt2, probe, metrics, batch_size=2, engine="blocked", interventions=ablate
    )
    torch.testing.assert_close(fused, blocked["induction"].score, atol=1e-6, rtol=0)
    # layer 0's own pattern does not depend on its output
    torch.testing.assert_close(fused[0], plain[0])
    assert (fused[1] - plain[1]).abs().max() > 1e-6  # layer 1 reads the ablated stream
    with pytest.raises(
        headscope.HeadscopeError,
        match="The hooks engine cannot run here: it cannot apply interventions; use --engine fused",
    ):
        score_probe(tiny_gpt2, probe, metrics, engine="hooks", interventions=ablate)
