"""The one place `POPXL_*` environment settings are read."""
from __future__ import annotations

import os

__all__ = ["backend_name", "worker_count", "BACKENDS"]

BACKENDS = ("local", "mpi", "ray")


def backend_name() -> str:
    name = os.environ.get("POPXL_BACKEND", "local").strip().lower() or "local"
    if name not in BACKENDS:
        raise ValueError(f"POPXL_BACKEND must be one of {BACKENDS}, got {name!r}")
    return name


def worker_count(default: int = 1) -> int:
    value = os.environ.get("POPXL_WORKERS", "").strip()
    if not value:
        return default
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"POPXL_WORKERS must be a positive int, got {value!r}") from None
    if n < 1:
        raise ValueError(f"POPXL_WORKERS must be a positive int, got {n}")
    return n
