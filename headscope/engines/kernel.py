"""The fused CPU kernel: per-row attention statistics without the pattern (``csrc/head_stats.cpp``).

Every built-in metric reads a query row of the pattern in one of three ways: one entry
(``A[q, 0]``, ``A[q, q-1]``, ...), the mass on a set of flagged keys, or the row's entropy. The
kernel computes the last two for every row in one pass over ``q kᵀ`` tiles that stay in cache,
with a running maximum as flash attention does, plus the row's log-sum-exp so that any single
entry is ``exp(q·k - lse)`` afterwards. From the same tiles of exp-scores it can also compute the
layer's output ``A v`` (:func:`attention`), so a scanned layer costs what its fused attention
alone does; the softmax pattern never exists in memory. The fused engine
(:mod:`headscope.engines.fused`) is what calls it during a scan.

The extension is compiled on first use with the C++ compiler torch's ``cpp_extension`` finds
(about a minute, once; cached by torch under ``~/.cache/torch_extensions``). Where it cannot be
built, or with ``HEADSCOPE_KERNEL=0``, :func:`available` is False and scans use the blocked engine,
which gives the same scores from exact pattern blocks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

import torch
from torch import Tensor

from headscope.errors import notice
from headscope.metrics.stats import HeadStats

SOURCE = Path(__file__).with_name("csrc") / "head_stats.cpp"
MAX_FLAGS = 4  # flag channels the kernel takes at once

_module = None
_reason: str | None = None


def available() -> bool:
    """Whether the kernel is built and loadable (builds it on the first call)."""
    return _load() is not None


def unavailable_reason() -> str:
    """Why :func:`available` is False ("" when it is True)."""
    _load()
    return _reason or ""


def _load():
    global _module, _reason
    if _module is not None or _reason is not None:
        return _module
    if os.environ.get("HEADSCOPE_KERNEL", "1") == "0":
        _reason = "disabled by HEADSCOPE_KERNEL=0"
        return None
    try:
        # A CUDA build of torch on a machine without a GPU logs "No CUDA runtime is found" when
        # cpp_extension is imported; the kernel is CPU-only, so that line is noise on stderr.
        with _quiet_logger("torch.utils.cpp_extension"):
            from torch.utils import cpp_extension

        _ninja_on_path()
        name = "headscope_head_stats"
        flags = ["-O3", "-fopenmp"] + (["-mavx2", "-mfma"] if _has_avx2() else [])
        build_dir, source = _build_place(
            name, flags, Path(cpp_extension._get_build_directory(name, verbose=False))
        )
        _module = _built(name, build_dir, source)
        if _module is None:  # not built yet (or its source changed): build, under torch's lock
            _clear_stale_lock(build_dir)
            notice("compiling the fused attention-statistics kernel (once, about a minute)...")
            _module = cpp_extension.load(
                name=name,
                sources=[str(source)],
                extra_cflags=flags,
                extra_ldflags=["-fopenmp"],
                build_directory=str(build_dir),
                verbose=False,
            )
    # no compiler, no ninja, unsupported platform: the blocked engine works
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        _reason = f"the C++ kernel could not be built ({first[:200]})"
        print(f"headscope: {_reason}; using the blocked engine.", file=sys.stderr)
    return _module


def _built(name: str, build_dir: Path, source: Path):
    """The kernel already built in ``build_dir`` from this ``source``, imported directly, or None.

    torch's loader takes a lock file for every load, even when nothing needs building; a process
    killed while it holds it (Ctrl-C during a first scan) leaves a lock every later process waits
    on. A built library newer than its source needs no build, so it is imported without the lock."""
    import importlib.util

    library = build_dir / f"{name}.so"
    if not library.is_file() or library.stat().st_mtime < source.stat().st_mtime:
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except (ImportError, OSError):
        return None  # a half-written or foreign library: build it again


def _build_place(name: str, flags: list[str], default: Path) -> tuple[Path, Path]:
    """A build folder per kernel source and flags (``<torch cache>/<name>-<hash>``) holding its own
    copy of the source: every checkout and installed copy of headscope with the same kernel shares
    one build, and two different kernels never rebuild over each other."""
    import hashlib

    code = SOURCE.read_bytes()
    digest = hashlib.sha256(code + " ".join(flags).encode()).hexdigest()[:12]
    build_dir = default.parent / f"{name}-{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    source = build_dir / SOURCE.name
    if not source.is_file() or source.read_bytes() != code:
        tmp = build_dir / f".{SOURCE.name}.{os.getpid()}.tmp"
        tmp.write_bytes(code)
        os.replace(tmp, source)
    return build_dir, source


@contextlib.contextmanager
def _quiet_logger(name: str):
    logger = logging.getLogger(name)
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def _clear_stale_lock(build_dir: Path, max_age_s: float = 900) -> None:
    """torch waits forever on the build folder's ``lock`` file; a build killed midway (Ctrl-C)
    leaves it behind. A lock older than any real build (15 min) is removed."""
    import time

    lock = build_dir / "lock"
    try:
        if lock.exists() and time.time() - lock.stat().st_mtime > max_age_s:
            lock.unlink()
    except OSError:
        pass


def _ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the pip ``ninja`` package's binary sits in the venv, which a
    non-activated venv (``.venv/bin/python -m ...``) does not put on PATH."""
    import shutil

    if shutil.which("ninja") is None:
        try:
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except (ImportError, AttributeError):
            pass


def _has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            words = set(f.read(1 << 16).split())
        return {"avx2", "fma"} <= words
    except OSError:
        return False


