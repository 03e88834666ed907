"""Per-row attention statistics from FlexAttention: the maths behind the flex engine.

Every built-in metric reads a query row ``A[q, :]`` of ``softmax(s)``, ``s = q k^T * scale``, in one
of four ways (:mod:`headscope.metrics.rows`). FlexAttention returns the layer's output and each
row's log-sum-exp ``lse`` in one fused pass, and its values may be any per-key vectors, so:

* one entry: ``A[q, k] = exp(s[q, k] - lse[q])`` (a gather; :meth:`HeadStats.at` does it);
* the mass on a key set ``F`` (separator, punctuation, the sinks ``k < s``): an extra value channel
  holding ``1[k in F]``, since ``(A f)[q] = sum_k A[q, k] f[k]``;
* the entropy ``H[q] = sum_k A[q, k] (lse[q] - s[q, k]) = lse[q] c[q] - q . (A K)[q] * scale``: the
  keys themselves as value channels, and a channel of ones, ``c = A 1`` (1 in exact arithmetic; with
  it, weights rounded inside the kernel (TF32) stay weights, and the error stays below 2^-11 H).
  In float32 the pass reads keys centred on their mean, ``K - kbar`` (each row's scores move by
  the constant ``q . kbar``, so ``A`` does not change): the pass's scores and ``q . A(K - kbar)``
  then round at the size of the centred scores, which drops the large offset keys share in real
  models. The entropy's error is still the ``A``-weighted rounding of the pass's scores (~eps32 x
  |q| |k - kbar|: 6e-6 on the tests' large-logit case, ~1e-7 in SmolLM2's first layer), where an
  elementwise kernel's (fused, Triton) cancels to first order;
* the streaming band ``k < s`` or ``q - w < k <= q``: the sink channel plus ``exp(lse_w - lse)``,
  ``lse_w`` from a second pass masked to the window keys ``k >= s`` (a diagonal strip of tiles);
* the arg-max key (retrieval): only the needle's answer rows need it; they are computed explicitly.

So one pass with values ``[V | K | 1 | flags | sinks]`` gives the output and every statistic. It
runs in float32 whatever the model's dtype (bf16/fp16 activations are exact in float32, and on CUDA
the kernel's float32 matmuls use TF32 for them, which holds bf16 and fp16 inputs exactly).

Masks: the call's boolean mask (padding, causality, sliding windows, as the model built it) is read
by the ``mask_mod``; the tiles it hides entirely are skipped and those it shows entirely are read
without it (:func:`block_mask`), so a sliding-window layer costs ``n x window``. Without a mask the
call is causal or full. The eager (uncompiled) FlexAttention that runs on the CPU ignores the tiles
and applies ``mask_mod`` everywhere; the compiled kernel trusts the tiles, so the two agree only if
the tiles agree with ``mask_mod``, which :func:`block_mask` guarantees and the tests check.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headscope.metrics.stats import HeadStats

BLOCK = 128  # FlexAttention's default sparse block (tile) size
# a masked score in the explicit arg-max rows (as the blocked engine)
NEG = torch.finfo(torch.float32).min
#: Output channels (heads x rows x channels x 4 bytes) one FlexAttention call may hold; a layer is
#: processed in chunks of KV heads that stay under it (on CUDA one chunk of 4 heads x 32k rows x
#: 132 channels is ~70 MB and still fills an H200 with 1,024 tiles of queries).
CHUNK_BYTES = 64 * 2**20
#: torch.compile keeps at most ``recompile_limit`` (default 8) variants of one function before it
#: falls back to running it uncompiled, which for FlexAttention means ``n x n`` scores in memory.
#: A scan compiles a few per model (value widths, masks, the window pass, dtypes); raised once.
RECOMPILE_LIMIT = 64
#: On the CPU the eager FlexAttention materialises ``[batch, head, q, k]`` scores (several copies).
CPU_SCORE_BYTES = 256 * 2**20
WINDOW_VALUE_DIM = 16  # the window pass only needs lse; FlexAttention still wants a value tensor
#: The widest value tensor one compiled pass takes, per device type (its kernel pads value widths to
#: a power of two and keeps a tile of them on chip); wider channel sets are split into passes.
#: Other devices: one pass (the eager path has no such limit).
MAX_VALUE_DIM = {"cuda": 256}

_compiled: Callable | None = None


def flex_reason() -> str | None:
    """Why FlexAttention cannot be used with this torch (None: it can)."""
    try:
        from torch.nn.attention import flex_attention as fa  # noqa: F401
        from torch.nn.attention.flex_attention import BlockMask  # noqa: F401
    except ImportError as exc:
        return f"this torch ({torch.__version__}) has no FlexAttention ({exc})"
    if not hasattr(fa.BlockMask, "from_kv_blocks"):
        return f"this torch ({torch.__version__}) has no BlockMask.from_kv_blocks"
    return None


def _flex_fn(device: torch.device) -> Callable:
    """Compiled FlexAttention on CUDA (one compiled function per process); the eager one
    elsewhere."""
    global _compiled
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if _compiled is None:
        import torch._dynamo

        # the newer name, and the one before it
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(
                    torch._dynamo.config,
                    name,
                    max(getattr(torch._dynamo.config, name), RECOMPILE_LIMIT),
                )
        _compiled = torch.compile(flex_attention)
    return _compiled


def _flex(
    query: Tensor, key: Tensor, value: Tensor, block: object, tf32: bool
) -> tuple[Tensor, Tensor]:
    """``(A value, lse)`` of ``softmax(query key^T)`` (scores pre-scaled: scale 1) under ``block``.

    ``lse`` is the natural log-sum-exp ``[batch, head, q]`` (-inf for a row that sees no key).
    ``return_aux`` is torch >= 2.9's name for what ``return_lse`` asked before."""
    from torch.nn.attention import flex_attention as fa

    fn = _flex_fn(query.device)
    options = {"FLOAT32_PRECISION": "'tf32'"} if tf32 and query.device.type == "cuda" else None
    kwargs = dict(
        block_mask=block,
        scale=1.0,
        enable_gqa=query.shape[1] != key.shape[1],
        kernel_options=options,
    )
    with warnings.catch_warnings():
        # the eager path warns once that it is not compiled: on the CPU that is the point
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        if hasattr(fa, "AuxRequest"):
            out, aux = fn(query, key, value, return_aux=fa.AuxRequest(lse=True), **kwargs)
            return out, aux.lse
        return fn(query, key, value, return_lse=True, **kwargs)


