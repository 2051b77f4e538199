"""Host streams: `h2d_stream` / `d2h_stream` handles living in the main graph."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from . import dtypes
from ._ir.records import TensorKind
from .context import gcg
from .tensor import Tensor, TensorSpec, _new_tensor, check_shape

__all__ = ["Stream", "HostToDeviceStream", "DeviceToHostStream", "h2d_stream", "d2h_stream"]


class Stream:
    """A host stream: the main-graph tensor `host_load` reads or `host_store` writes."""

    def __init__(self, *a, **k):
        raise NotImplementedError("Cannot construct a popxl.Stream directly. Use `h2d_stream` "
                                  "or `d2h_stream`.")

    @classmethod
    def _from_tensor(cls, tensor: Tensor) -> "Stream":
        """The stream whose handle is `tensor` (a stream tensor of the main graph)."""
        s = object.__new__(cls)
        s._stream_tensor = tensor
        return s

    shape = property(lambda self: self._stream_tensor.shape)
    dtype = property(lambda self: self._stream_tensor.dtype)
    tensor_id = property(lambda self: self._stream_tensor.id)

    @property
    def spec(self) -> TensorSpec:
        return self._stream_tensor.spec

    def __hash__(self) -> int:
        return hash(self._stream_tensor)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._stream_tensor == self._stream_tensor

    def __str__(self) -> str:
        return f"{type(self).__name__} {self._stream_tensor!r}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}[{self.tensor_id} {self.dtype} {self.shape}]"


class HostToDeviceStream(Stream):
    """A stream of host data into the device, read with `ops.host_load`."""


class DeviceToHostStream(Stream):
    """A stream of device data to the host, written with `ops.host_store`."""


# popart sizes a tensor in int64 bytes (TensorInfo::nbytes): a stream beyond that cannot exist.
_MAX_BYTES = 2**63 - 1


def _check_size(what: str, shape: Tuple[int, ...], d: dtypes.dtype) -> None:
    """A ValueError naming the stream for a shape whose one transfer has more bytes than a
    tensor can (upstream's int64 byte count); refused here rather than at Session or run."""
    itemsize = np.dtype(d.as_numpy()).itemsize
    nbytes = int(np.prod(shape, dtype=object)) * itemsize if shape else itemsize
    if nbytes > _MAX_BYTES:
        raise ValueError(f"{what}: shape {shape} of {d.name} is {nbytes} bytes a transfer, more "
                         f"than a tensor can hold (2**63 - 1 bytes, as popart counts them)")


def _make(cls, shape, dtype, name: str):
    what = "h2d_stream" if cls is HostToDeviceStream else "d2h_stream"
    shape = check_shape(shape, f"{what} '{name}'")
    main = gcg().ir.main_graph
    d = dtypes.dtype.as_dtype(dtype)
    _check_size(f"{what} '{name}'", shape, d)
    info = _new_tensor(main, name, shape, d, TensorKind.STREAM,
                       extra={"direction": "h2d" if cls is HostToDeviceStream else "d2h"})
    s = cls._from_tensor(main._tensor(info.id))
    main.ir._streams[info.id] = s
    return s


def h2d_stream(shape, dtype: dtypes.dtype, name: Optional[str] = None) -> HostToDeviceStream:
    """A host-to-device stream of tensors of `shape` and `dtype` (always in the main graph)."""
    return _make(HostToDeviceStream, shape, dtype, name or "h2d_stream")


def d2h_stream(shape, dtype: dtypes.dtype, name: Optional[str] = None) -> DeviceToHostStream:
    """A device-to-host stream of tensors of `shape` and `dtype` (always in the main graph)."""
    return _make(DeviceToHostStream, shape, dtype, name or "d2h_stream")


def _stream_for(ir, stream_id: str):
    return ir._streams[stream_id]
