"""Kernels: Init, HostLoad and HostStore (host streams through the replica context)."""
from __future__ import annotations

import numpy as np

from ._util import np_dtype
from .registry import kernel


@kernel("Init", writes_out=True)
def _init(attrs, ins, outs):
    shape, dt = outs[0].shape, np_dtype(outs[0])
    if attrs.get("init_type", "zero") == "undef":
        return lambda out=None: np.empty(shape, dt) if out is None else out

    def zero(out=None):
        if out is None:
            return np.zeros(shape, dt)
        out.fill(0)
        return out
    return zero


@kernel("HostLoad", context=True, external=True)
def _host_load(attrs, ins, outs, env):
    slot = env.h2d_slot(attrs["stream"])

    def run(ctx, _init):
        return ctx.next_input(slot)
    return run


@kernel("HostStore", context=True)
def _host_store(attrs, ins, outs, env):
    slot = env.d2h_slot(attrs["stream"])

    def run(ctx, t):
        ctx.store_output(slot, t)
    return run
