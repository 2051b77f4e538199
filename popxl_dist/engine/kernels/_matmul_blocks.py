"""np.matmul computed in output blocks on the op's threads, with the single call's bits.

A matrix product is split along M (row blocks) or N (column blocks), never along K, so every
output element is a dot product over the whole of K, in BLAS's order, whichever thread computes
it.

Batched products (attention) split along their first batch axis longer than 1, in blocks that
depend on the shapes only (one thread: the single call): NumPy calls BLAS once per batch item
anyway, with the same arguments whatever the block, so the bits are the single call's by
construction.

A 2-D product is split into one block per thread (1 thread: the single call itself). Each BLAS
call packs its operands afresh, so a split fixed by the shapes would cost a 1-thread run its
re-packing: 8 to 16 fixed blocks measured +10-40% CPU time on the GPT benchmark's products
(`docs/threads.md`). Instead every split is checked to give the bits of the single call: BLAS
picks its kernel by the call's shape (OpenBLAS: a "small matrix" kernel, a "direct" kernel
without K blocking, the packed kernel, matrix-vector kernels), and those kernels give different
bits. The first product of each shape, layout and block count in a process is computed both
ways on random operands of the same layout (BLAS single-threaded: `runtime/blas.py`); a split
that differs is dropped, and a product none of whose candidates (either axis, as many blocks as
threads, then two) match is not split. The same trial times the single call and each matching
split as it runs, on the op's threads: the fastest split is used if it takes at most `GAIN` of
the single call's wall time (splitting along M or N can differ by 1.5x: which operand each
block re-packs, and the memory bandwidth the threads share), else none; that choice never
changes the bits. So every 2-D product gives the bits of the single NumPy call, with any
number of threads. The verdicts depend on the BLAS library and the CPU, as the bits already
do. Measured with NumPy 2.4's OpenBLAS 0.3.31 (SkylakeX kernels): the packed kernel keeps
its bits under any split at multiples of 64 that stays on it; blocks that fall into the direct
kernel (its tails) or the matrix-vector kernels (M or N = 1) do not.

Products of a few rows by a transposed matrix run swapped (`swapped`), with the swapped
product's bits; other float32 products with few rows or a short K run on `_small_gemm`'s
kernels, with their bits (the same for any number of threads by construction).
"""
from __future__ import annotations

import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...runtime.blas import blas_threads
from ..parallel import current_threads, run_blocks
from ._small_gemm import handles as small_product, small_gemm

__all__ = ["matmul", "plan_2d", "plan_batched", "bounds", "ALIGN", "MIN_BLOCK_MACS",
           "MAX_BLOCKS"]

ALIGN = 64                # block starts: multiples of every BLAS micro-kernel's M / N unroll
MIN_BLOCK_MACS = 1 << 22  # ~100 us of single-threaded SGEMM here: smaller blocks cost more than
                          # they gain (waking and collecting the helper threads: ~50 us)
MAX_BLOCKS = 64           # at most this many blocks of a batched product

Bounds = Tuple[Tuple[int, int], ...]
Plan = Tuple[int, Bounds]          # (axis: 0 rows / 1 columns, ((lo, hi), ...))

