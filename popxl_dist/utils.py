"""Host-data helpers: `to_numpy` (upstream's conversion and downcast rules), `table_to_string`,
and the device helpers upstream's Session uses (here every device is the emulator)."""
from __future__ import annotations

import importlib.util
from typing import Any, List, Optional, Sequence

import numpy as np

from . import dtypes
# As upstream: popxl.utils imports these, so `import popxl` also makes `popxl.fp8_utils`.
from .fp8_utils import host_pow2scale_cast_to_fp8  # noqa: F401  (upstream's name here)

__all__ = ["to_numpy", "table_to_string", "downcast_np_dtypes", "HW_DEVICE_CONNECTION_TIMEOUT",
           "torch_imported"]

# Whether torch is installed (upstream: whether `import torch` succeeded). Not imported here:
# torch tensors are recognised by their module when they are passed in.
torch_imported = importlib.util.find_spec("torch") is not None
HW_DEVICE_CONNECTION_TIMEOUT = int(1e4)

downcast_np_dtypes = {np.dtype(np.int64): np.dtype(np.int32),
                      np.dtype(np.uint64): np.dtype(np.uint32),
                      np.dtype(np.float64): np.dtype(np.float32)}
_DOWNCAST = downcast_np_dtypes


def to_numpy(x: Any, dtype: Optional[dtypes.dtype] = None, downcast: bool = True,
             copy: bool = True, log2_scale: Optional[int] = None,
             nan_on_overflow: Optional[bool] = None) -> np.ndarray:
    """Convert host data (NumPy, Python scalars/sequences, torch tensors) to a C-ordered NumPy
    array, a copy of the data unless `copy` is false (then shared where no conversion is needed).

    With no `dtype`, 64-bit ints and floats are downcast to 32 bits when `downcast` is true
    (Python ints become int32, floats float32). A memmap is returned as it is: it must already
    have `dtype` (if given), be C-ordered and aligned and need no downcast (else ValueError).

    For a float8 `dtype` the result is float8 data (an array of the structured dtype
    `dtype.as_numpy()`, as upstream): float16/32/64 data is cast with
    `popxl.fp8_utils.host_pow2scale_cast_to_fp8(x, dtype, log2_scale, nan_on_overflow)`
    (defaults 0 and True); float8 data of that format is taken as it is.

    Raises:
        RuntimeError: `log2_scale` or `nan_on_overflow` given for a non-float8 dtype.
        ValueError: a memmap that would have to be copied (see above).
        TypeError: float8 `dtype` and data that is neither float16/32/64 nor float8 data of
            that format (uint8 codes included: `codes.view(dtype.as_numpy())` makes them
            float8 data).
    """
    if isinstance(x, np.memmap):
        check_memmap(x, dtype)
    if dtype is not None and dtype in dtypes.FLOAT8_DTYPES:
        return _to_float8_codes(x, dtype, copy, log2_scale, nan_on_overflow)
    if log2_scale is not None or nan_on_overflow is not None:
        raise RuntimeError(f"log2_scale and nan_on_overflow are only for float8 dtypes, got "
                           f"dtype {dtype!r}")
    if isinstance(x, np.memmap):
        return x                                  # checked above: it needs no conversion
    src = x.detach().cpu().numpy() if type(x).__module__.startswith("torch") else x
    arr = np.asarray(src, order="C")           # C order, as upstream
    want = dtype.as_numpy() if dtype is not None else \
        _DOWNCAST.get(arr.dtype) if downcast else None
    if want is not None and arr.dtype != want:
        return arr.astype(want)        # a new array: no copy needed before it
    if copy and isinstance(src, np.ndarray) and np.may_share_memory(arr, src):
        return np.array(arr, copy=True)   # torch's numpy() shares the tensor's memory
    return arr


