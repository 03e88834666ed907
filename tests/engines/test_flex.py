"""The flex engine: FlexAttention statistics equal a hand-written softmax and the blocked engine.

On the CPU FlexAttention runs uncompiled (``mask_mod`` applied to every score), so these tests pin
the statistics' maths; the compiled CUDA kernel also trusts the block mask's tiles, which
``test_tiles_are_exactly_what_the_mask_mod_says`` checks without a GPU. The ``cuda`` tests run the
compiled path where a GPU exists (``benchmarks/gpu_check.sh``).
"""

from __future__ import annotations

import json

import pytest
import torch

import headscope
from headscope.engines import flex
from headscope.engines import flex_stats as fs
from headscope.engines.blocked import BlockHandler
from headscope.engines.extract import pad_batch, pattern_batch, score_probe
from headscope.engines.registry import resolve_engine
from headscope.engines.support import SUPPORT_JSON
from headscope.metrics import REGISTRY
from headscope.metrics.rows import DenseRows
from headscope.metrics.stats import HeadStats
from headscope.models.attention import AttentionCall, RestrictKeys
from headscope.probes.long import long_text_probe, needle_probe
from headscope.probes.pairs import packed_text_probe
from headscope.result import Probe
from tests.oracles import conformance as conf

TOL = 1e-5
FUSED_EXACT = [
    f
    for f in conf.FAMILIES
    if json.loads(SUPPORT_JSON.read_text())["families"][f.name]["engines"]["fused"]["status"]
    == "exact"
]


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# ------------------------------------------------------------------------- an independent oracle


def softmax64(q, k, visible, scale):
    """``A`` ``[b, h, q, k]`` in float64 from plain tensors (repeat_kv layout); 0 on a row that sees
    nothing."""
    g = q.shape[1] // k.shape[1]
    s = (q.double() @ k.double().repeat_interleave(g, 1).transpose(-1, -2)) * scale  # [b, h, q, k]
    s = s.masked_fill(~visible, float("-inf"))
    a = torch.softmax(s, -1)
    return torch.nan_to_num(a, nan=0.0), s


def tile_semantics(block, n_q: int, n_k: int) -> torch.Tensor:
    """The boolean mask the compiled kernel applies for ``block`` ``[mbatch, q, k]``: keys of full
    tiles all visible, of partial tiles where ``mask_mod`` says, of tiles not listed none."""
    mb = block.kv_num_blocks.shape[0]
    bs = fs.BLOCK
    out = torch.zeros(mb, n_q, n_k, dtype=torch.bool)
    qi, ki = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    for b in range(mb):
        dense = block.mask_mod(torch.tensor(b), torch.tensor(0), qi, ki).expand(n_q, n_k)
        for t in range(block.kv_num_blocks.shape[2]):
            rows = slice(t * bs, min(n_q, (t + 1) * bs))
            for kind, num, idx in (
                ("partial", block.kv_num_blocks, block.kv_indices),
                ("full", block.full_kv_num_blocks, block.full_kv_indices),
            ):
                for j in idx[b, 0, t, : int(num[b, 0, t])].tolist():
                    cols = slice(j * bs, min(n_k, (j + 1) * bs))
                    out[b, rows, cols] = dense[rows, cols] if kind == "partial" else True
    return out


def masks(
    n_q: int, n_k: int, lengths=(None,), window: int | None = None, causal: bool = True
) -> torch.Tensor:
    """A boolean call mask ``[batch, 1, q, k]`` as transformers builds one: causality, a sliding
    window, right padding (keys past each length hidden)."""
    q = torch.arange(n_q)[:, None] + (n_k - n_q)
    k = torch.arange(n_k)[None, :]
    base = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal:
        base &= k <= q
    if window is not None:
        base &= (q - k).abs() < window
    out = base[None].repeat(len(lengths), 1, 1)
    for i, n in enumerate(lengths):
        if n is not None:
            out[i, :, n:] = False
    return out[:, None]


