"""``--ray`` and ``--workers``: every mistake refused in one line before any model loads (no Ray
import until Ray is needed)."""

from __future__ import annotations

import socket

from headscope.errors import HeadscopeError

LOCAL = "local"  # --ray with no address


def check_options(address: str | None, workers: int | None, effects: bool) -> None:
    """The ``--ray``/``--workers`` combinations that cannot run (no I/O: the address is reached
    later, by :func:`check_address`)."""
    if address is None:
        if workers is not None:
            raise HeadscopeError(
                "--workers goes with --ray (e.g. --ray --workers 2); without --ray a scan runs "
                "in this process."
            )
        return
    if workers is not None and workers < 1:
        raise HeadscopeError(f"workers (--workers) must be at least 1, got {workers}.")
    if effects:
        raise HeadscopeError(
            "--effects runs in one process (exact ablation reuses each prefix); drop --ray, or "
            "scan with --ray and measure effects apart."
        )


def require_ray():
    """The ``ray`` module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise HeadscopeError(
            '--ray needs Ray, which is not installed: pip install -e ".[ray]" '
            "(or pip install 'ray>=2.60,<3')."
        ) from None
    return ray


def check_address(address: str | None) -> None:
    """Refuse, in about a second, an address that cannot be a reachable Ray head (before any work).

    ``None``/``local`` and ``auto`` are left to Ray; ``HOST:PORT`` and ``ray://HOST:PORT`` must
    accept a TCP connection."""
    if address in (None, LOCAL, "auto"):
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise HeadscopeError(
            f"Ray address '{address}' must look like HOST:PORT (e.g. "
            "10.0.0.1:6379, from `ray start --head`), ray://HOST:10001, or auto."
        )
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            pass
    except OSError as exc:
        raise HeadscopeError(
            f"Cannot reach a Ray head at {address} ({exc.strerror or exc}); start one with "
            f"`ray start --head --port={port}` there, or drop the address for a local instance."
        ) from None
