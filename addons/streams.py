"""`InputStreams` / `OutputStreams`: ordered, attribute-accessible collections of host streams."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Iterator, Tuple, TypeVar

import popxl

__all__ = ["InputStreams", "OutputStreams", "StreamType"]

StreamType = TypeVar("StreamType", bound=popxl.streams.Stream)


class _Streams(OrderedDict):
    stream_init = None      # the stream factory of the subclass (h2d_stream / d2h_stream)

    def __init__(self, **kwargs: Tuple[Tuple[int, ...], popxl.dtype]):
        super().__init__()
        for name, (shape, dtype) in kwargs.items():
            super().__setitem__(name, type(self).stream_init(shape, dtype, name))

    @classmethod
    def from_streams(cls, streams: Iterable) -> "_Streams":
        out = cls()
        for s in streams:
            OrderedDict.__setitem__(out, s.tensor_id, s)
        return out

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"No stream '{name}'. Available: {list(self.keys())}") from None

    def __getitem__(self, key):
        if isinstance(key, (int, slice)) and not isinstance(key, bool):
            return list(self.values())[key]
        return super().__getitem__(key)

    def __iter__(self) -> Iterator:
        """Iterates over the streams (not the keys)."""
        return iter(list(self.values()))


class InputStreams(_Streams):
    """`InputStreams(x=((4, 2), popxl.float32))`: h2d streams by name."""

    stream_init = staticmethod(popxl.h2d_stream)


class OutputStreams(_Streams):
    """`OutputStreams(y=((4,), popxl.float32))`: d2h streams by name."""

    stream_init = staticmethod(popxl.d2h_stream)
