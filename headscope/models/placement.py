"""Where a model runs: accelerate's device maps and memory limits for a model too big for one
device, checked and parsed in one line each before anything loads (no torch imported here), and
torch's CPU threads for one block (:func:`threads`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from headscope.errors import HeadscopeError

#: ``device_map`` strategies accelerate places a model by (besides an explicit ``{module: device}``
# dict).
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def check_device_map(device_map, max_memory=None) -> None:
    """One line for a ``device_map`` / ``max_memory`` accelerate cannot use (before any loading)."""
    if device_map is None:
        if max_memory is not None:
            raise HeadscopeError(
                "max_memory (--max-memory) goes with a device map; add --device-map auto."
            )
        return
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise HeadscopeError(
            f"Unknown device map '{device_map}'; use {', '.join(DEVICE_MAPS)} "
            "(or, from Python, a {module name: device} dict)."
        )
    if not isinstance(device_map, (str, dict)):
        raise HeadscopeError(
            f"A device map is one of {', '.join(DEVICE_MAPS)} or a {{module name: device}} dict, "
            f"not a {type(device_map).__name__}."
        )
    if max_memory is not None and not isinstance(max_memory, dict):
        raise HeadscopeError(
            "max_memory is a {device: size} dict, e.g. {0: '20GiB', 'cpu': '60GiB'}."
        )
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise HeadscopeError(
            "--device-map needs accelerate: pip install 'accelerate>=1.0'."
        ) from None


def parse_max_memory(text: str | None) -> dict | None:
    """``"0=20GiB,1=20GiB,cpu=60GiB"`` -> ``{0: 20 GiB, 1: 20 GiB, "cpu": 60 GiB}`` in bytes (None
    stays None).

    >>> parse_max_memory("0=2GiB,cpu=500MB")
    {0: 2147483648, 'cpu': 500000000}
    """
    if text is None:
        return None
    out: dict = {}
    for part in text.split(","):
        key, sep, size = part.strip().partition("=")
        key, size = key.strip(), size.strip().upper().replace(" ", "")
        num = size.rstrip("KMGIB")
        unit = size[len(num) :]
        if not sep or not key or unit not in _SIZE_UNITS or not num.replace(".", "", 1).isdigit():
            raise HeadscopeError(
                f"--max-memory '{part.strip()}' is not DEVICE=SIZE; write it like "
                "0=20GiB,1=20GiB,cpu=60GiB (DEVICE: a GPU index, cpu or mps)."
            )
        if not (key.isdigit() or key in ("cpu", "mps", "disk")):
            raise HeadscopeError(f"--max-memory device '{key}' is not a GPU index, cpu or mps.")
        out[int(key) if key.isdigit() else key] = int(float(num) * _SIZE_UNITS[unit])
    return out


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[None]:
    """torch's CPU threads set to ``n`` for one block and put back after (None: left alone)."""
    if n is None:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
