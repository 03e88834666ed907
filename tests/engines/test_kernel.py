"""The fused kernel: per-row entropy, flag masses and log-sum-exp equal to the pattern's, exactly.

The kernel must build here (CI has a C++ compiler); only ``HEADSCOPE_KERNEL=0`` may turn it off.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from headscope.engines import kernel
from headscope.engines.fused import fused_flags
from headscope.errors import HeadscopeError
from headscope.metrics import REGISTRY, PatternBatch
from headscope.metrics.base import at_key, at_offset, key_set_mass, row_entropy
from headscope.metrics.rows import Rows
from headscope.metrics.stats import HeadStats

pytestmark = pytest.mark.skipif(
    os.environ.get("HEADSCOPE_KERNEL") == "0", reason="fused kernel disabled by HEADSCOPE_KERNEL=0"
)


def test_kernel_builds():
    assert kernel.available(), kernel.unavailable_reason()


def reference(q, k, mask, causal):
    """float64 softmax of the float32 scores, the textbook way: pattern [b, h, q, k] and lse."""
    g = q.shape[1] // k.shape[1]
    s = (q @ k.repeat_interleave(g, 1).transpose(-1, -2)).double()
    n_q, n_k = s.shape[-2:]
    vis = torch.ones(q.shape[0], n_q, n_k, dtype=torch.bool)
    if causal:
        vis &= torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    if mask is not None:
        vis &= mask[:, 0].expand_as(vis)
    s = s.masked_fill(~vis[:, None], float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return p, lse


def test_uniform_rows_give_closed_forms():
    """All scores equal: row q of a causal head sees q+1 keys, so entropy = ln(q+1), lse =
    ln(q+1)."""
    n = 700  # two key tiles, a partial query tile, a tail of 700 % 8 = 4 keys
    q, k = torch.zeros(1, 2, n, 8), torch.zeros(1, 1, n, 8)
    flag = torch.zeros(1, n, dtype=torch.bool)
    flag[0, 1::3] = True  # keys 1, 4, 7, ...
    st = kernel.head_stats(q, k, None, 1.0, True, {"f": flag})
    rows = torch.arange(n, dtype=torch.float64)
    torch.testing.assert_close(st.entropy[0, 1], torch.log(rows + 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(st.lse[0, 0], torch.log(rows + 1), atol=1e-6, rtol=0)
    flagged_seen = torch.div(rows + 2, 3, rounding_mode="floor")  # keys 1, 4, ... <= q
    torch.testing.assert_close(st.masses["f"][0, 0], flagged_seen / (rows + 1), atol=1e-6, rtol=0)
    # every single entry is 1/(q+1) where visible, 0 in the future
    torch.testing.assert_close(st.at(torch.zeros(n, dtype=torch.long))[0, 0], 1 / (rows + 1))
    assert st.at(torch.arange(n) + 1)[0, 0].abs().max() == 0


def test_a_row_that_sees_nothing_attends_nowhere():
    q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[0, 0, 2] = False
    st = kernel.head_stats(q, k, mask, 1.0, False, {"f": torch.ones(1, 4)})
    assert (
        st.entropy[0, 0, 2] == 0 and st.masses["f"][0, 0, 2] == 0 and st.lse[0, 0, 2] == -math.inf
    )
    assert st.at(torch.zeros(4, dtype=torch.long))[0, 0, 2] == 0
    assert torch.isfinite(st.entropy).all()


@pytest.mark.parametrize(
    "b,h,kvh,n_q,n_k,d,causal,padded",
    [
        (1, 9, 3, 600, 600, 64, True, False),  # SmolLM2's grouping, two key tiles
        (2, 4, 4, 37, 37, 16, False, True),  # bidirectional with padding (BERT)
        (3, 6, 2, 130, 130, 32, True, True),  # causal with padding
        (1, 2, 1, 5, 1030, 8, True, False),  # a KV cache: queries at the end of 1,030 keys
    ],
)
def test_kernel_equals_the_pattern(b, h, kvh, n_q, n_k, d, causal, padded):
    g = torch.Generator().manual_seed(n_k)
    q = torch.randn(b, h, n_q, d, generator=g)
    k = torch.randn(b, kvh, n_k, d, generator=g)
    q[..., 0] += 3.0  # a sink on key 0, as real heads have
    k[:, :, 0, 0] += 3.0
    mask = None
    if padded:
        lengths = torch.randint(n_k // 2, n_k + 1, (b,), generator=g)
        mask = (torch.arange(n_k)[None, :] < lengths[:, None])[:, None, None, :]  # [b, 1, 1, k]
    flags = {"a": torch.rand(b, n_k, generator=g) < 0.1, "b": torch.rand(b, n_k, generator=g) < 0.5}
    st = kernel.head_stats(q, k, mask, 0.5, causal, flags)
    p, lse = reference(q * 0.5, k, mask, causal)
    ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
    # Two float32 GEMMs (the kernel's tiles, the reference's q @ k) round scores differently, by a
    # few ulp of |score| (~1e-6 here); a wrong mask or an off-by-one would be off by > 1e-3.
    torch.testing.assert_close(st.entropy, ent, atol=1e-5, rtol=0)
    finite = torch.isfinite(lse)
    torch.testing.assert_close(st.lse[finite], lse[finite], atol=1e-5, rtol=0)
    for name, f in flags.items():
        torch.testing.assert_close(
            st.masses[name], (p * f.double()[:, None, None, :]).sum(-1), atol=1e-5, rtol=0
        )
    for key in (
        torch.zeros(n_q, dtype=torch.long),
        torch.arange(n_q) + (n_k - n_q) - 1,
        torch.arange(n_q) - 3,
    ):
        want = p.gather(-1, key.clamp(0, n_k - 1).view(1, 1, n_q, 1).expand(b, h, n_q, 1)).squeeze(
            -1
        )
        want = want * ((key >= 0) & (key < n_k))
        # entries are exp(float64 score - lse of the kernel's float32 scores): same rounding story
        torch.testing.assert_close(st.at(key), want, atol=1e-5, rtol=0)


def test_every_fused_metric_scores_stats_like_the_pattern():
    """The same metric function on HeadStats and on the pattern: same per-sequence sums and
    counts."""
    g = torch.Generator().manual_seed(3)
    for causal in (True, False):
        b, h, n = 3, 4, 600  # more than one 512-key tile: the band and arg-max cross tiles
        lengths = torch.tensor([600, 530, 90])
        q, k = torch.randn(b, h, n, 8, generator=g), torch.randn(b, h, n, 8, generator=g)
        mask = (torch.arange(n)[None, :] < lengths[:, None])[:, None, None, :]
        if causal:
            mask = mask & torch.ones(n, n, dtype=torch.bool).tril()
        targets = torch.full((b, n), -1)
        # answer queries near the end copy keys far back
        for row, length in enumerate(lengths.tolist()):
            qs = torch.arange(length - 8, length)
            targets[row, qs] = torch.randint(0, length - 20, (8,), generator=g)
        batch = PatternBatch(
            lengths=lengths,
            causal=causal,
            separator=torch.rand(b, n, generator=g) < 0.2,
            punctuation=torch.rand(b, n, generator=g) < 0.3,
            repeat_len=5,
            band=(3, 40),
            targets=targets,
        )
        p, _ = reference(q, k, mask, causal)
        st = kernel.head_stats(
            q, k, mask, 1.0, causal, fused_flags(batch, n), band=(3, 40), argmax=True
        )
        fused = [m for m in REGISTRY.values() if m.fused]
        assert {m.name for m in fused} == set(REGISTRY)  # every built-in metric runs fused
        for m in fused:
            want, got = m(p.float(), batch), m(st, batch)
            torch.testing.assert_close(got.total, want.total, atol=1e-5, rtol=0, equal_nan=True)
            torch.testing.assert_close(got.count, want.count)


def test_selectors_read_head_stats_through_the_rows_protocol():
    st = kernel.head_stats(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4), None, 1.0, True, {})
    batch = PatternBatch(lengths=torch.tensor([3]), causal=True)
    assert isinstance(st, HeadStats) and isinstance(st, Rows) and st.shape == (1, 1, 3, 3)
    torch.testing.assert_close(
        at_key(st, batch, 0)[0, 0], torch.tensor([1, 1 / 2, 1 / 3], dtype=torch.float64)
    )
    torch.testing.assert_close(
        at_offset(st, batch, -1)[0, 0], torch.tensor([0, 1 / 2, 1 / 3], dtype=torch.float64)
    )
    torch.testing.assert_close(
        row_entropy(st, batch)[0, 0], torch.log(torch.tensor([1.0, 2, 3], dtype=torch.float64))
    )
    with pytest.raises(
        HeadscopeError, match="summed attention only over no key sets, not 'separator'"
    ):
        key_set_mass(
            st,
            PatternBatch(
                lengths=torch.tensor([3]), causal=True, separator=torch.ones(1, 3, dtype=torch.bool)
            ),
            "separator",
        )  # the kernel was not asked for that set


def test_blas_and_aten_gemm_paths_agree():
    """The kernel calls the BLAS sgemm_ torch links when it can find it, at::mm_out otherwise."""
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 4, 300, 16, generator=g), torch.randn(1, 2, 300, 16, generator=g)
    v = torch.randn(1, 2, 300, 16, generator=g)
    f = (torch.rand(1, 1, 300, generator=g) < 0.3).float()
    module = kernel._load()
    no_mask = torch.empty(0, dtype=torch.bool)
    direct = module.head_stats(q, k, no_mask, f, True, v)
    aten = module.head_stats(q, k, no_mask, f, True, v, direct_blas=False)
    assert len(direct) == 6 and direct[3].shape == (1, 4, 300, 16)
    for a, b in zip(direct, aten, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "b,h,kvh,n_q,n_k,d,dv,causal,padded",
    [
        (1, 9, 3, 600, 600, 64, 64, True, False),
        (2, 4, 4, 37, 37, 16, 19, False, True),
        (3, 6, 2, 130, 130, 32, 32, True, True),
        (1, 2, 1, 5, 1030, 8, 8, True, False),
    ],
)
def test_kernel_output_is_the_attention_output(b, h, kvh, n_q, n_k, d, dv, causal, padded):
    """The fused engine lets the kernel's A v replace sdpa's: it must be the same output."""
    g = torch.Generator().manual_seed(d)
    q, k = torch.randn(b, h, n_q, d, generator=g), torch.randn(b, kvh, n_k, d, generator=g)
    v = torch.randn(b, kvh, n_k, dv, generator=g)
    mask = None
    if padded:
        lengths = torch.randint(n_k // 2, n_k + 1, (b,), generator=g)
        mask = (torch.arange(n_k)[None, :] < lengths[:, None])[:, None, None, :]
        if causal:
            mask = mask & torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    out, stats = kernel.attention(q, k, v, mask, 0.3, causal, {})
    p, _ = reference(q * 0.3, k, mask, causal)
    want = p @ v.repeat_interleave(h // kvh, 1).double()
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        stats.entropy, kernel.head_stats(q, k, mask, 0.3, causal, {}).entropy
    )
    if dv == d and n_q == n_k:  # torch's own fused attention (its is_causal aligns top-left)
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q,
            k.repeat_interleave(h // kvh, 1),
            v.repeat_interleave(h // kvh, 1),
            attn_mask=mask,
            is_causal=causal and mask is None,
            scale=0.3,
        )
        torch.testing.assert_close(out, sdpa, atol=1e-5, rtol=0)


def test_a_stale_build_lock_is_cleared_a_fresh_one_kept(tmp_path):
    """A build killed midway leaves torch's lock file, and torch would wait on it forever."""
    lock = tmp_path / "lock"
    lock.write_text("")
    kernel._clear_stale_lock(tmp_path)
    assert lock.exists()  # a build may be running right now
    old = lock.stat().st_mtime - 3600
    os.utime(lock, (old, old))
    kernel._clear_stale_lock(tmp_path)
    assert not lock.exists()