# ------------------------------------------------------------------------------ which keys a row
# sees


@dataclass(frozen=True)
class Visibility:
    """Which keys each query row of one attention call sees: the call's boolean mask (as the model
    built it: padding, causality, sliding window), and causality on top when the call is causal."""

    n_q: int
    n_k: int
    causal: bool
    dense: Bool[Tensor, "mbatch query key"] | None = None  # True = may attend; mbatch is 1 or batch
    device: torch.device = torch.device("cpu")  # where the block masks go (the queries' device)

    @property
    def offset(self) -> int:
        return self.n_k - self.n_q  # keys before the first query (a KV cache); 0 in a scan

    def mask_mod(self, window: tuple[int, int] | None = None) -> Callable:
        """The exact predicate ``(b, h, q, k) -> visible``; with ``window = (s, w)`` only the band's
        window keys ``q - w < k <= q`` at ``k >= s`` (the sinks are a value channel)."""
        dense, causal, off = self.dense, self.causal, self.offset
        one = dense is not None and dense.shape[0] == 1
        d2 = dense[0] if one else None  # [q, k]: a mask shared by the batch

        def mod(b, h, q, k):
            ok = k >= 0
            if dense is not None:
                ok = ok & (d2[q, k] if one else dense[b, q, k])
            if causal or window is not None:
                ok = ok & (k <= q + off)
            if window is not None:
                sinks, w = window
                ok = ok & (q + off - k < w) & (k >= sinks)
            return ok

        return mod

    def tiles(self, window: tuple[int, int] | None = None) -> tuple[Tensor, Tensor]:
        """``(any, all)``: per ``BLOCK x BLOCK`` tile ``[mbatch, q tile, k tile]``, whether
        ``mask_mod(window)`` is true somewhere / everywhere in it (over the tile's real rows and
        keys). Constraints on ``d = q + offset - k`` are exact per tile; the AND of several
        constraints is 'any' only where each has some visible key (a superset: such tiles are
        read with the mask)."""
        device = self.device
        nqb, nkb = -(-self.n_q // BLOCK), -(-self.n_k // BLOCK)
        qb, kb = torch.arange(nqb, device=device), torch.arange(nkb, device=device)
        q_lo, q_hi = qb * BLOCK, torch.clamp((qb + 1) * BLOCK, max=self.n_q) - 1  # [q tile]
        k_lo, k_hi = kb * BLOCK, torch.clamp((kb + 1) * BLOCK, max=self.n_k) - 1  # [k tile]
        d_min = (q_lo + self.offset)[:, None] - k_hi[None, :]  # [q tile, k tile]
        d_max = (q_hi + self.offset)[:, None] - k_lo[None, :]
        lo, hi = (0, None) if (self.causal or window is not None) else (None, None)
        if window is not None:
            hi = window[1] - 1
        any_ = torch.ones(nqb, nkb, dtype=torch.bool, device=device)
        all_ = any_.clone()
        if lo is not None:
            any_ &= d_max >= lo
            all_ &= d_min >= lo
        if hi is not None:
            any_ &= d_min <= hi
            all_ &= d_max <= hi
        if window is not None:  # k >= sinks
            any_ &= (k_hi >= window[0])[None, :]
            all_ &= (k_lo >= window[0])[None, :]
        any_, all_ = any_[None], all_[None]  # [1, q tile, k tile]
        if self.dense is not None:
            m_any, m_all = dense_tiles(self.dense)
            any_, all_ = any_ & m_any, all_ & m_all
        return any_, all_

    def block_mask(self, window: tuple[int, int] | None = None):
        """A FlexAttention ``BlockMask``: tiles with no visible key skipped, tiles whose keys are
        all visible read without ``mask_mod``, the rest read with it."""
        from torch.nn.attention.flex_attention import BlockMask

        any_, all_ = self.tiles(window)
        partial = any_ & ~all_  # [mbatch, q tile, k tile]

        def ordered(sel: Tensor) -> tuple[Tensor, Tensor]:
            num = sel.sum(-1, dtype=torch.int32)[:, None]  # [mbatch, 1, q tile]
            # chosen tiles first
            idx = torch.argsort(sel.to(torch.int8), dim=-1, descending=True, stable=True)
            # [mbatch, 1, q tile, k tile]
            return num.contiguous(), idx.to(torch.int32)[:, None].contiguous()

        kv_num, kv_idx = ordered(partial)
        full_num, full_idx = ordered(all_)
        return BlockMask.from_kv_blocks(
            kv_num_blocks=kv_num,
            kv_indices=kv_idx,
            full_kv_num_blocks=full_num,
            full_kv_indices=full_idx,
            BLOCK_SIZE=BLOCK,
            mask_mod=self.mask_mod(window),
            seq_lengths=(self.n_q, self.n_k),
        )

    def rows(self, b: int, q: Tensor) -> Bool[Tensor, "row key"]:
        """The visible keys of query rows ``q`` of sequence ``b`` (the explicit arg-max rows)."""
        k = torch.arange(self.n_k, device=q.device)
        vis = torch.ones(len(q), self.n_k, dtype=torch.bool, device=q.device)
        if self.dense is not None:
            vis &= self.dense[0 if self.dense.shape[0] == 1 else b][q]
        if self.causal:
            vis &= k[None, :] <= q[:, None] + self.offset
        return vis


def dense_tiles(
    mask: Bool[Tensor, "mbatch query key"], chunk_bytes: int = 64 * 2**20
) -> tuple[Tensor, Tensor]:
    """``(any, all)`` of a boolean mask per ``BLOCK x BLOCK`` tile ``[mbatch, q tile, k tile]``,
    over the tile's real rows and keys; read a few query tiles at a time."""
    mb, n_q, n_k = mask.shape
    nqb, nkb = -(-n_q // BLOCK), -(-n_k // BLOCK)
    step = max(1, chunk_bytes // max(1, mb * BLOCK * nkb * BLOCK))
    any_ = torch.empty(mb, nqb, nkb, dtype=torch.bool, device=mask.device)
    all_ = torch.empty_like(any_)
    for t0 in range(0, nqb, step):
        t1 = min(nqb, t0 + step)
        rows = mask[:, t0 * BLOCK : min(n_q, t1 * BLOCK)]  # [mbatch, r, key]
        pad = (0, nkb * BLOCK - n_k, 0, (t1 - t0) * BLOCK - rows.shape[1])  # keys, then rows
        for out, fill, red in ((any_, False, torch.any), (all_, True, torch.all)):
            x = torch.nn.functional.pad(rows, pad, value=fill)  # [mbatch, R, K]
            x = x.view(mb, t1 - t0, BLOCK, nkb, BLOCK)  # [mbatch, q tile, row, k tile, key]
            out[:, t0:t1] = red(red(x, dim=4), dim=2)
    return any_, all_


# ------------------------------------------------------------------------------ one layer


@dataclass(frozen=True)
class StatsRequest:
    """What the metrics of a scan read besides entries and entropy."""

    # name -> [batch, key] key set (real keys k >= 1 in it) whose mass is wanted
    flags: dict[str, Tensor]
    band: tuple[int, int] | None = None  # (sinks, window): each row's mass on that band (streaming)
    # needle answer rows (>= 0): their arg-max key
    targets: Int[Tensor, "batch query"] | None = None


def layer_stats(
    query: Float[Tensor, "batch head query dim"],
    key: Float[Tensor, "batch kv_head key dim"],
    value: Float[Tensor, "batch kv_head key dim_v"] | None,
    vis: Visibility,
    scale: float,
    request: StatsRequest,
    block: object | None = None,
    window_block: object | None = None,
) -> tuple[Tensor | None, HeadStats]:
    """The attention output ``softmax(q k^T * scale) v`` ``[batch, head, query, dim_v]`` in
    ``query``'s dtype (None without ``value``) and the per-row :class:`HeadStats`, from one
    FlexAttention pass per chunk of KV heads (plus one over the window tiles for the band).

    ``block``/``window_block``: the call's block masks when the caller keeps them across layers
    (built from ``vis`` when None)."""
    b, h, n_q, d = query.shape
    kvh, n_k = key.shape[1], key.shape[2]
    g = h // kvh
    device = query.device
    # inputs exact in TF32: only weights get rounded
    tf32 = query.dtype in (torch.float16, torch.bfloat16)
    q_s = query.float() * scale  # [b, head, q, dim], pre-scaled as the other engines do
    k32 = key.float()  # [b, kv_head, key, dim]
    names = list(request.flags)
    extra = [torch.ones(b, n_k, device=device)]  # the ones channel: c = sum_k A[q, k]
    # [b, key] each
    extra += [request.flags[n].to(device=device, dtype=torch.float32) for n in names]
    if request.band is not None:
        # sinks
        extra.append((torch.arange(n_k, device=device) < request.band[0]).float().expand(b, n_k))
    # [b, kv_head, key, 1 + flags]
    ex = torch.stack(extra, -1)[:, None].expand(b, kvh, n_k, len(extra))
    dv = 0 if value is None else value.shape[-1]
    # The pass reads centred keys kc = K - kbar, as keys and as value channels: scores move by the
    # row constant q . kbar, A does not, and H = (lse - q.kbar) c - q . A kc rounds at the size of
    # the centred scores. Half-precision keys stay as they are (exact in TF32; centred, they would
    # not be).
    # [b, kv_head, 1, dim]
    kbar = k32.new_zeros(b, kvh, 1, d) if tf32 else k32.mean(2, keepdim=True)
    kc = k32 - kbar if not tf32 else k32  # [b, kv_head, key, dim]
    # q . kbar
    c_q = (
        (q_s.view(b, kvh, g, n_q, d) @ kbar[:, :, None].transpose(-1, -2)).view(b, h, n_q).double()
    )
    parts = ([value.float()] if value is not None else []) + [kc, ex]
    values = torch.cat(parts, -1)  # [b, kv_head, key, dv + dim + 1 + flags (+1)]
    if block is None:
        block = vis.block_mask()
    if request.band is not None and window_block is None:
        window_block = vis.block_mask(window=request.band)

    out = (
        torch.empty(b, h, n_q, dv, dtype=query.dtype, device=device) if value is not None else None
    )
    ent = torch.empty(b, h, n_q, dtype=torch.float64, device=device)
    lse = torch.empty(b, h, n_q, dtype=torch.float64, device=device)
    masses = {n: torch.empty(b, h, n_q, dtype=torch.float64, device=device) for n in names}
    band_mass = (
        torch.empty(b, h, n_q, dtype=torch.float64, device=device)
        if request.band is not None
        else None
    )
    per_kv_head = b * g * n_q * values.shape[-1] * 4  # output channels of one KV head's query heads
    if device.type == "cpu":
        per_kv_head = max(per_kv_head, b * g * n_q * n_k * 4 * 4)
    step = max(1, min(kvh, CHUNK_BYTES // max(1, per_kv_head)))
    passes = value_passes(values.shape[-1], d, MAX_VALUE_DIM.get(device.type))
    for j0 in range(0, kvh, step):
        j1 = min(kvh, j0 + step)
        hs = slice(j0 * g, j1 * g)  # the query heads of KV heads j0..j1-1
        qch = q_s[:, hs].contiguous()  # [b, hc, q, dim]
        kch = kc[:, j0:j1].contiguous()  # [b, kvc, key, dim]
        o, lz = [], None
        for c0, c1 in passes:  # one pass unless the channels are wider than a compiled pass takes
            o_i, lz_i = _flex(qch, kch, values[:, j0:j1, :, c0:c1].contiguous(), block, tf32)
            o.append(o_i)  # [b, hc, q, c1 - c0]
            # [b, hc, q]: the same rows' lse (of centred scores) in every pass
            lz = lz_i if lz is None else lz
        o = o[0] if len(o) == 1 else torch.cat(o, -1)  # [b, hc, q, C]
        finite = torch.isfinite(lz)  # rows that see at least one key
        l64 = lz.double() + c_q[:, hs]  # the lse of the scores themselves
        if out is not None:
            out[:, hs] = o[..., :dv].to(query.dtype)
        ak = o[..., dv : dv + d].double()  # [b, hc, q, dim]: A K
        c = o[..., dv + d].double()  # [b, hc, q]: A 1
        qh = q_s[:, hs].double()  # [b, hc, q, dim]
        # H = sum_k A (lse - s) = (lse - q.kbar) c - q . A kc
        h_rows = lz.double() * c - (qh * ak).sum(-1)
        ent[:, hs] = torch.where(finite, h_rows, 0.0)
        lse[:, hs] = torch.where(finite, l64, float("-inf"))
        cs = torch.where(finite, c, 1.0)
        for i, n in enumerate(names):
            masses[n][:, hs] = torch.where(finite, o[..., dv + d + 1 + i].double() / cs, 0.0)
        if band_mass is not None:
            sink = torch.where(finite, o[..., dv + d + 1 + len(names)].double() / cs, 0.0)
            zeros = k32.new_zeros(b, j1 - j0, n_k, WINDOW_VALUE_DIM)
            _, lw = _flex(qch, kch, zeros, window_block, tf32)  # lse over the window keys (centred)
            win = torch.where(
                finite & torch.isfinite(lw), torch.exp(lw.double() - lz.double()), 0.0
            )
            band_mass[:, hs] = sink + win
    argmax = None
    if request.targets is not None:
        argmax = _argmax_rows(q_s, k32, vis, request.targets.to(device))
    stats = HeadStats(
        shape=(b, h, n_q, n_k),
        entropy=ent,
        masses=masses,
        lse=lse,
        query=q_s,
        key=k32,
        causal=vis.causal,
        mask=None if vis.dense is None else vis.dense.expand(b, n_q, n_k),
        band=None if request.band is None else (tuple(request.band), band_mass),
        argmax=argmax,
    )
    return out, stats


def value_passes(width: int, qk_dim: int, max_dim: int | None) -> list[tuple[int, int]]:
    """Channel ranges ``[(c0, c1), ...]`` of the passes over ``width`` value channels: each at most
    ``max_dim`` wide (None: one pass), cut so that the estimated cost is least: per pass, the scores
    and their exponentials (~2 x ``qk_dim``) plus the value product at the kernel's power-of-two
    width.

    >>> value_passes(132, 64, 256), value_passes(516, 256, 256)
    ([(0, 132)], [(0, 256), (256, 512), (512, 516)])
    """
    if max_dim is None or width <= 16:
        return [(0, width)]

    def pow2(w: int) -> int:
        return max(16, 1 << (w - 1).bit_length())

    best = None
    c = 16
    while c <= max_dim:
        cuts = [(c0, min(width, c0 + c)) for c0 in range(0, width, c)]
        cost = sum(2 * qk_dim + pow2(c1 - c0) for c0, c1 in cuts)
        if best is None or cost < best[0]:
            best = (cost, cuts)
        c *= 2
    return best[1]


def _argmax_rows(
    q_s: Tensor, k32: Tensor, vis: Visibility, targets: Tensor
) -> Int[Tensor, "batch head query"]:
    """Each answer row's arg-max key (the first key holding the row's largest weight), computed as
    the blocked engine does: the row's softmax over its visible keys; -1 on every other row."""
    b, h, n_q, d = q_s.shape
    kvh = k32.shape[1]
    amax = torch.full((b, h, n_q), -1, dtype=torch.long, device=q_s.device)
    for bi in range(b):
        rows = torch.nonzero(targets[bi, :n_q] >= 0).squeeze(-1)  # [m]
        if not len(rows):
            continue
        qs = q_s[bi][:, rows].view(kvh, h // kvh, len(rows), d)  # [kv_head, group, m, dim]
        s = (qs @ k32[bi].transpose(-1, -2)[:, None]).view(h, len(rows), -1)  # [head, m, key]
        seen = vis.rows(bi, rows)  # [m, key]
        p = torch.softmax(s.masked_fill(~seen, NEG), dim=-1)
        # a row that sees nothing attends nowhere
        p = p.masked_fill(~seen.any(-1, keepdim=True), 0.0)
        amax[bi][:, rows] = p.argmax(-1)
    return amax
