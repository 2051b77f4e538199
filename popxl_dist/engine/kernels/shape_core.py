"""Kernels: Reshape and Transpose (views), their in-place aliases, and ReduceSum."""
from __future__ import annotations

import numpy as np

from ._util import F16, F32, from_f16, np_dtype, to_f16, without_out
from ._blocks import as_f32
from .registry import kernel


def _reshape_factory(attrs, ins, outs):
    shape = outs[0].shape

    def run(x, out=None):
        """A view of x when its layout allows, else a copy (into `out` when given)."""
        if out is None:
            return x.reshape(shape)
        v = x.view()
        try:
            v.shape = shape
            return v
        except AttributeError:
            np.copyto(out.reshape(x.shape), x)
            return out
    return run


kernel("Reshape", view=True, writes_out=True)(_reshape_factory)


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


@kernel("ReduceSum", writes_out=True)
def _reduce_sum(attrs, ins, outs):
    axes = tuple(attrs["axes"])
    keep = bool(attrs.get("keepdims", False))
    out = np_dtype(outs[0])
    if out == F16:
        def run16(x, out=None):
            return to_f16(np.sum(as_f32(x, "rsum_x"), axis=axes, keepdims=keep, dtype=F32), out)
        return run16
    if np_dtype(ins[0]) == out and out.kind == "f":
        def run(x, out=None):
            if out is None:
                return np.asarray(np.sum(x, axis=axes, keepdims=keep), dtype=out_dt)
            return np.sum(x, axis=axes, keepdims=keep, out=out)
        out_dt = out
        return run
    return without_out(lambda x: np.asarray(np.sum(x, axis=axes, keepdims=keep), dtype=out))
