"""Kernel: Sum (the gradient sum autodiff emits): inputs added in order, each addition rounded
to the dtype as an `Add` is, so `decompose_sum` into adds gives the same bits."""
from __future__ import annotations

import numpy as np

from ..parallel import current_threads
from ._blocks import as_f32, binary_f32, each_range, elem_blocks, store
from ._util import F16, F32, f16_into, jit_loops, np_dtype, scratch, to_f16, via_f32
from .registry import kernel


@kernel("Sum", writes_out=True, inplace=(0, 1))
def _sum(attrs, ins, outs):
    dt = np_dtype(outs[0])
    add = via_f32(np.add, dt)
    same = all(np_dtype(i) == dt and i.shape == outs[0].shape for i in ins) and dt != F16

    if dt == F16 and all(np_dtype(i) in (F16, F32) and i.shape == outs[0].shape for i in ins):
        shape = outs[0].shape
        add16 = binary_f32(np.add, shape, shape, shape, F16)    # Add's own kernel

        def run16(first, *rest, out=None):
            """Each addition in float32, rounded to float16 (as `add` does), block by block."""
            if rest and jit_loops() is not None:    # Add's compiled pass, addition by addition
                res = add16(first, rest[0], out=out)
                for x in rest[1:]:
                    res = add16(res, x, out=res)
                return res
            res = np.empty(first.shape, F16) if out is None else out
            of = res.reshape(-1)
            xs = [np.ascontiguousarray(x).reshape(-1) for x in (first, *rest)]

            def block(lo: int, hi: int) -> None:
                o = of[lo:hi]
                w = scratch("sum_w", hi - lo)
                np.copyto(w, as_f32(xs[0][lo:hi], "sum_x"))
                if not rest:
                    store(w, o)
                for j, x in enumerate(xs[1:], 2):
                    w += as_f32(x[lo:hi], "sum_x")
                    to_f16(w, o)
                    if j < len(xs):             # the rounded sum is the next addend
                        f16_into(o, w)
            each_range(elem_blocks(of.size), block)
            return res
        return run16

    def run(first, *rest, out=None):
        if out is not None and same:
            if not rest:
                np.copyto(out, first)
                return out
            if out.flags.c_contiguous and current_threads() > 1:   # additions in blocks
                of = out.reshape(-1)
                xs = [np.ascontiguousarray(x).reshape(-1) for x in (first, *rest)]

                def block(lo: int, hi: int) -> None:
                    np.add(xs[0][lo:hi], xs[1][lo:hi], out=of[lo:hi])
                    for x in xs[2:]:
                        np.add(of[lo:hi], x[lo:hi], out=of[lo:hi])
                each_range(elem_blocks(of.size), block)
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
