"""The other CUDA route: a Triton kernel mirroring ``csrc/head_stats.cpp`` (a prototype beside
flex).

Where the flex route widens the value product (``[V | K | 1 | flags]``) to read the entropy and the
masses, this kernel keeps them as per-row accumulators next to flash attention's running maximum,
as the CPU kernel does: per (sequence, head, tile of queries) it walks the key tiles the mask can
reach and, from the same float32 exponentials, adds up

* ``z = sum e``, ``zs = sum e (s - m)`` (the entropy is ``ln z - zs / z``), ``lse = m + ln z``;
* ``zf[f] = sum e flag_f`` for each flagged key set, and ``zb = sum e`` over the sink + window band;
* ``acc = sum e v``, the layer's output (the weights rounded to the value dtype for this product
  only, as flash attention does; the statistics never are).

So its extra cost over flash attention is a few multiply-adds per score, not a wider matmul. The
needle's arg-max rows are few and computed explicitly, as in the flex route. Tiles are the flex
route's (:meth:`~headscope.engines.flex_stats.Visibility.tiles`): tiles the mask hides entirely are
skipped, and the mask is read only in tiles it hides partly.

Triton is optional: without it :func:`triton_reason` says why, and nothing here is imported by the
engines. On the CPU ``TRITON_INTERPRET=1`` runs the same kernel in Triton's interpreter (slow: tests
only). Status: exact against a hand-written softmax in the interpreter; not yet run on a GPU
(``benchmarks/bench_gpu.py`` measures it beside flex when it can).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from headscope.engines.flex_stats import BLOCK, StatsRequest, Visibility, _argmax_rows
from headscope.metrics.stats import HeadStats

try:  # optional: the kernel exists only where Triton does
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CI has no Triton
    triton = None

MASKED = -1.0e30  # a hidden score (finite: 0 * MASKED stays 0)
MAX_FLAGS = 4


def triton_reason(device: torch.device) -> str | None:
    """Why the Triton kernel cannot run on ``device`` here (None: it can)."""
    if triton is None:
        return "Triton is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return f"Triton runs on CUDA (or on the CPU under TRITON_INTERPRET=1), not {device}"


if triton is not None:

    @triton.jit
    def _stats_fwd(
        Q,
        K,
        V,
        FLAGS,
        MASK,
        CLS,
        KLO,
        KHI,
        OUT,
        ZS,
        MASS,
        BAND,
        scale,
        n_q,
        n_k,
        offset,
        sinks,
        window,
        sqb,
        sqh,
        sqm,
        skb,
        skh,
        skn,
        svb,
        svh,
        svn,
        sfb,
        smb,
        smq,
        smk,
        scb,
        skrb,
        H: tl.constexpr,
        G: tl.constexpr,
        D: tl.constexpr,
        DV: tl.constexpr,
        NKB: tl.constexpr,
        NQB: tl.constexpr,
        CAUSAL: tl.constexpr,
        HAS_MASK: tl.constexpr,
        NF: tl.constexpr,
        HAS_BAND: tl.constexpr,
        IEEE: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        TILE: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        kvh = h // G
        offs_m = pid_m * BM + tl.arange(0, BM)  # query rows
        offs_d = tl.arange(0, D)
        offs_dv = tl.arange(0, DV)
        row_ok = offs_m < n_q
        q = tl.load(
            Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :],
            mask=row_ok[:, None],
            other=0.0,
        )
        m_i = tl.full([BM], MASKED, tl.float32)
        z = tl.zeros([BM], tl.float32)
        zs = tl.zeros([BM], tl.float32)
        zb = tl.zeros([BM], tl.float32)
        zf0 = tl.zeros([BM], tl.float32)
        zf1 = tl.zeros([BM], tl.float32)
        zf2 = tl.zeros([BM], tl.float32)
        zf3 = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, DV], tl.float32)
        qc = (pid_m * BM) // TILE  # this query tile's row of the tile classes
        k_lo = tl.load(KLO + b * skrb + qc)
        k_hi = tl.load(KHI + b * skrb + qc)
        pos = offs_m + offset  # absolute positions of the rows
        for start in range(k_lo, k_hi, BN):  # the key tiles some row of this tile can see
            # 0 hidden, 1 partly, 2 all visible
            cls = tl.load(CLS + b * scb + qc * NKB + start // TILE)
            if cls != 0:
                offs_n = start + tl.arange(0, BN)
                col_ok = offs_n < n_k
                k = tl.load(
                    K + b * skb + kvh * skh + offs_n[:, None] * skn + offs_d[None, :],
                    mask=col_ok[:, None],
                    other=0.0,
                )
                if IEEE:
                    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
                else:
                    s = tl.dot(q, tl.trans(k)) * scale
                vis = row_ok[:, None] & col_ok[None, :]
                if CAUSAL:
                    vis = vis & (offs_n[None, :] <= pos[:, None])
                if HAS_MASK:
                    if cls == 1:
                        mk = tl.load(
                            MASK + b * smb + offs_m[:, None] * smq + offs_n[None, :] * smk,
                            mask=row_ok[:, None] & col_ok[None, :],
                            other=0,
                        )
                        vis = vis & (mk != 0)
                s = tl.where(vis, s, MASKED)
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp(m_i - m_new)
                d = tl.where(vis, s - m_new[:, None], 0.0)
                p = tl.where(vis, tl.exp(d), 0.0)
                zs = alpha * (zs + (m_i - m_new) * z) + tl.sum(p * d, 1)
                z = alpha * z + tl.sum(p, 1)
                if NF > 0:
                    # bit f = set f
                    fb = tl.load(FLAGS + b * sfb + offs_n, mask=col_ok, other=0).to(tl.int32)
                    zf0 = alpha * zf0 + tl.sum(p * ((fb & 1) != 0).to(tl.float32)[None, :], 1)
                    if NF > 1:
                        zf1 = alpha * zf1 + tl.sum(p * ((fb & 2) != 0).to(tl.float32)[None, :], 1)
                    if NF > 2:
                        zf2 = alpha * zf2 + tl.sum(p * ((fb & 4) != 0).to(tl.float32)[None, :], 1)
                    if NF > 3:
                        zf3 = alpha * zf3 + tl.sum(p * ((fb & 8) != 0).to(tl.float32)[None, :], 1)
                if HAS_BAND:
                    inb = (offs_n[None, :] < sinks) | (
                        (pos[:, None] - offs_n[None, :] < window)
                        & (offs_n[None, :] <= pos[:, None])
                    )
                    zb = alpha * zb + tl.sum(tl.where(inb, p, 0.0), 1)
                v = tl.load(
                    V + b * svb + kvh * svh + offs_n[:, None] * svn + offs_dv[None, :],
                    mask=col_ok[:, None],
                    other=0.0,
                )
                if IEEE:
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
                else:
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
        # the raw sums (the host divides in float64): [row] each; ZS holds m, z, zs
        zz = tl.where(z > 0, z, 1.0)
        base = bh * n_q + offs_m
        tl.store(ZS + base * 3 + 0, m_i, mask=row_ok)
        tl.store(ZS + base * 3 + 1, z, mask=row_ok)
        tl.store(ZS + base * 3 + 2, zs, mask=row_ok)
        if NF > 0:
            tl.store(MASS + base * 4 + 0, zf0, mask=row_ok)
        if NF > 1:
            tl.store(MASS + base * 4 + 1, zf1, mask=row_ok)
        if NF > 2:
            tl.store(MASS + base * 4 + 2, zf2, mask=row_ok)
        if NF > 3:
            tl.store(MASS + base * 4 + 3, zf3, mask=row_ok)
        if HAS_BAND:
            tl.store(BAND + base, zb, mask=row_ok)
        out = acc / zz[:, None]
        tl.store(
            OUT + base[:, None] * DV + offs_dv[None, :],
            out.to(OUT.dtype.element_ty),
            mask=row_ok[:, None],
        )


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def triton_layer_stats(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    vis: Visibility,
    scale: float,
    request: StatsRequest,
    block: object | None = None,
    window_block: object | None = None,
) -> tuple[Tensor, HeadStats]:
    """What :func:`~headscope.engines.flex_stats.layer_stats` returns, from the Triton kernel.

    ``query`` ``[batch, head, q, dim]``, ``key``/``value`` ``[batch, kv_head, k, dim]`` in the
    model's dtype (float32 models: IEEE float32 products; bf16/fp16: the scores and every statistic
    accumulated in float32 from products of the exact half-precision values). ``block`` and
    ``window_block`` are accepted for the same signature and not used (tiles come from ``vis``)."""
    reason = triton_reason(query.device)
    if reason is not None:
        raise RuntimeError(f"The Triton statistics kernel cannot run: {reason}.")
    b, h, n_q, d = query.shape
    kvh, n_k, dv = key.shape[1], key.shape[2], value.shape[-1]
    device = query.device
    names = list(request.flags)
    if len(names) > MAX_FLAGS:
        raise ValueError(f"At most {MAX_FLAGS} flagged key sets, got {len(names)}.")
    dp, dvp = _pow2(max(d, 16)), _pow2(max(dv, 16))
    q = _pad(query.contiguous(), dp)  # [b, h, q, dp]: zero channels change no product
    k = _pad(key.contiguous(), dp)
    v = _pad(value.contiguous(), dvp)
    if query.dtype == torch.float32:
        q, k, v = q.float(), k.float(), v.float()
    flags = torch.zeros(b, n_k, dtype=torch.int8, device=device)
    for i, n in enumerate(names):
        flags |= request.flags[n].to(device).bool().to(torch.int8) << i
    any_, all_ = vis.tiles()  # [mbatch, q tile, k tile] at BLOCK = 128
    # 0 hidden, 1 partly, 2 all visible
    cls = (any_.to(torch.int8) + all_.to(torch.int8)).contiguous()
    nkb = cls.shape[-1]
    idx = torch.arange(nkb, device=device)
    # [mbatch, q tile]: the first tile a row can see
    k_lo = torch.where(any_, idx, nkb).amin(-1) * BLOCK
    k_hi = torch.minimum(
        (torch.where(any_, idx, -1).amax(-1) + 1) * BLOCK, torch.tensor(n_k, device=device)
    )
    k_lo = torch.minimum(k_lo, k_hi).to(torch.int32).contiguous()
    k_hi = k_hi.to(torch.int32).contiguous()
    dense = vis.dense
    mask = (
        dense.view(torch.uint8)
        if dense is not None
        else torch.zeros(1, 1, 1, dtype=torch.uint8, device=device)
    )
    out = torch.empty(b, h, n_q, dvp, dtype=value.dtype, device=device)
    zsum = torch.empty(b, h, n_q, 3, dtype=torch.float32, device=device)  # m, z, zs per row
    mass = torch.zeros(b, h, n_q, MAX_FLAGS, dtype=torch.float32, device=device)
    band = torch.zeros(b, h, n_q, dtype=torch.float32, device=device)
    sinks, window = request.band if request.band is not None else (0, 0)
    bm, bn = (64, 64) if dp <= 128 else (32, 32)
    grid = (triton.cdiv(n_q, bm), b * h)
    mb = cls.shape[0]
    _stats_fwd[grid](
        q,
        k,
        v,
        flags,
        mask,
        cls,
        k_lo,
        k_hi,
        out,
        zsum,
        mass,
        band,
        float(scale),
        n_q,
        n_k,
        n_k - n_q,
        int(sinks),
        int(window),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        flags.stride(0),
        mask.stride(0) if mb > 1 else 0,
        mask.stride(1),
        mask.stride(2),
        cls.stride(0) if mb > 1 else 0,
        k_lo.stride(0) if mb > 1 else 0,
        H=h,
        G=h // kvh,
        D=dp,
        DV=dvp,
        NKB=nkb,
        NQB=cls.shape[1],
        CAUSAL=bool(vis.causal),
        HAS_MASK=dense is not None,
        NF=len(names),
        HAS_BAND=request.band is not None,
        IEEE=query.dtype == torch.float32,
        BM=bm,
        BN=bn,
        TILE=BLOCK,
        num_warps=4 if dp <= 64 else 8,
    )
    m, z, zs = zsum.double().unbind(-1)  # [b, h, q] each
    seen = z > 0
    zz = torch.where(seen, z, 1.0)
    ent = torch.where(seen, torch.log(zz) - zs / zz, 0.0)  # -sum A ln A = ln z - sum e (s - m) / z
    lse = torch.where(seen, m + torch.log(zz), float("-inf"))
    q_s = query.float() * scale
    stats = HeadStats(
        shape=(b, h, n_q, n_k),
        entropy=ent,
        masses={n: mass[..., i].double() / zz for i, n in enumerate(names)},
        lse=lse,
        query=q_s,
        key=key.float(),
        causal=vis.causal,
        mask=None if dense is None else dense.expand(b, n_q, n_k),
        band=None if request.band is None else (tuple(request.band), band.double() / zz),
        argmax=None
        if request.targets is None
        else _argmax_rows(q_s, key.float(), vis, request.targets.to(device)),
    )
    return out[..., :dv], stats


def _pad(x: Tensor, width: int) -> Tensor:
    """``x`` with zero channels up to ``width`` on the last axis (Triton tiles are powers of
    two)."""
    return x if x.shape[-1] == width else torch.nn.functional.pad(x, (0, width - x.shape[-1]))