# ------------------------------------------------------------------------------ tiles and mask_mod


SHAPES = [  # (n_q, n_k, lengths, window, causal, dense)
    (300, 300, (None,), None, True, True),  # plain causal, lengths not a multiple of the tile
    (300, 300, (None,), None, True, False),  # ... without a mask (causality from the call)
    (300, 300, (None, 170), 70, True, True),  # sliding window + padding, two sequences
    (
        257,
        257,
        (200,),
        130,
        False,
        True,
    ),  # a bidirectional sliding window (ModernBERT's local layers)
    (129, 385, (None,), None, True, True),  # a KV cache: keys before the first query
    (129, 385, (None,), None, True, False),
    (128, 128, (None,), None, False, True),
    (128, 128, (None,), None, False, False),  # an encoder without padding: every key
]


@pytest.mark.parametrize("n_q,n_k,lengths,window,causal,dense", SHAPES)
@pytest.mark.parametrize("band", [None, (4, 64), (130, 9)])
def test_tiles_are_exactly_what_the_mask_mod_says(n_q, n_k, lengths, window, causal, dense, band):
    """The compiled kernel skips tiles, and reads full tiles without ``mask_mod``: the mask it then
    applies must be ``mask_mod`` exactly, and ``mask_mod`` the call's visibility (and the band)."""
    m = masks(n_q, n_k, lengths, window, causal) if dense else None
    vis = fs.Visibility(n_q, n_k, causal, None if m is None else m[:, 0])
    block = vis.block_mask(window=band)
    got = tile_semantics(block, n_q, n_k)
    want = (m[:, 0] if m is not None else torch.ones(1, n_q, n_k, dtype=torch.bool)).clone()
    q = torch.arange(n_q)[:, None] + (n_k - n_q)
    k = torch.arange(n_k)[None, :]
    if causal or band:
        want &= k <= q
    if band:
        want &= (q - k < band[1]) & (k >= band[0])
    assert torch.equal(got, want.expand_as(got))
    any_, all_ = vis.tiles(window=band)
    assert (
        bool(all_.any()) or band is not None or window is not None
    )  # full tiles exist: they are skipped work
    if causal and n_q > fs.BLOCK and band is None:
        assert not bool(any_[:, 0, -1].any())  # the first query tile never reads the last key tile


# ------------------------------------------------------------------------------ one layer, by hand


def _case(dtype=torch.float32, causal=True, scale=0.37):
    torch.manual_seed(1)
    b, h, kvh, n, d = 2, 6, 2, 150, 16
    q = (torch.randn(b, h, n, d) * 2).to(dtype)
    k = (torch.randn(b, kvh, n, d) * 2 + 0.5).to(dtype)  # a shared key offset, as real models have
    v = torch.randn(b, kvh, n, 12).to(dtype)
    m = masks(n, n, (None, 97), window=40, causal=causal)  # [b, 1, q, k]
    m[1, :, 100:] = False  # rows past the second sequence's end see no key at all (all masked)
    flags = {"separator": torch.rand(b, n) < 0.05, "punctuation": torch.rand(b, n) < 0.2}
    for f in flags.values():
        f[:, 0] = False
    targets = torch.full((b, n), -1)
    targets[0, [20, 77, 149]] = torch.tensor([3, 50, 120])
    targets[1, [60, 96]] = torch.tensor([59, 10])
    return q, k, v, m, flags, targets, scale