def test_a_failed_build_falls_back_with_one_line(monkeypatch, capsys):
    """No compiler (or any build error): available() is False, the reason is kept, auto ->
    blocked."""
    from torch.utils import cpp_extension

    def broken(**kwargs):
        raise RuntimeError("Error building extension 'headscope_head_stats': c++: not found\nmore")

    monkeypatch.setattr(kernel, "_module", None)
    monkeypatch.setattr(kernel, "_reason", None)
    monkeypatch.setattr(cpp_extension, "load", broken)
    # as on a machine where it was never built
    monkeypatch.setattr(kernel, "_built", lambda *a: None)
    assert not kernel.available()
    assert "c++: not found" in kernel.unavailable_reason()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "using the blocked engine" in err[0]
    assert kernel.available() is False and capsys.readouterr().err == ""  # said once, not per call


def test_ninja_from_the_venv_is_put_on_path(monkeypatch):
    import shutil

    import ninja  # a dependency of headscope

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("PATH", "/nowhere")
    kernel._ninja_on_path()
    assert os.environ["PATH"].split(os.pathsep)[0] == ninja.BIN_DIR


def test_torch_noise_at_kernel_load_is_silenced(caplog):
    """A CUDA build of torch without a GPU logs 'No CUDA runtime is found' when cpp_extension is
    imported: one stray line on every scan's stderr (and before every one-line error)."""
    import logging

    logger = logging.getLogger("torch.utils.cpp_extension")
    with caplog.at_level(logging.WARNING), kernel._quiet_logger("torch.utils.cpp_extension"):
        logger.warning("No CUDA runtime is found, using CUDA_HOME='/usr/local'")
    assert caplog.records == []
    with caplog.at_level(logging.WARNING):
        logger.warning("after")
    assert [r.getMessage() for r in caplog.records] == ["after"]


