"""Parsing `POPXL_*` values, below every layer that reads one (the IR's debug options, the
runtime's settings in `runtime/env.py`)."""
from __future__ import annotations

import os
from typing import Optional

__all__ = ["positive_int"]


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