@pytest.mark.parametrize("causal", [True, False])
def test_layer_stats_equal_a_hand_written_softmax(causal):
    q, k, v, m, flags, targets, scale = _case(causal=causal)
    band = (3, 10)
    vis = fs.Visibility(q.shape[2], k.shape[2], causal, m[:, 0])
    out, st = fs.layer_stats(q, k, v, vis, scale, fs.StatsRequest(flags, band, targets))
    visible = m & (torch.ones(150, 150, dtype=torch.bool).tril() if causal else True)
    A, s = softmax64(q, k, visible, scale)  # [b, h, q, k]
    seen = visible.any(-1).expand(A.shape[:3])  # [b, h, q]
    g = q.shape[1] // k.shape[1]
    torch.testing.assert_close(
        out.double(), A @ v.double().repeat_interleave(g, 1), atol=TOL, rtol=0
    )
    ent = -torch.special.xlogy(A, A).sum(-1)
    torch.testing.assert_close(st.entropy, ent, atol=TOL, rtol=0)
    lse = torch.where(seen, torch.logsumexp(s, -1), float("-inf"))
    torch.testing.assert_close(st.lse, lse, atol=TOL, rtol=0)
    for name, f in flags.items():
        torch.testing.assert_close(
            st.masses[name], (A * f[:, None, None, :].double()).sum(-1), atol=TOL, rtol=0
        )
    qi, ki = torch.arange(150)[:, None], torch.arange(150)[None, :]
    in_band = (ki < band[0]) | ((qi - ki < band[1]) & (ki <= qi))
    torch.testing.assert_close(st.band[1], (A * in_band).sum(-1), atol=TOL, rtol=0)
    assert st.band[0] == band
    for bi, rows in ((0, [20, 77, 149]), (1, [60, 96])):
        want = A[bi][:, rows].argmax(-1)  # [h, rows]
        assert torch.equal(st.argmax[bi][:, rows], want)
    assert int((st.argmax >= 0).sum()) == 5 * q.shape[1]  # only the answer rows
    # single entries from lse: previous token, sink, and a key per row
    for off in (-1, 0, 5, -7):
        keys = torch.arange(150) + off
        inside = (keys >= 0) & (keys < 150)
        want = (
            A.gather(-1, keys.clamp(0, 149)[None, None, :, None].expand(2, 6, 150, 1)).squeeze(-1)
            * inside
        )
        torch.testing.assert_close(st.at(keys), want, atol=TOL, rtol=0)


def test_half_precision_inputs_are_scored_in_float32():
    """bf16 / fp16 activations: the statistics are float32 maths on the (exact) half-precision
    values, equal to a float64 softmax of the same values; only the output is rounded to the model's
    dtype."""
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v, m, flags, targets, scale = _case(dtype)
        vis = fs.Visibility(150, 150, True, m[:, 0])
        out, st = fs.layer_stats(q, k, v, vis, scale, fs.StatsRequest(flags, (3, 10), targets))
        assert out.dtype == dtype and st.entropy.dtype == torch.float64
        A, _ = softmax64(q, k, m & torch.ones(150, 150, dtype=torch.bool).tril(), scale)
        torch.testing.assert_close(st.entropy, -torch.special.xlogy(A, A).sum(-1), atol=TOL, rtol=0)
        torch.testing.assert_close(
            st.masses["punctuation"],
            (A * flags["punctuation"][:, None, None].double()).sum(-1),
            atol=TOL,
            rtol=0,
        )
        want = (A @ v.double().repeat_interleave(3, 1)).to(dtype)
        torch.testing.assert_close(out, want, atol=2e-2, rtol=0)


def test_both_torch_spellings_of_the_lse_request_give_the_same_statistics(monkeypatch):
    """torch >= 2.9 asks for the lse with ``return_aux=AuxRequest(lse=True)``; before,
    ``return_lse``."""
    from torch.nn.attention import flex_attention as fa

    q, k, v, m, flags, targets, scale = _case()
    vis = fs.Visibility(150, 150, True, m[:, 0])
    req = fs.StatsRequest(flags, (3, 10))
    _, new = fs.layer_stats(q, k, v, vis, scale, req)
    monkeypatch.delattr(fa, "AuxRequest")
    with pytest.warns(FutureWarning, match="return_lse is deprecated"):
        _, old = fs.layer_stats(q, k, v, vis, scale, req)
    assert torch.equal(new.entropy, old.entropy) and torch.equal(new.lse, old.lse)


