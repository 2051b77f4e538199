"""`host_load` / `host_store` that create their stream too."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

import popxl
from popxl import ops
from popxl.utils import to_numpy

__all__ = ["host_load", "host_store"]


def host_load(t, dtype: Optional[popxl.dtype], name: Optional[str]
              ) -> Tuple[np.ndarray, popxl.HostToDeviceStream, popxl.Tensor]:
    """A stream shaped like host array `t` and its loaded tensor (`dtype` None: inferred from
    `t` with popxl's downcast rules; `name` None: the stream's default name).

    Returns:
        (t as a NumPy array of `dtype`, the stream named `<name>_stream`, the loaded tensor).
    """
    arr = to_numpy(t, popxl.dtype.as_dtype(dtype) if dtype is not None else None)
    stream = popxl.h2d_stream(arr.shape, popxl.dtype.as_dtype(arr.dtype),
                              name=f"{name}_stream" if name else None)
    return arr, stream, ops.host_load(stream, name)


def host_store(t: popxl.Tensor) -> popxl.DeviceToHostStream:
    """A stream shaped like `t` (named `<t.name>_stream`) and a host_store of `t` into it."""
    stream = popxl.d2h_stream(t.shape, t.dtype, name=f"{t.name}_stream")
    ops.host_store(stream, t)
    return stream