def _sliding_mask(b, n, reach, causal=True, lengths=None):
    i = torch.arange(n)
    vis = (i[:, None] - i[None, :]).abs() <= reach
    if causal:
        vis &= i[None, :] <= i[:, None]
    mask = vis[None, None].expand(b, 1, n, n).clone()
    if lengths is not None:
        mask &= (i[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
    return mask


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_skips_tiles_and_stays_exact(causal):
    """A window of 100 keys over 1,300: the kernel skips the 512-key tiles no row of a query tile
    can
    see, and every statistic and the output equal the textbook softmax (and the mask-only pass)."""
    torch.manual_seed(0)
    b, n, reach = 2, 1300, 100
    q, k, v = torch.randn(b, 4, n, 8), torch.randn(b, 2, n, 8), torch.randn(b, 2, n, 8)
    mask = _sliding_mask(b, n, reach, causal, lengths=[n, 1100])
    flag = torch.zeros(b, n, dtype=torch.bool)
    flag[:, ::7] = True
    out, st = kernel.attention(q, k, v, mask, 1.0, causal, {"f": flag}, reach=reach)
    out_all, st_all = kernel.attention(q, k, v, mask, 1.0, causal, {"f": flag})  # no skipping
    assert kernel.window_hidden(mask, reach, n, n)
    p, lse = reference(q, k, mask, causal)
    real = lse.isfinite()
    torch.testing.assert_close(st.lse[real], lse[real], atol=1e-4, rtol=0)
    want_mass = (p * flag[:, None, None, :].double()).sum(-1)
    torch.testing.assert_close(st.masses["f"], want_mass, atol=1e-5, rtol=0)
    ent = -torch.special.xlogy(p, p).sum(-1)
    torch.testing.assert_close(st.entropy, ent, atol=1e-4, rtol=0)
    want_out = p.float() @ v.repeat_interleave(2, 1)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=0)
    # tiles skipped: another summation order
    torch.testing.assert_close(out, out_all, atol=5e-6, rtol=0)
    torch.testing.assert_close(st.entropy, st_all.entropy, atol=5e-6, rtol=0)  # tile order only


def test_a_declared_window_the_mask_lacks_is_never_skipped():
    """If the config says 'window 100' but the mask shows every key (a misread config), the kernel
    must not drop keys: window_hidden is False and the statistics are the full softmax's."""
    torch.manual_seed(1)
    n = 1300
    q, k = torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)
    full = torch.ones(1, 1, n, n, dtype=torch.bool).tril()
    assert not kernel.window_hidden(full, 100, n, n)
    st = kernel.head_stats(q, k, full, 1.0, True, {}, reach=100)
    _, lse = reference(q, k, full, True)
    torch.testing.assert_close(st.lse, lse, atol=1e-4, rtol=0)


