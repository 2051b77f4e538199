"""Kernels: Reshape and Transpose (views), their in-place aliases, and ReduceSum."""
from __future__ import annotations

import numpy as np

from ._util import F16, F32, from_f16, np_dtype, to_f16
from .registry import kernel


def _reshape_factory(attrs, ins, outs):
    shape = outs[0].shape
    return lambda x: x.reshape(shape)


kernel("Reshape", view=True)(_reshape_factory)


@kernel("ReshapeInplace", alias=True)
def _reshape_inplace(attrs, ins, outs):
    """A view of x when NumPy can make one, else a copy (x non-contiguous, e.g. a transpose):
    the compiler then writes changes back between the two (`_AliasPlan.reshape_syncs`)."""
    shape = outs[0].shape
    return lambda x: x.reshape(shape)


def _transpose_factory(attrs, ins, outs):
    perm = tuple(attrs["perm"])
    return lambda x: x.transpose(perm)


kernel("Transpose", view=True)(_transpose_factory)
kernel("TransposeInplace", alias=True)(_transpose_factory)


@kernel("ReduceSum")
def _reduce_sum(attrs, ins, outs):
    axes = tuple(attrs["axes"])
    keep = bool(attrs.get("keepdims", False))
    out = np_dtype(outs[0])
    if out == F16:
        return lambda x: to_f16(np.sum(from_f16(x) if x.dtype == F16 else x, axis=axes,
                                       keepdims=keep, dtype=F32))
    return lambda x: np.asarray(np.sum(x, axis=axes, keepdims=keep), dtype=out)
