"""Printing tensors and text at run time, filtered by the `MODEL_LOG_LEVEL` environment variable
(TRACE < DEBUG < INFO < WARN; default INFO): a print with a level below it adds no op."""
from __future__ import annotations

import logging
import os
from typing import Any, Literal, Optional

import popxl
from popxl import ops

__all__ = ["print_tensor", "print_text"]

logger = logging.getLogger(__name__)
LEVELS_TYPE = Literal["TRACE", "DEBUG", "INFO", "WARN"]
LEVELS = {"TRACE": 0, "DEBUG": 1, "INFO": 2, "WARN": 3}
MODEL_LOG_LEVEL = os.environ.get("MODEL_LOG_LEVEL", "INFO")
if MODEL_LOG_LEVEL not in LEVELS:
    raise ValueError(f"MODEL_LOG_LEVEL must be one of {', '.join(LEVELS)}, got "
                     f"{MODEL_LOG_LEVEL!r}")
MODEL_LOG_LEVEL_VAL = LEVELS[MODEL_LOG_LEVEL]


def _enabled(level: str) -> bool:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    return MODEL_LOG_LEVEL_VAL <= LEVELS[level]


def print_tensor(t: popxl.Tensor, *args: Any, level: LEVELS_TYPE = "DEBUG",
                 **kwargs: Any) -> popxl.Tensor:
    """`ops.print_tensor(t, *args, **kwargs)` when `MODEL_LOG_LEVEL` is at or below `level`;
    otherwise `t` itself (no op)."""
    if _enabled(level):
        return ops.print_tensor(t, *args, **kwargs)
    return t


def print_text(text: str, num: Optional[float] = None, level: LEVELS_TYPE = "DEBUG") -> None:
    """Print `text` (and `num`, default 0) at run time when `MODEL_LOG_LEVEL` allows `level`:
    a constant printed with `text` as its title."""
    if _enabled(level):
        ops.print_tensor(popxl.constant(0 if num is None else num, name="print_text"),
                         title=text)
