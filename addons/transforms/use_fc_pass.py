"""Switching Poplar's fully-connected pass of every MatMul (a planning hint: recorded on the
ops as `op.useFullyConnectedPass()`, no effect on the numbers)."""
from __future__ import annotations

import popxl

__all__ = ["disable_fc_pass", "enable_fc_pass"]


def _set(ir: popxl.Ir, value: bool) -> None:
    for gd in ir._data.graphs.values():
        for op in gd.ops:
            if op.type == "MatMul":
                op.attrs["use_fully_connected_pass"] = value


def disable_fc_pass(ir: popxl.Ir) -> None:
    """Turn the fully-connected pass off for every MatMul of `ir`."""
    _set(ir, False)


def enable_fc_pass(ir: popxl.Ir) -> None:
    """Turn the fully-connected pass on for every MatMul of `ir`."""
    _set(ir, True)