@pytest.mark.parametrize("n", [300, 1300])
def test_restricted_heads_see_only_sinks_and_window(n):
    """Heads 1 and 3 restricted to 4 sinks + a 100-key window (a KV-plan run): output, statistics
    and arg-max equal the textbook softmax with those keys masked for those heads only; at 1,300
    keys
    the kernel skips the restricted heads' middle tiles."""
    torch.manual_seed(2)
    b, h, sinks, window = 2, 4, 4, 100
    q, k, v = torch.randn(b, h, n, 8), torch.randn(b, 2, n, 8), torch.randn(b, 2, n, 8)
    restrict = torch.tensor([False, True, False, True])
    out, st = kernel.attention(
        q, k, v, None, 1.0, True, {}, band=(sinks, window), argmax=True, restrict=restrict
    )
    i = torch.arange(n)
    band = (i[None, :] < sinks) | (i[:, None] - i[None, :] < window)  # [q, k]
    s = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)).double()
    vis = torch.ones(n, n, dtype=torch.bool).tril()[None, None].expand(b, h, n, n).clone()
    vis[:, restrict] &= band
    s = s.masked_fill(~vis, float("-inf"))
    p = torch.softmax(s, -1)
    torch.testing.assert_close(out, (p.float() @ v.repeat_interleave(2, 1)), atol=1e-5, rtol=0)
    torch.testing.assert_close(st.lse, torch.logsumexp(s, -1), atol=1e-4, rtol=0)
    torch.testing.assert_close(st.entropy, -torch.special.xlogy(p, p).sum(-1), atol=1e-4, rtol=0)
    assert torch.equal(st.argmax, p.argmax(-1))
    # band mass: 1 for a restricted head, below 1 elsewhere once the context passes the band
    in_band = (p * (band & torch.ones(n, n, dtype=torch.bool).tril()).double()).sum(-1)
    torch.testing.assert_close(st.band[1], in_band, atol=1e-5, rtol=0)
    assert float(st.band[1][:, restrict].min()) > 1 - 1e-6
    # single entries read back through the Rows protocol honour the restriction too
    keys = torch.full((n,), sinks + 1)
    torch.testing.assert_close(st.at(keys).float(), p[..., sinks + 1].float(), atol=1e-6, rtol=0)