def supports(query: Tensor, attention_mask: Tensor | None) -> bool:
    """Whether this attention call can go through the kernel (CPU, boolean or no mask)."""
    if query.device.type != "cpu":
        return False
    if attention_mask is not None and (
        attention_mask.dtype != torch.bool
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
    ):
        return False  # additive biases (ALiBi, ...) or per-head masks: exact pattern blocks instead
    return available()


def head_stats(
    query: Tensor,
    key: Tensor,
    attention_mask: Tensor | None,
    scaling: float,
    causal: bool,
    flags: dict[str, Tensor],
    reach: int | None = None,
    band: tuple[int, int] | None = None,
    argmax: bool = False,
) -> HeadStats:
    """Per-row statistics of ``softmax(q kᵀ * scaling + mask)`` for one layer.

    ``query`` ``[batch, head, q, dim]``; ``key`` ``[batch, kv_head, k, dim]`` (grouped-query
    attention: head ``h`` uses key head ``h // (heads / kv_heads)``); ``attention_mask`` None or
    boolean ``[batch or 1, 1, q or 1, k]`` (True = may attend); ``flags``: name -> ``[batch, k]``
    (0/1) key sets whose attention mass is wanted. ``reach``: the layer's sliding window
    (``|q - k| <= reach``); with a mask that hides every key outside it, the kernel skips the key
    tiles no row of a query tile can see (a long context costs ``n x window``, not ``n^2``).
    ``band = (sinks, window)``: also each row's mass on the keys a sink + window KV cache keeps
    (``k < sinks`` or ``q - window < k <= q``); ``argmax``: also each row's arg-max key (the first
    key holding the row's largest weight).
    """
    return _run(query, key, None, attention_mask, scaling, causal, flags, reach, band, argmax)[1]


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float,
    causal: bool,
    flags: dict[str, Tensor],
    reach: int | None = None,
    band: tuple[int, int] | None = None,
    argmax: bool = False,
    restrict: Tensor | None = None,
) -> tuple[Tensor, HeadStats]:
    """The attention output ``softmax(q kᵀ * scaling + mask) v`` ``[batch, head, q, dim_v]`` (in
    ``query``'s dtype) and the per-row statistics of :func:`head_stats`, from one pass: the same
    tiles of exp-scores feed both, so the scan costs about what the fused attention alone does.

    ``restrict`` (booleans ``[head]``, with ``band``): those heads see only the band's keys (a sink
    + window KV cache), and the kernel skips their key tiles outside it, so a restricted head costs
    ``O(sinks + window)`` per query instead of ``O(n)``."""
    return _run(
        query, key, value, attention_mask, scaling, causal, flags, reach, band, argmax, restrict
    )


def window_hidden(mask: Tensor | None, reach: int | None, n_q: int, n_k: int) -> bool:
    """Whether a boolean mask ``[batch, 1, q, k]`` visibly hides the keys beyond ``reach``: checked
    on the last row (keys before its window) and the first (keys after its window), so a window
    the config declares but the mask lacks never makes the kernel skip a visible key."""
    if mask is None or reach is None or mask.dtype != torch.bool:
        return False
    offset = n_k - n_q
    last, first = n_q - 1 + offset, offset
    # keys k < lo hidden from the last row, k >= hi from the first
    lo, hi = last - reach, first + reach + 1
    before = mask[:, :, -1, : max(lo, 0)]
    after = mask[:, :, 0, min(hi, n_k) :]
    return not bool(before.any()) and not bool(after.any())


def _run(
    query,
    key,
    value,
    attention_mask,
    scaling,
    causal,
    flags,
    reach=None,
    band=None,
    argmax=False,
    restrict=None,
):
    module = _load()
    if module is None:
        raise RuntimeError(f"The fused kernel is not available: {_reason}")
    b, h, n_q, _ = query.shape
    n_k = key.shape[2]
    q32 = (query.float() * scaling).contiguous()
    k32 = key.float().contiguous()
    mask = None
    if attention_mask is not None:
        mask = attention_mask[:, 0].expand(b, n_q, n_k)  # a view: broadcast dims keep stride 0
    names = list(flags)
    if len(names) > MAX_FLAGS:
        raise ValueError(f"At most {MAX_FLAGS} flag channels, got {len(names)}.")
    # [batch, flag, key]
    f = (
        torch.stack([flags[n].float() for n in names], 1).contiguous()
        if names
        else torch.zeros(b, 0, n_k)
    )
    empty = torch.empty(0, dtype=torch.bool)
    v32 = torch.empty(0) if value is None else value.float().contiguous()
    skip = reach if window_hidden(attention_mask, reach, n_q, n_k) else -1
    sinks, window = band if band is not None else (0, -1)
    if restrict is not None and band is None:
        raise ValueError("restrict needs a band (sinks, window).")
    heads = (
        torch.as_tensor(restrict, dtype=torch.bool).to(torch.int32).contiguous()
        if restrict is not None
        else torch.empty(0, dtype=torch.int32)
    )
    ent, mass, lse, out, band_mass, amax = module.head_stats(
        q32,
        k32,
        empty if mask is None else mask,
        f,
        causal,
        v32,
        True,
        skip,
        int(sinks),
        int(window),
        heads,
        argmax,
    )
    stats = HeadStats(
        shape=(b, h, n_q, n_k),
        entropy=ent,
        masses={n: mass[..., i] for i, n in enumerate(names)},
        lse=lse,
        query=q32,
        key=k32,
        causal=causal,
        mask=mask,
        band=None if band is None else (tuple(band), band_mass),
        argmax=amax if argmax else None,
        restrict=None if restrict is None else (tuple(band), heads.bool()),
    )
    return (out.to(query.dtype) if value is not None else None), stats
