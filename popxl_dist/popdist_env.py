"""Replica placement seen by the user's script: `Ir(replication="popdist")` and the instance count.

The emulator runs the user's script once (the single controller), so every Ir is one instance that
drives all of its replicas: the instance replication factor equals the global one. A launcher may
set `POPDIST_NUM_TOTAL_REPLICAS` for `Ir(replication="popdist")`.
"""
from __future__ import annotations

import os

__all__ = ["global_replication_factor", "local_replication_factor"]


def global_replication_factor() -> int:
    value = os.environ.get("POPDIST_NUM_TOTAL_REPLICAS", "1")
    try:
        r = int(value)
    except ValueError:
        raise ValueError(f"POPDIST_NUM_TOTAL_REPLICAS must be an int, got {value!r}") from None
    return r


def local_replication_factor(global_rf: int) -> int:
    return global_rf
