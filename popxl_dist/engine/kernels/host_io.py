"""Kernels: Init, HostLoad and HostStore (host streams through the replica context)."""
from __future__ import annotations

import numpy as np

from ._util import np_dtype
from .registry import kernel


@kernel("Init")
def _init(attrs, ins, outs):
    shape, dt = outs[0].shape, np_dtype(outs[0])
    if attrs.get("init_type", "zero") == "undef":
        return lambda: np.empty(shape, dt)
    return lambda: np.zeros(shape, dt)


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