def check_memmap(x: np.memmap, dtype: Optional[dtypes.dtype]) -> None:
    """A memmap is used as it is (never copied), so, as upstream, it must already have the
    requested dtype, be C-ordered and aligned, and need no downcast."""
    if dtype is not None:
        if x.dtype != dtype.as_numpy():
            raise ValueError(f"When passing a memory-mapped NumPy array, the `dtype` parameter "
                             f"must be None or the same as the array's dtype: the memmap is "
                             f"{x.dtype}, dtype is {dtype.name}")
    if not (x.flags.c_contiguous and x.flags.aligned):
        raise ValueError(f"When passing a memory-mapped NumPy array, it must already be in "
                         f"C-ordered and aligned form (memmap of shape {x.shape}, "
                         f"{'Fortran order' if x.flags.f_contiguous else 'not contiguous'}"
                         f"{'' if x.flags.aligned else ', unaligned'})")
    if x.dtype in _DOWNCAST:
        raise ValueError(f"When passing a memory-mapped NumPy array, the dtype "
                         f"{dtype} is not supported, as it "
                         f"requires downcasting the array into a new array with a dtype "
                         f"supported by PopXL (the memmap is {x.dtype}; store it as "
                         f"{_DOWNCAST[x.dtype]})")


def _to_float8_codes(x: Any, dtype: dtypes.dtype, copy: bool, log2_scale: Optional[int],
                     nan_on_overflow: Optional[bool]) -> np.ndarray:
    """float8 data (structured dtype) of `x` for `to_numpy` with a float8 `dtype`."""
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    if not isinstance(x, np.ndarray):
        x = np.asarray(x, order="C")
    if x.dtype == dtype.as_numpy():
        return x.copy() if copy and not isinstance(x, np.memmap) else x
    if x.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"Type {x.dtype} is not supported for float8 tensors.Please use "
                        f"float16, float32 or float64 types. (Or float8 data of "
                        f"{dtype.as_numpy()}; uint8 codes become float8 data with "
                        f"codes.view(popxl.{dtype.name}.as_numpy()).)")
    return host_pow2scale_cast_to_fp8(x, dtype, 0 if log2_scale is None else log2_scale,
                                      True if nan_on_overflow is None else nan_on_overflow)


def _popxl_to_numpy(t) -> np.ndarray:
    """The host value a Constant or Variable was created with."""
    from .tensor import Constant, Variable

    if not isinstance(t, (Constant, Variable)):
        raise TypeError(f"_popxl_to_numpy: only Constants and Variables have host data, got {t!r}")
    return dtypes.host_view(np.array(t._info.data, copy=True), t.dtype)


def table_to_string(rows: Sequence[Sequence[Any]], delimiter: str = " | ",
                    header: bool = True) -> str:
    """Format rows as a text table with aligned columns separated by `delimiter`; with `header`,
    the first row is underlined with dashes."""
    cells: List[List[str]] = [[str(c) for c in r] for r in rows]
    if not cells:
        return ""
    n_cols = max(map(len, cells))
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(n_cols)]
    lines = [delimiter.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    if header:
        lines.insert(1, "-" * (sum(widths) + len(delimiter) * (n_cols - 1)))
    return "\n".join(lines)


# --- devices (upstream's hardware helpers; the emulator needs no hardware) -----------------
def _offline_device_from_str(device_type: str, num_ipus: Optional[int] = None):
    """A device description for `device_type` ("ipu_hw", "ipu_model", "cpu")."""
    from popart import DeviceInfo

    return DeviceInfo(device_type, num_ipus or 1)


def _to_device_info(device_type: str, num_ipus: int = 1, use_popdist: bool = False):
    """The device a Session of `num_ipus` IPUs runs on (always available: emulated)."""
    from popart import DeviceInfo

    return DeviceInfo(device_type, num_ipus)


def _acquire_hw_device_with_timeout(num_ipus: int = 1,
                                    timeout: int = HW_DEVICE_CONNECTION_TIMEOUT):
    """Upstream waits up to `timeout` seconds for free IPUs; the emulated device is free now."""
    from popart import DeviceInfo

    device = DeviceInfo("ipu_hw", num_ipus)
    device.attach()
    return device
