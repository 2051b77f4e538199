"""Kernel: Sum (the gradient sum autodiff emits): inputs added in order, each addition rounded
to the dtype as an `Add` is, so `decompose_sum` into adds gives the same bits."""
from __future__ import annotations

import numpy as np

from ._util import np_dtype, via_f32
from .registry import kernel


@kernel("Sum")
def _sum(attrs, ins, outs):
    add = via_f32(np.add, np_dtype(outs[0]))

    def run(first, *rest):
        acc = first
        for x in rest:
            acc = add(acc, x)
        return acc
    return run