def test_heads_are_processed_in_chunks_that_give_the_same_statistics(monkeypatch):
    q, k, v, m, flags, targets, scale = _case()
    vis = fs.Visibility(150, 150, True, m[:, 0])
    req = fs.StatsRequest(flags, (3, 10), targets)
    out, whole = fs.layer_stats(q, k, v, vis, scale, req)
    calls = []
    real = fs._flex
    monkeypatch.setattr(fs, "_flex", lambda *a: (calls.append(a[0].shape[1]), real(*a))[1])
    monkeypatch.setattr(fs, "CHUNK_BYTES", 1)  # one KV head (3 query heads) per pass
    out1, parts = fs.layer_stats(q, k, v, vis, scale, req)
    assert calls == [3, 3, 3, 3]  # 2 KV heads x (the pass + the window pass)
    torch.testing.assert_close(out1, out, atol=0, rtol=0)
    torch.testing.assert_close(parts.entropy, whole.entropy, atol=1e-12, rtol=0)
    assert torch.equal(parts.argmax, whole.argmax)
    # channels wider than one pass takes (CUDA: 256) are split into passes over the same tiles
    calls.clear()
    monkeypatch.setitem(
        fs.MAX_VALUE_DIM, "cpu", 16
    )  # 12 + 16 + 1 + 2 + 1 = 32 channels: two passes
    out2, split = fs.layer_stats(q, k, v, vis, scale, req)
    assert calls == [3, 3, 3] * 2
    torch.testing.assert_close(out2, out, atol=1e-6, rtol=0)
    for name in ("entropy", "lse"):
        torch.testing.assert_close(getattr(split, name), getattr(whole, name), atol=1e-6, rtol=0)
    torch.testing.assert_close(split.band[1], whole.band[1], atol=1e-6, rtol=0)
    for name in flags:
        torch.testing.assert_close(split.masses[name], whole.masses[name], atol=1e-6, rtol=0)


# --------------------------------------------------------------------- the engine on tiny models


def _instrumented(monkeypatch):
    """Record each scanned layer: ('flex', layer) through FlexAttention, ('blocks', layer) through
    pattern blocks."""
    seen = []
    real = flex.layer_stats
    monkeypatch.setattr(
        flex, "layer_stats", lambda *a, **k: (seen.append("flex"), real(*a, **k))[1]
    )
    score = BlockHandler.score
    monkeypatch.setattr(
        BlockHandler,
        "score",
        lambda self, call: (
            seen.append("blocks" if self.engine == "flex" else "blocked"),
            score(self, call),
        )[1],
    )
    return seen


def assert_flex_equals_blocked(model, probes, batch_size, tol=TOL):
    for probe in probes:
        metrics = [m for m in REGISTRY.values() if m.probe == probe.name]
        got = score_probe(model, probe, metrics, batch_size=batch_size, engine="flex")
        want = score_probe(model, probe, metrics, batch_size=batch_size, engine="blocked")
        assert set(got) == set(want) == {m.name for m in metrics}
        for name in want:
            torch.testing.assert_close(
                got[name].score,
                want[name].score,
                atol=tol,
                rtol=0,
                equal_nan=True,
                msg=lambda msg, n=name, p=probe.name: f"{p}/{n}: {msg}",
            )
            assert got[name].count == want[name].count
            assert got[name].chance == pytest.approx(want[name].chance, nan_ok=True)


