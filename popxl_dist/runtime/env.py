"""The one place `POPXL_*` environment settings are read."""
from __future__ import annotations

import os

from .._env import positive_int

__all__ = ["backend_name", "positive_int", "worker_count", "collective_timeout", "peer_timeout",
           "ray_address", "ray_transport", "BACKENDS"]

BACKENDS = ("local", "mpi", "ray")


def backend_name() -> str:
    name = os.environ.get("POPXL_BACKEND", "local").strip().lower() or "local"
    if name not in BACKENDS:
        raise ValueError(f"POPXL_BACKEND must be one of {BACKENDS}, got {name!r}")
    return name


def worker_count(default: int = 1) -> int:
    n = positive_int("POPXL_WORKERS")
    return default if n is None else n


def _seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        t = float(value) if value else default
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not t > 0 or t == float("inf"):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return t


def collective_timeout() -> float:
    """Seconds a collective waits for its peers before failing (`POPXL_COLLECTIVE_TIMEOUT`)."""
    return _seconds("POPXL_COLLECTIVE_TIMEOUT", 60.0)


def peer_timeout() -> float:
    """Seconds without a sign of life from another host of the job before it is reported
    unreachable (`POPXL_PEER_TIMEOUT`)."""
    return _seconds("POPXL_PEER_TIMEOUT", 10.0)


def ray_address() -> str:
    """The Ray cluster to join (`POPXL_RAY_ADDRESS`, else Ray's own `RAY_ADDRESS`); empty means
    start a new local Ray (never join whichever cluster `ray start` last left on this machine)."""
    return (os.environ.get("POPXL_RAY_ADDRESS", "").strip()
            or os.environ.get("RAY_ADDRESS", "").strip())


RAY_TRANSPORTS = ("auto", "socket")


def ray_transport() -> str:
    """How Ray workers of one node talk (`POPXL_RAY_TRANSPORT`): `auto` (default) uses shared
    memory where it can, `socket` uses TCP sockets everywhere, as between nodes."""
    value = os.environ.get("POPXL_RAY_TRANSPORT", "").strip().lower() or "auto"
    if value not in RAY_TRANSPORTS:
        raise ValueError(f"POPXL_RAY_TRANSPORT must be one of {RAY_TRANSPORTS}, got {value!r}")
    return value
