"""`merge_exchange`, `io_tile_exchange`: numerically no-ops in the emulator."""
from __future__ import annotations

import contextlib
from typing import Iterator

from ..context import in_sequence, io_tiles

__all__ = ["merge_exchange", "io_tile_exchange"]


@contextlib.contextmanager
def merge_exchange() -> Iterator[None]:
    """Merge host/remote loads and stores created inside into one exchange (no-op here)."""
    yield


@contextlib.contextmanager
def io_tile_exchange(verify_overlap: bool = True) -> Iterator[None]:
    """`io_tiles()` + `merge_exchange()` + `in_sequence(False)`."""
    with io_tiles(), merge_exchange(), in_sequence(False):
        yield