@pytest.mark.parametrize("family", FUSED_EXACT, ids=[f.model_type for f in FUSED_EXACT])
def test_flex_equals_blocked_on_every_family_the_fused_engine_scores(family, monkeypatch):
    """Every family the support table marks exact on ``fused``: its tiny random model (sliding
    windows that bite, grouped-query and multi-query attention, encoders), the conformance probes,
    padded batches; every layer through FlexAttention, every score equal to the blocked engine's."""
    hf, tok = conf.tiny_model(family)
    model = headscope.load_model(hf, tok, name=f"tiny-{family.model_type}")
    probes = conf.probes_for(model)
    seen = _instrumented(monkeypatch)
    for probe in probes:  # every layer of every batch went through FlexAttention, none fell back
        seen.clear()
        score_probe(
            model,
            probe,
            [m for m in REGISTRY.values() if m.probe == probe.name],
            batch_size=4,
            engine="flex",
        )
        assert seen and set(seen) == {"flex"}, seen
    assert_flex_equals_blocked(model, probes, batch_size=4)


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "mistral", "gemma3_text"])
def test_streaming_and_retrieval_equal_blocked(model_type):
    """The band (default and custom sinks + window, which a sliding window may cut), and the
    needle's arg-max rows, on sequences of different lengths in one padded batch."""
    family = next(f for f in conf.FAMILIES if f.model_type == model_type)
    hf, tok = conf.tiny_model(family)
    model = headscope.load_model(hf, tok, name=f"tiny-{model_type}")
    long = long_text_probe(model, 160, n_sequences=3)
    ragged = Probe(
        "text",
        [s[: 100 + 7 * i] for i, s in enumerate(long.sequences)],
        settings=dict(long.settings, band=[2, 9]),
    )
    needles = needle_probe(model, [120, 160], depths=(0.2, 0.8), k=4)
    assert_flex_equals_blocked(model, [long, ragged, needles], batch_size=3)


def test_a_per_head_mask_falls_back_to_blocks_for_that_layer(tiny_gpt2):
    ids = torch.tensor([tiny_gpt2.wrap(list(range(5, 25)))])
    tokens, mask, lengths = pad_batch(ids.tolist(), tiny_gpt2.pad_id)
    probe = packed_text_probe(tiny_gpt2, None, seq_len=21, n_sequences=1)
    batch = pattern_batch(tiny_gpt2, probe, tokens, mask, lengths)
    kinds, lines = [], []
    handler = flex.FlexHandler(
        lambda layer, rows, qs: kinds.append((layer, type(rows))),
        [0, 1],
        flex.flex_request(batch, tokens.shape[1]),
    )
    restrict = RestrictKeys(
        layer=0, heads=[1], keep=lambda call: torch.ones(call.shape[-2:], dtype=torch.bool).tril()
    )
    from headscope.errors import listening

    with listening(lines.append):
        tiny_gpt2.run(tokens, mask, handler=handler, interventions=[restrict])
    assert kinds == [(0, DenseRows), (1, HeadStats)]
    assert lines == [
        "layer 0's attention has a per-head mask, which the flex engine does not "
        "take: scored from "
        "exact pattern blocks (same scores, slower)."
    ]


def test_a_key_only_padding_mask_is_read_per_row():
    """An encoder's mask may be ``[batch, 1, 1, key]`` (padding only): every row sees the real
    keys."""
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 4, 40, 8), torch.randn(2, 2, 40, 8), torch.randn(2, 2, 40, 8)
    mask = torch.ones(2, 1, 1, 40, dtype=torch.bool)
    mask[1, ..., 31:] = False
    got = []
    handler = flex.FlexHandler(
        lambda layer, rows, qs: got.append(rows), [0, 1], fs.StatsRequest({})
    )
    call = AttentionCall(layer=0, query=q, key=k, value=v, mask=mask, scale=0.35, causal=False)
    out = handler(call)  # [b, q, h, dv]
    A, _ = softmax64(q, k, mask.expand(2, 4, 40, 40), 0.35)
    torch.testing.assert_close(got[0].entropy, -torch.special.xlogy(A, A).sum(-1), atol=TOL, rtol=0)
    torch.testing.assert_close(
        out.transpose(1, 2).double(), A @ v.double().repeat_interleave(2, 1), atol=TOL, rtol=0
    )


