"""The fused engine: the kernel's statistics reach every metric, equal to the blocked engine's
blocks;
calls the kernel cannot take (per-head masks) fall back to blocks in the same forward."""

from __future__ import annotations

import os

import pytest
import torch

from headscope.engines import fused, kernel
from headscope.engines.blocked import BlockHandler
from headscope.engines.extract import pad_batch, pattern_batch, score_probe
from headscope.metrics import REGISTRY
from headscope.metrics.rows import DenseRows
from headscope.metrics.stats import HeadStats
from headscope.models.attention import RestrictKeys
from headscope.probes.pairs import packed_text_probe
from tests.engines.agree import assert_engines_agree

pytestmark = pytest.mark.skipif(
    os.environ.get("HEADSCOPE_KERNEL") == "0", reason="fused kernel disabled by HEADSCOPE_KERNEL=0"
)


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_bert"])
def test_fused_engine_equals_hooks_engine(fixture, request):
    assert_engines_agree(
        request.getfixturevalue(fixture),
        n_prompts=5,
        repeat_len=7,
        batch_size=2,
        engines=("fused",),
    )


def test_fused_scan_uses_the_kernel_on_every_layer_and_matches_blocked(tiny_gpt2, monkeypatch):
    probe = packed_text_probe(tiny_gpt2, None, seq_len=70, n_sequences=3)
    metrics = list(REGISTRY.values())
    seen = []
    score = BlockHandler.score
    monkeypatch.setattr(
        BlockHandler,
        "score",
        lambda self, call: (seen.append(("blocks", call.layer)), score(self, call)),
    )
    orig_stats = kernel.head_stats

    def head_stats(*args, **kwargs):
        st = orig_stats(*args, **kwargs)
        seen.append(("stats", type(st)))
        return st

    monkeypatch.setattr(kernel, "head_stats", head_stats)
    got = score_probe(tiny_gpt2, probe, metrics, batch_size=2, engine="fused")
    # two batches; the last layer of each runs head_stats (no output needed), the others the
    # kernel's attention; no layer fell back to pattern blocks
    assert seen == [("stats", HeadStats)] * 2
    want = score_probe(tiny_gpt2, probe, metrics, batch_size=3, engine="blocked")
    for name in want:
        torch.testing.assert_close(
            got[name].score, want[name].score, atol=1e-5, rtol=0, equal_nan=True
        )
        assert got[name].count == want[name].count


def test_a_per_head_mask_falls_back_to_blocks_for_that_layer(tiny_gpt2):
    """An intervention that masks keys per head: the kernel takes one mask for all heads, so that
    layer is scored from exact blocks; the other layer still runs the kernel."""
    ids = torch.tensor([tiny_gpt2.wrap(list(range(5, 25)))])
    tokens, mask, lengths = pad_batch(ids.tolist(), tiny_gpt2.pad_id)
    probe = packed_text_probe(tiny_gpt2, None, seq_len=21, n_sequences=1)
    batch = pattern_batch(tiny_gpt2, probe, tokens, mask, lengths)
    kinds = []
    handler = fused.FusedHandler(
        lambda layer, rows, qs: kinds.append((layer, type(rows))),
        [0, 1],
        fused.fused_flags(batch, tokens.shape[1]),
    )
    window = RestrictKeys(
        layer=0, heads=[1], keep=lambda call: torch.ones(call.shape[-2:], dtype=torch.bool).tril()
    )
    tiny_gpt2.run(tokens, mask, handler=handler, interventions=[window])
    assert kinds == [(0, DenseRows), (1, HeadStats)]


def test_fused_flags_are_the_key_sets_key_set_mass_counts(tiny_gpt2):
    probe = packed_text_probe(tiny_gpt2, None, seq_len=30, n_sequences=2)
    tokens = torch.tensor(probe.sequences)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    batch = pattern_batch(tiny_gpt2, probe, tokens, mask, torch.tensor([30, 30]))
    flags = fused.fused_flags(batch, 30)
    assert set(flags) == {"separator", "punctuation"}
    # never position 0
    assert not flags["punctuation"][:, 0].any() and not flags["separator"][:, 0].any()
    assert torch.equal(flags["separator"][:, 1:], batch.separator[:, 1:])


def test_a_fallback_is_said_in_one_line(tiny_gpt2, monkeypatch):
    """Where the kernel cannot take a call (a per-head mask), the scan says so once per forward, in
    one
    line naming the layer, and the scores are still the blocked engine's."""
    from headscope.errors import listening

    heard = []
    probe = packed_text_probe(tiny_gpt2, None, seq_len=30, n_sequences=2)
    window = RestrictKeys(
        layer=1, heads=[0], keep=lambda call: torch.ones(call.shape[-2:], dtype=torch.bool).tril()
    )
    metrics = [REGISTRY["sink"], REGISTRY["entropy"]]
    with listening(heard.append):
        got = score_probe(
            tiny_gpt2, probe, metrics, batch_size=2, engine="fused", interventions=[window]
        )
    assert (
        len(heard) == 1
        and "\n" not in heard[0]
        and heard[0].startswith("layer 1's attention has a per-head mask")
    )
    want = score_probe(
        tiny_gpt2, probe, metrics, batch_size=2, engine="blocked", interventions=[window]
    )
    for name in want:
        torch.testing.assert_close(got[name].score, want[name].score, atol=1e-5, rtol=0)