_SPLIT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def bounds(n: int, k: int) -> Bounds:
    """`k` ranges covering n, each starting at a multiple of ALIGN (the last one takes the
    remainder); needs n >= k * ALIGN."""
    units = n // ALIGN
    starts = [ALIGN * (units * i // k) for i in range(k)]
    return tuple(zip(starts, starts[1:] + [n]))


def _count(macs: int) -> int:
    return int(min(MAX_BLOCKS, macs // MIN_BLOCK_MACS))


def plan_2d(m: int, k: int, n: int, blocks: int) -> List[Plan]:
    """The candidate splits of an (m, k) @ (k, n) product into at most `blocks` blocks: along
    the longer of M and N, then the other, then each with two blocks (the trial of
    `_verified_plan` times every one that keeps the bits). Empty: too small to split."""
    nb = min(blocks, _count(m * k * n))
    if nb < 2:
        return []
    units = {0: m // ALIGN, 1: n // ALIGN}
    dims = {0: m, 1: n}
    order = (0, 1) if units[0] >= units[1] else (1, 0)
    plans: List[Plan] = []
    for count in (nb, 2):
        for axis in order:
            c = min(count, units[axis])
            if c >= 2:
                p = (axis, bounds(dims[axis], c))
                if p not in plans:
                    plans.append(p)
    return plans


def plan_batched(out_shape: Sequence[int], k: int) -> Optional[Tuple[int, Bounds]]:
    """(axis, ranges) splitting a batched product's output along its first batch axis longer
    than 1, or None."""
    batch = out_shape[:-2]
    axis = next((i for i, d in enumerate(batch) if d > 1), None)
    if axis is None:
        return None
    macs = int(np.prod(out_shape, dtype=np.int64)) * k
    nb = min(_count(macs), batch[axis])
    if nb < 2:
        return None
    d = batch[axis]
    starts = [d * i // nb for i in range(nb)]
    return axis, tuple(zip(starts, starts[1:] + [d]))


# --- running ---------------------------------------------------------------------------------
def matmul(a: np.ndarray, b: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """`np.matmul(a, b, out=out)` in blocks on the calling thread's op threads, with its bits
    (a few rows times a transposed matrix: the bits of `swapped`; float32 products with few
    rows or a short K: `_small_gemm`'s)."""
    if a.ndim == 2 and b.ndim == 2:
        kind = small_product(a, b)
        if kind is not None:
            return small_gemm(a, b, kind, out, current_threads())
        if swapped(a, b):
            return _matmul_swapped(a, b, out)
    return _matmul(a, b, out)


def _matmul(a: np.ndarray, b: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
    if current_threads() < 2:
        return np.matmul(a, b, out=out)         # one thread: the single call, as before
    if a.ndim == 2 and b.ndim == 2:
        return _matmul_2d(a, b, out)
    if a.ndim >= 2 and b.ndim >= 2 and (a.ndim > 2 or b.ndim > 2):
        return _matmul_batched(a, b, out)
    return np.matmul(a, b, out=out)


SWAP_ROWS = (2, 32)       # a product of this many rows by a transposed matrix runs swapped
SWAP_MIN_MACS = 1 << 19   # (smaller products: OpenBLAS's small-matrix kernels are fast as is)


def swapped(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `a @ b` is computed as `(b.T @ a.T).T`: a few rows of C-contiguous `a` times
    `b`, the transpose of a C-contiguous matrix of more rows (`dy @ w.T`, the input gradient of
    a linear layer at a small batch). OpenBLAS takes 1.4-2.2x as long for that layout (NumPy
    2.4's 0.3.31, SkylakeX kernels, 2-32 rows; measured in `docs/threads.md`). The choice
    depends on the shapes and layouts only, so the bits are the same with any number of
    threads; they are those of the swapped product, not of `np.matmul(a, b)`."""
    m, k = a.shape
    n = b.shape[1]
    return (SWAP_ROWS[0] <= m <= SWAP_ROWS[1] < n and m * k * n >= SWAP_MIN_MACS
            and a.dtype in _SPLIT_DTYPES and b.dtype == a.dtype and b.shape[0] == k
            and _layout(a) == ("C", k) and _layout(b) == ("F", k))


def _matmul_swapped(a: np.ndarray, b: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
    t = _matmul(b.T, a.T, None)               # (n, m), in blocks of its rows on several threads
    if out is None:
        return np.ascontiguousarray(t.T)
    np.copyto(out, t.T)
    return out


def _matmul_2d(a: np.ndarray, b: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
    m, k = a.shape
    n = b.shape[1]
    dt = a.dtype
    threads = current_threads()
    if (dt not in _SPLIT_DTYPES or b.dtype != dt
            or m * k * n < 2 * MIN_BLOCK_MACS
            or (out is not None and (out.dtype != dt or not out.flags.c_contiguous))
            or b.shape[0] != k):
        return np.matmul(a, b, out=out)
    la, lb = _layout(a), _layout(b)
    if la is None or lb is None or (m == n and a.ctypes.data == b.ctypes.data):
        return np.matmul(a, b, out=out)         # (NumPy's own A @ A.T path, or no BLAS)
    plan = _verified_plan((dt.char, m, k, n, la, lb, threads))
    if plan is None:
        return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty((m, n), dt)
    _run_split(a, b, plan, out)
    return out


def _matmul_batched(a: np.ndarray, b: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    plan = plan_batched(shape, a.shape[-1])
    if plan is None or (out is not None and out.shape != shape):
        return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty(shape, np.result_type(a, b))
    axis, ranges = plan
    nd = len(shape)

    def part(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
        j = axis - (nd - x.ndim)              # the axis in x (broadcast from the left)
        if j < 0 or x.shape[j] == 1:
            return x
        return x[(slice(None),) * j + (slice(lo, hi),)]

    def block(i):
        lo, hi = ranges[i]
        np.matmul(part(a, lo, hi), part(b, lo, hi), out=out[(slice(None),) * axis
                                                             + (slice(lo, hi),)])
    run_blocks(len(ranges), block)
    return out


def _layout(x: np.ndarray) -> Optional[Tuple[str, int]]:
    """('C', leading dimension) or ('F', leading dimension) as NumPy hands a 2-D operand to
    BLAS (not transposed / transposed), None where NumPy does not use BLAS for it."""
    sz = x.itemsize
    r, c = x.shape
    s0, s1 = x.strides
    if s1 == sz and s0 % sz == 0 and s0 // sz >= c:
        return "C", s0 // sz
    if s0 == sz and s1 % sz == 0 and s1 // sz >= r:
        return "F", s1 // sz
    return None


# --- the once-per-shape check ----------------------------------------------------------------
_VERDICTS: Dict[tuple, Optional[Plan]] = {}
_LOCK = threading.Lock()


def _verified_plan(key: tuple) -> Optional[Plan]:
    """The fastest candidate split of this product (dtype, m, k, n, layouts, at most how many
    blocks) among those that give the single call's bits on random operands, or None; decided
    once per process."""
    try:
        return _VERDICTS[key]
    except KeyError:
        pass
    char, m, k, n, la, lb, blocks = key
    plans = plan_2d(m, k, n, blocks)
    verdict = None
    if plans:
        rng = np.random.default_rng(m * 1000003 + k * 1009 + n)
        dt = np.dtype(char)
        a = _operand(rng, m, k, la, dt)
        b = _operand(rng, k, n, lb, dt)
        with blas_threads():                  # as in a worker, whoever asks
            whole = np.matmul(a, b)
            buf = np.empty_like(whole)
            # (other BLAS kernels for the blocks give other bits: those splits are dropped)
            same = [p for p in plans if _split(a, b, p).tobytes() == whole.tobytes()]
            if same:
                # Each split as it runs (blocks on the op's threads, sharing caches and memory
                # bandwidth), timed in turns with the single call (the machine's speed drifts):
                # the fastest, if it takes at most GAIN of the single call's time.
                times = _shortest([lambda: np.matmul(a, b, out=buf)]
                                  + [lambda p=p: _run_split(a, b, p, buf) for p in same])
                t_best, i_best = min((t, i) for i, t in enumerate(times[1:]))
                if t_best <= GAIN * times[0]:
                    verdict = same[i_best]
    with _LOCK:
        _VERDICTS[key] = verdict
    return verdict


GAIN = 0.8                # a split must take at most this much of one call's wall time


def _shortest(fns: List, reps: int = 3) -> List[float]:
    """The shortest of `reps` timings of each fn(), the fns timed in turns (each first called
    once to warm caches and BLAS buffers)."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def _operand(rng, rows: int, cols: int, layout: Tuple[str, int], dt) -> np.ndarray:
    """A random (rows, cols) array with the given BLAS layout and leading dimension."""
    kind, ld = layout
    if kind == "C":
        return rng.standard_normal((rows, ld)).astype(dt)[:, :cols]
    return rng.standard_normal((cols, ld)).astype(dt)[:, :rows].T


def _run_split(a: np.ndarray, b: np.ndarray, plan: Plan, out: np.ndarray) -> None:
    """The split product into `out`, its blocks on the op's threads."""
    _blocks_into(a, b, plan, out, run_blocks)


def _split(a: np.ndarray, b: np.ndarray, plan: Plan) -> np.ndarray:
    """The split product computed block after block on this thread (the bits check)."""
    return _blocks_into(a, b, plan, np.empty((a.shape[0], b.shape[1]), a.dtype), _one_by_one)


def _blocks_into(a: np.ndarray, b: np.ndarray, plan: Plan, out: np.ndarray, run) -> np.ndarray:
    axis, ranges = plan

    def block(i: int) -> None:
        lo, hi = ranges[i]
        if axis == 0:
            np.matmul(a[lo:hi], b, out=out[lo:hi])
        else:
            np.matmul(a, b[:, lo:hi], out=out[:, lo:hi])
    run(len(ranges), block)
    return out


def _one_by_one(n: int, fn) -> None:
    for i in range(n):
        fn(i)