def test_a_scan_under_an_intervention_equals_blocked(tiny_gpt2):
    from headscope.models.attention import ReplaceHeadOutput

    probe = headscope.default_probes(tiny_gpt2, n_prompts=3, repeat_len=5)[1]
    ablate = [ReplaceHeadOutput(layer=0, head=1, value=0.0)]
    metrics = [REGISTRY["induction"], REGISTRY["duplicate_token"]]
    got = score_probe(tiny_gpt2, probe, metrics, batch_size=2, engine="flex", interventions=ablate)
    want = score_probe(
        tiny_gpt2, probe, metrics, batch_size=2, engine="blocked", interventions=ablate
    )
    plain = score_probe(tiny_gpt2, probe, metrics, batch_size=2, engine="flex")
    for name in want:
        torch.testing.assert_close(got[name].score, want[name].score, atol=TOL, rtol=0)
    assert (
        got["induction"].score[1] - plain["induction"].score[1]
    ).abs().max() > 1e-6  # layer 1 saw the ablation


@pytest.mark.parametrize("kwarg", ["softcap", "s_aux", "position_bias"])
def test_attention_it_cannot_model_is_refused_in_one_line(kwarg):
    q = torch.randn(1, 2, 4, 8)
    call = AttentionCall(
        layer=0,
        query=q,
        key=q,
        value=q,
        mask=None,
        scale=0.5,
        causal=True,
        extras={kwarg: torch.ones(1)},
    )
    with pytest.raises(
        headscope.HeadscopeError,
        match=f"^This model's attention uses {kwarg}, "
        "which the flex engine "
        r"does not model; use --engine hooks\.$",
    ):
        flex.FlexHandler(lambda *a: None, [0], fs.StatsRequest({}))(call)


def test_a_soft_capped_family_is_refused_naming_the_engine_that_can():
    family = next(f for f in conf.FAMILIES if f.model_type == "gemma2")
    hf, tok = conf.tiny_model(family)
    model = headscope.load_model(hf, tok)
    probe = conf.probes_for(model)[0]
    with pytest.raises(
        headscope.HeadscopeError,
        match=r"uses softcap, which the flex engine does "
        r"not model; "
        r"use --engine hooks\.$",
    ):
        score_probe(model, probe, [REGISTRY["sink"]], engine="flex")


# ------------------------------------------------------------------------ which engine auto takes


def test_auto_never_takes_flex_on_the_cpu_but_a_named_flex_runs(tiny_gpt2, monkeypatch):
    from headscope.engines import kernel as kernels

    metrics = list(REGISTRY.values())
    assert resolve_engine(tiny_gpt2, "auto", metrics).name == "fused"
    assert resolve_engine(tiny_gpt2, "flex", metrics).name == "flex"
    monkeypatch.setattr(kernels, "_module", None)
    monkeypatch.setattr(kernels, "_reason", "no compiler")
    assert (
        resolve_engine(tiny_gpt2, "auto", metrics).name == "blocked"
    )  # not flex: CPU speed unchanged
    with pytest.raises(
        headscope.HeadscopeError,
        match=r"^The fused engine cannot run here: .*; "
        r"use --engine blocked\.$",
    ):
        resolve_engine(tiny_gpt2, "fused", metrics)  # the hint names what auto would take, not flex


def test_auto_takes_flex_for_a_model_on_cuda(tiny_gpt2, monkeypatch):
    """Engine choice only (no GPU needed): fused refuses CUDA, flex is next in the registry."""
    monkeypatch.setattr(tiny_gpt2, "device", torch.device("cuda", 0))
    metrics = list(REGISTRY.values())
    assert resolve_engine(tiny_gpt2, "auto", metrics).name == "flex"
    own = [m for m in metrics] + [
        REGISTRY["sink"].__class__(
            name="own", probe="text", fn=lambda p, b: None, definition="", label="", threshold=0.5
        )
    ]
    assert resolve_engine(tiny_gpt2, "auto", own).name == "blocked"  # a metric needing the pattern
    monkeypatch.setattr(tiny_gpt2, "device", torch.device("mps"))
    assert "not mps" in flex.ENGINE.unavailable(tiny_gpt2, metrics)


# ------------------------------------------------------------------------------ the real model


