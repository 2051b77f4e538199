"""Kernels: RemoteLoad(Inplace) and RemoteStore on the replica's own buffer copies
(`ctx.remote[buffer_id]`, an `(entries, *shape)` array in the worker that holds the replica), and
RemoteCodeLoad (a no-op: there is no code to move)."""
from __future__ import annotations

import numpy as np

from .registry import kernel


def _entry_fn(buffer_id: int):
    def entry(ctx, offset) -> np.ndarray:
        store = ctx.remote[buffer_id]
        i = int(offset.reshape(-1)[0])
        if not 0 <= i < store.shape[0]:
            raise IndexError(f"entry {i} is outside remote buffer {buffer_id}'s "
                             f"{store.shape[0]} entries")
        return store[i, ...]          # a view, also for scalar entries
    return entry


@kernel("RemoteLoad", context=True)
def _remote_load(attrs, ins, outs, env):
    entry = _entry_fn(attrs["buffer"])

    def run(ctx, _init, offset):
        return entry(ctx, offset).copy()      # a later store must not change what was loaded
    return run


@kernel("RemoteLoadInplace", context=True, modifies=(0,))
def _remote_load_inplace(attrs, ins, outs, env):
    entry = _entry_fn(attrs["buffer"])

    def run(ctx, t, offset):
        t[...] = entry(ctx, offset)
        return t
    return run


@kernel("RemoteStore", context=True)
def _remote_store(attrs, ins, outs, env):
    entry = _entry_fn(attrs["buffer"])

    def run(ctx, t, offset):
        entry(ctx, offset)[...] = t
    return run


@kernel("RemoteCodeLoad")
def _remote_code_load(attrs, ins, outs):
    return lambda: None
