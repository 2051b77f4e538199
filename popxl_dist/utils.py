"""Host-data helpers: `to_numpy` (upstream's conversion and downcast rules) and `table_to_string`."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from . import dtypes

__all__ = ["to_numpy", "table_to_string"]

_DOWNCAST = {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.uint32),
             np.dtype(np.float64): np.dtype(np.float32)}


def to_numpy(x: Any, dtype: Optional[dtypes.dtype] = None, downcast: bool = True,
             copy: bool = True) -> np.ndarray:
    """Convert host data (NumPy, Python scalars/sequences, torch tensors) to a NumPy array.

    With no `dtype`, 64-bit ints and floats are downcast to 32 bits when `downcast` is true
    (Python ints become int32, floats float32). A memmap is returned as it is.
    """
    if isinstance(x, np.memmap):
        arr = x
    elif type(x).__module__.startswith("torch"):
        arr = x.detach().cpu().numpy()
    else:
        arr = np.array(x, copy=copy) if copy else np.asarray(x)
    if dtype is not None:
        dtypes.check_not_float8(dtype, "to_numpy")
        want = dtype.as_numpy()
        if arr.dtype != want:
            arr = arr.astype(want)
    elif downcast and arr.dtype in _DOWNCAST:
        arr = arr.astype(_DOWNCAST[arr.dtype])
    return arr


def table_to_string(rows: Sequence[Sequence[Any]], header: Optional[Sequence[str]] = None) -> str:
    """Format rows as a plain text table with aligned columns."""
    all_rows: List[List[str]] = ([list(map(str, header))] if header else []) + [
        [str(c) for c in r] for r in rows]
    if not all_rows:
        return ""
    widths = [max(len(r[i]) for r in all_rows if i < len(r)) for i in range(max(map(len, all_rows)))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in all_rows]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