@pytest.mark.real
def test_flex_equals_blocked_on_smollm2(smollm2):
    probes = headscope.default_probes(smollm2, n_prompts=4, repeat_len=30, seed=2)
    probes += [
        long_text_probe(smollm2, 200, n_sequences=2),
        needle_probe(smollm2, [160, 200], depths=(0.5,), k=6),
    ]
    assert_flex_equals_blocked(smollm2, probes, batch_size=4)


# ------------------------------------------------------------------ CUDA (compiled FlexAttention)


def synthetic_long_probes(model, lengths=(250, 220, 180), k: int = 5, seed: int = 0) -> list[Probe]:
    """Long probes from random ordinary tokens (no corpus download: the GPU machine is offline): a
    text probe of ragged lengths (streaming: queries past the band) and needles copied at the
    end."""
    gen = torch.Generator().manual_seed(seed)
    vocab = model.ordinary_vocab()
    body = [vocab[torch.randint(len(vocab), (n - 1,), generator=gen)].tolist() for n in lengths]
    text = Probe("text", [[model.bos_id, *ids] for ids in body], settings={"band": [4, 64]})
    seqs, needles = [], []
    for ids in body:
        start = len(ids) // 3
        needle = ids[start : start + k]
        seqs.append([model.bos_id, *ids[: len(ids) - k], *needle])
        needles.append({"needle_start": 1 + start, "answer_start": len(ids) + 1 - k, "k": k})
    return [text, Probe("needle", seqs, needles=needles)] if model.causal else [text]


def test_the_synthetic_long_probes_exercise_streaming_and_retrieval(tiny_gpt2):
    text, needles = synthetic_long_probes(tiny_gpt2, lengths=(120, 100, 90))
    assert needles.targets(0) == {120 - 5 + j - 1: 1 + 119 // 3 + j for j in range(5)}
    assert [needles.sequences[0][q + 1] for q in needles.targets(0)] == [
        needles.sequences[0][t] for t in needles.targets(0).values()
    ]  # each answer's next token is the needle's
    got = score_probe(tiny_gpt2, text, [REGISTRY["streaming"]], engine="blocked")["streaming"]
    assert got.count == sum(n - 68 for n in (120, 100, 90))


@pytest.mark.cuda
@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "bert"])
def test_compiled_flex_on_cuda_equals_blocked(model_type, accel):
    """The compiled kernel (tiles skipped and read without mask_mod) against the blocked engine on
    the same random model on the GPU, float32 (IEEE matmuls): every metric, streaming, retrieval;
    grouped-query attention and padding (llama), sliding windows and one KV head (gemma 3), a
    bidirectional encoder (bert)."""
    family = next(f for f in conf.FAMILIES if f.model_type == model_type)
    hf, tok = conf.tiny_model(family)
    model = headscope.load_model(hf.to(accel), tok, name=f"tiny-{model_type}")
    assert model.device.type == accel.type
    if accel.type == "cuda":
        assert resolve_engine(model, "auto", list(REGISTRY.values())).name == "flex"
    assert_flex_equals_blocked(
        model, conf.probes_for(model) + synthetic_long_probes(model), batch_size=3
    )


@pytest.mark.cuda
def test_compiled_layer_stats_on_cuda_equal_a_hand_written_softmax(accel):
    q, k, v, m, flags, targets, scale = (
        x.to(accel) if isinstance(x, torch.Tensor) else x for x in _case()
    )
    flags = {n: f.to(accel) for n, f in flags.items()}
    vis = fs.Visibility(150, 150, True, m[:, 0], q.device)
    out, st = fs.layer_stats(q, k, v, vis, scale, fs.StatsRequest(flags, (3, 10), targets))
    A, _ = softmax64(
        q, k, m & torch.ones(150, 150, dtype=torch.bool, device=q.device).tril(), scale
    )
    torch.testing.assert_close(st.entropy, -torch.special.xlogy(A, A).sum(-1), atol=TOL, rtol=0)
    torch.testing.assert_close(
        out.double(), A @ v.double().repeat_interleave(3, 1), atol=TOL, rtol=0
    )
