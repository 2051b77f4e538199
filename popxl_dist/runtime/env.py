"""The one place `POPXL_*` environment settings are read."""
from __future__ import annotations

import os
from typing import Optional

__all__ = ["backend_name", "positive_int", "worker_count", "collective_timeout", "ray_address", "ray_transport",
           "BACKENDS"]

BACKENDS = ("local", "mpi", "ray")


def backend_name() -> str:
    name = os.environ.get("POPXL_BACKEND", "local").strip().lower() or "local"
    if name not in BACKENDS:
        raise ValueError(f"POPXL_BACKEND must be one of {BACKENDS}, got {name!r}")
    return name


def positive_int(name: str) -> Optional[int]:
    """Environment variable `name` as a positive int, None when unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{name} must be a positive int, got {value!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be a positive int, got {n}")
    return n


def worker_count(default: int = 1) -> int:
    n = positive_int("POPXL_WORKERS")
    return default if n is None else n


def collective_timeout() -> float:
    """Seconds a collective waits for its peers before failing (`POPXL_COLLECTIVE_TIMEOUT`)."""
    value = os.environ.get("POPXL_COLLECTIVE_TIMEOUT", "").strip()
    try:
        t = float(value) if value else 60.0
    except ValueError:
        raise ValueError(f"POPXL_COLLECTIVE_TIMEOUT must be a number of seconds, got "
                         f"{value!r}") from None
    if t <= 0:
        raise ValueError(f"POPXL_COLLECTIVE_TIMEOUT must be positive, got {t}")
    return t


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
