"""Kernel: Sum (the gradient sum autodiff emits): inputs added in order, each addition rounded
to the dtype as an `Add` is, so `decompose_sum` into adds gives the same bits."""
from __future__ import annotations

import numpy as np

from ._util import F16, np_dtype, via_f32
from .registry import kernel


@kernel("Sum", writes_out=True, inplace=(0, 1))
def _sum(attrs, ins, outs):
    dt = np_dtype(outs[0])
    add = via_f32(np.add, dt)
    same = all(np_dtype(i) == dt and i.shape == outs[0].shape for i in ins) and dt != F16

    def run(first, *rest, out=None):
        if out is not None and same:
            if not rest:
                np.copyto(out, first)
                return out
            np.add(first, rest[0], out=out)
            for x in rest[1:]:
                np.add(out, x, out=out)
            return out
        acc = first if rest else first.copy()      # never the input itself (see writes_out)
        for x in rest:
            acc = add(acc, x)
        if out is not None:
            out[...] = acc
            return out
        return acc
    return run
