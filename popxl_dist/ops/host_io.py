"""Builders: init, host_load and host_store."""
from __future__ import annotations

from typing import Optional

from .. import dtypes
from ..streams import DeviceToHostStream, HostToDeviceStream
from ..tensor import Tensor, check_shape
from ._builder import Out, add_op, check_tensor

__all__ = ["init", "host_load", "host_store"]


def init(shape, dtype: dtypes.dtype, name: Optional[str] = None, init_type: str = "zero",
         meta_shape=None) -> Tensor:
    """A new zero-filled (or undefined) tensor in the current graph."""
    if init_type not in ("zero", "undef"):
        raise ValueError(f"Unknown init_type: {init_type}")
    shape = check_shape(shape, "init")
    d = dtypes.dtype.as_dtype(dtype)
    return add_op("Init", "init", [], [Out(name or "init", shape, d, meta_shape or ())],
                  {"init_type": init_type})[0]


def host_load(h2d_stream: HostToDeviceStream, name: Optional[str] = None) -> Tensor:
    """Load the next transfer of `h2d_stream` (see the host I/O rules)."""
    if not isinstance(h2d_stream, HostToDeviceStream):
        raise TypeError(f"host_load: expected a HostToDeviceStream, got {type(h2d_stream).__name__}")
    name = name or h2d_stream._stream_tensor.name
    buf = init(h2d_stream.shape, h2d_stream.dtype, f"{name}_init", "undef")
    return add_op("HostLoad", "host_load", [buf],
                  [Out(f"{name}_hostload", h2d_stream.shape, h2d_stream.dtype)],
                  {"stream": h2d_stream.tensor_id})[0]


def host_store(d2h_stream: DeviceToHostStream, t: Tensor) -> None:
    """Send `t` to the host through `d2h_stream` (shape and dtype must match)."""
    if not isinstance(d2h_stream, DeviceToHostStream):
        raise TypeError(f"host_store: expected a DeviceToHostStream, got "
                        f"{type(d2h_stream).__name__}")
    check_tensor(t, "host_store", "t")
    if t.dtype != d2h_stream.dtype:
        raise ValueError(f"dtype of stream {d2h_stream.tensor_id} `{d2h_stream.dtype}` does not "
                         f"match dtype of provided tensor `{t.dtype}`")
    if t.shape != d2h_stream.shape:
        raise ValueError(f"shape of stream {d2h_stream.tensor_id} `{d2h_stream.shape}` does not "
                         f"match shape of provided tensor `{t.shape}`")
    add_op("HostStore", "host_store", [t], [], {"stream": d2h_stream.tensor_id})
