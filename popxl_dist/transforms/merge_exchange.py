"""`merge_exchange`, `io_tile_exchange`.

Upstream merges the host and remote loads and stores created in a `merge_exchange()` block into
one exchange op so that they run together. The emulator runs them in creation order, which gives
the same values (merging changes when they are scheduled, not what they compute), so the ops
are left as they are. `io_tile_exchange` checks, as upstream, that the block leaves one op once
its exchanges are merged: anything else would keep the IO tiles from overlapping with compute.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List

from ..context import gcg, in_sequence, io_tiles

__all__ = ["merge_exchange", "io_tile_exchange"]

# the op types upstream's MergeExchange transform merges into one exchange op
EXCHANGE_OP_TYPES = frozenset({"HostLoad", "HostStore", "RemoteLoad", "RemoteLoadInplace",
                               "RemoteStore"})


@contextlib.contextmanager
def merge_exchange() -> Iterator[None]:
    """Merge the host/remote loads and stores created inside into one exchange (their order
    is kept: the values are the same)."""
    yield


@contextlib.contextmanager
def io_tile_exchange(verify_overlap: bool = True) -> Iterator[None]:
    """`io_tiles()` + `merge_exchange()` + `in_sequence(False)`.

    Args:
        verify_overlap: check that one op remains once the block's exchanges are merged (Init
            ops aside); otherwise raise RuntimeError listing them, as upstream.
    """
    graph = gcg()
    created: List = []
    handle = graph.register_op_created_hook(
        lambda op: created.append(op) if op.opType() != "Init" else None)
    try:
        with io_tiles(), merge_exchange(), in_sequence(False):
            yield
    finally:
        graph.remove_op_created_hook(handle)
    if verify_overlap:
        exchanges = [op for op in created if op.opType() in EXCHANGE_OP_TYPES]
        others = [op for op in created if op.opType() not in EXCHANGE_OP_TYPES]
        if len(others) + (1 if exchanges else 0) > 1:
            listed = "\n   ".join(op.debugName() for op in others
                                  + ([exchanges[0]] if exchanges else []))
            raise RuntimeError(
                "More than one Op remained after `io_tile_exchange`. This will prevent overlap "
                f"with following compute. Remaining Ops:\n   {listed}"
                + (f"\n   (and {len(exchanges) - 1} more exchanges merged with the last)"
                   if len(exchanges) > 1 else ""))
