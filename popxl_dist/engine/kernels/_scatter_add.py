"""Scatter-add of rows in index order, with the bits of a sequential loop, fast.

`scatter_add_rows(out, idx, rows)` does `for k in range(N): out[idx[k]] += rows[k]`: every row of
`out` receives its additions one at a time, in the order of `idx` (so the float result is that of
`np.add.at`, which adds in the same order), without `np.add.at`'s per-element cost:

* the rows are sorted by destination (a stable sort keeps index order within a destination);
* destinations with few additions are added in passes: pass k adds the k-th row of every such
  destination at once (no destination twice in a pass, so plain fancy-index `+=` is exact);
* destinations with many additions (e.g. T5's relative-position buckets: 32 destinations for
  512 x 512 indices) are summed by `np.add.accumulate` over `out[d] + row_1, row_2, ...`,
  whose running sum is sequential (unlike `np.sum`/`np.add.reduce`, which sum pairwise).

Python-level iterations (passes plus heavy destinations) are as few as the counts allow,
at most ~2 * sqrt(N). Where the compiled loops are in use (`_util.jit_loops()`) and `out` is
C-contiguous, the sequential loop itself runs compiled (T5's bucket gradient: 262,144 rows into
32 destinations, ~6x faster); the bits are the same either way.
"""
from __future__ import annotations

import numpy as np

from ._util import jit_loops

__all__ = ["scatter_add_rows"]

_SMALL = 64           # below this many rows, np.add.at itself is as fast


def _stable_order(idx: np.ndarray, n_dest: int) -> np.ndarray:
    """A stable sort of `idx`; a 16-bit key when it fits (NumPy radix-sorts those)."""
    if n_dest <= np.iinfo(np.uint16).max:
        idx = idx.astype(np.uint16)
    return np.argsort(idx, kind="stable")


def scatter_add_rows(out: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> None:
    """In place: `out[idx[k]] += rows[k]` for k = 0..N-1 in order (see the module docstring).

    Args:
        out: `(D, *inner)` array, modified in place.
        idx: `(N,)` integer destinations, each in `[0, D)`.
        rows: `(N, *inner)` array of `out`'s dtype.
    """
    n = idx.shape[0]
    if n >= _SMALL and _compiled(out, idx, rows):
        return
    if n < _SMALL:
        np.add.at(out, idx, rows)
        return
    n_dest = out.shape[0]
    order = _stable_order(idx, n_dest)
    srows = np.take(rows, order, axis=0)   # (much faster than rows[order] for narrow rows)
    counts = np.bincount(idx, minlength=n_dest)
    starts = np.cumsum(counts) - counts
    present = np.flatnonzero(counts)
    is_heavy = counts[present] > _heavy_limit(counts[present])
    active = present[~is_heavy]
    k = 0
    while active.size:
        out[active] += np.take(srows, starts[active] + k, axis=0)
        k += 1
        active = active[counts[active] > k]
    for d in present[is_heavy]:
        seg = srows[starts[d]:starts[d] + counts[d]]      # our own copy: summed in place
        seg[0] = out[d] + seg[0]
        np.add.accumulate(seg, axis=0, out=seg)
        out[d] = seg[-1]


def _compiled(out: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> bool:
    """Run the compiled sequential loop where it applies; False where it does not."""
    if not (out.flags.c_contiguous and out.dtype in (np.float32, np.float64)
            and rows.dtype == out.dtype):
        return False
    jit = jit_loops()
    if jit is None:
        return False
    width = int(np.prod(out.shape[1:], dtype=np.int64))
    jit.scatter_add_rows(out.reshape(out.shape[0], width), idx.astype(np.intp, copy=False),
                         np.ascontiguousarray(rows).reshape(idx.shape[0], width))
    return True


def _heavy_limit(counts: np.ndarray) -> int:
    """The count above which a destination is summed on its own: the one that minimises the
    Python-level iterations, passes (the limit) plus heavy destinations (those above it)."""
    desc = np.sort(counts)[::-1]
    # Making the j largest heavy costs j destinations plus desc[j] passes.
    cost = np.arange(desc.size + 1) + np.append(desc, 0)
    j = int(np.argmin(cost))
    return int(desc[j]) if j < desc.size else 0
