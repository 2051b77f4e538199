"""float32 products with few rows or a short K, by compiled kernels of our own.

OpenBLAS is slow where one operand is thin: (8, 784) @ (784, 512) takes 2x as long as these
kernels, (784, 8) @ (8, 512) 1.5x, (8, 512) @ (512, 784).T 1.4x (B read from L3, as in a
training step; measured in `docs/threads.md`). A linear layer at a small batch is all such
products: its forward pass, its weight gradient and its input gradient.

"gemm": each output element is one fused multiply-add chain over K in order,
`c = a0*b0; c = fma(ak, bk, c)`. "dot" (a few rows times a transposed matrix): 16 lane sums of
such chains over every 16th element of K, added as a fixed tree. Either way an element's
result does not depend on which row or column block, vector lane or thread computes it (see
`_small_gemm_ir`), nor on the CPU: the operations are IEEE single roundings. So these products
give the same bits for any thread count, unlike BLAS, whose bits depend on its kernel and the
CPU. They are not `np.matmul`'s bits: which products take this path depends on the shapes and
layouts only (`handles`), never on threads or the machine.

The kernels are LLVM IR compiled by llvmlite (a dependency) for the host CPU, once per machine:
the machine code is kept in `$XDG_CACHE_HOME/popxl-dist/kernels` (default `~/.cache/...`), keyed
by the IR, the CPU and the LLVM version (compiling takes 0.5-1 s; loading, milliseconds).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from typing import Callable, Dict, Optional

import numpy as np

from . import _small_gemm_ir as ir
from ..parallel import run_blocks
from ._util import fp_checks_on, scratch

__all__ = ["handles", "small_gemm", "THIN"]

THIN = 16                 # at most this many rows (M) or, with N >= a vector, this short a K
DOT_ROWS = 8              # (16 rows: 1.1x OpenBLAS's swapped product; 8: 0.7x)
MIN_MACS = 1 << 18        # smaller products: BLAS (its small-matrix kernels, fast in cache, and
                          # no ctypes call: ~4 us of overhead here)
PACK_MAX = 1 << 16        # a B not row-contiguous is packed when it has at most this many values
PANEL = 64                # K rows per panel (64 x 512 floats of B: 128 KiB, in L2)
COL_BLOCK = ir.COL_BLOCK
_F32 = np.dtype(np.float32)
_ITEM = 4


def handles(a: np.ndarray, b: np.ndarray) -> Optional[str]:
    """Which kernel computes `a @ b` (2-D) here, or None: float32 with at least MIN_MACS
    multiply-adds and
    "dot": at most DOT_ROWS rows of A, A's rows contiguous, B the transpose of a matrix with
    contiguous rows (`dy @ w.T`);
    "gemm": at most THIN rows, or K at most THIN with at least a vector of columns; B with
    contiguous rows, or small enough to pack."""
    if a.dtype != _F32 or b.dtype != _F32 or a.ndim != 2 or b.ndim != 2:
        return None
    m, k = a.shape
    k2, n = b.shape
    if k != k2 or k == 0 or m * k * n < MIN_MACS:
        return None
    sa0, sa1 = a.strides
    sb0, sb1 = b.strides
    if sa0 % _ITEM or sa1 % _ITEM or sb0 % _ITEM or sb1 % _ITEM:
        return None
    rows_b = sb1 == _ITEM
    if m <= DOT_ROWS and sa1 == _ITEM and sb0 == _ITEM and not rows_b:
        return "dot"
    if m <= THIN or (k <= THIN and n >= ir.W):
        return "gemm" if rows_b or k * n <= PACK_MAX else None
    return None


def small_gemm(a: np.ndarray, b: np.ndarray, kind: str, out: Optional[np.ndarray] = None,
               threads: int = 1) -> np.ndarray:
    """`a @ b` by the kernel `handles` chose (`kind`), into `out` (a float32 (M, N) array, when
    given), in column blocks on `threads` threads (`parallel.run_blocks`).
    With floating-point checks on, NumPy's product is computed too, so that an overflow raises
    as NumPy raises it; the result is still this kernel's."""
    m, k = a.shape
    n = b.shape[1]
    res = out
    if out is None or out.strides[1] != _ITEM or out.strides[0] % _ITEM \
            or np.may_share_memory(out, a) or np.may_share_memory(out, b):
        res = np.empty((m, n), _F32)
    if kind == "gemm" and b.strides[1] != _ITEM:
        packed = scratch("small_gemm_b", k * n).reshape(k, n)
        np.copyto(packed, b)
        b = packed
    if fp_checks_on():
        np.matmul(a, b, out=scratch("small_gemm_check", m * n).reshape(m, n))
    product = (_COMPILED.get("fns") or _kernels())[kind]
    if threads < 2 or m * k * n < 2 * BLOCK_MACS:
        product(a, b, res, 0, n)
    else:
        spans = _column_spans(m, k, n, threads)
        run_blocks(len(spans), lambda i: product(a, b, res, *spans[i]))
    if res is not out and out is not None:
        np.copyto(out, res)
        return out
    return res


BLOCK_MACS = 1 << 18      # ~20 us: a thread's share smaller than that costs more than it gains


def _column_spans(m: int, k: int, n: int, threads: int):
    """One range of output columns per thread (multiples of COL_BLOCK wide, the last one the
    rest). One thread walks B's rows whole, panel after panel: column strips of B read row by
    row would cost 1.5x. (The bits do not depend on the split.)"""
    units = max(1, n // COL_BLOCK)
    count = int(max(1, min(units, threads, m * k * n // BLOCK_MACS)))
    starts = [COL_BLOCK * (units * i // count) for i in range(count)]
    return list(zip(starts, starts[1:] + [n]))


# --- compiling -------------------------------------------------------------------------------
_I64 = ctypes.c_int64
_RAW = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _I64, _I64, ctypes.c_void_p, _I64,
                        ctypes.c_void_p, _I64, _I64, _I64, _I64, _I64, _I64)
_OBJ = ctypes.CFUNCTYPE(None, ctypes.py_object, ctypes.py_object, ctypes.py_object, _I64, _I64,
                        _I64)
_DOT_RAW = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _I64, ctypes.c_void_p, _I64, ctypes.c_void_p,
                            _I64, _I64, _I64, _I64, _I64)
_DOT_OBJ = ctypes.CFUNCTYPE(None, ctypes.py_object, ctypes.py_object, ctypes.py_object, _I64,
                            _I64)
_COMPILED: Dict[str, object] = {}
_LOCK = threading.Lock()


def _kernels() -> Dict[str, Callable]:
    """{kind: `product(a, b, c, lo, hi)`: columns lo..hi of c = a @ b} (compiled on first
    use)."""
    fns = _COMPILED.get("fns")
    if fns is None:
        with _LOCK:
            fns = _COMPILED.get("fns")
            if fns is None:
                fns = _COMPILED["fns"] = _compile()
    return fns


def _array_offsets() -> Optional[tuple]:
    """Byte offsets of the data pointer, the shape pointer and the strides pointer in NumPy's
    array struct (`PyArrayObject_fields`: fixed by NumPy's ABI, found and checked here on live
    arrays), or None if they cannot be confirmed."""
    probes = [np.empty((3, 7), np.float32)[:, 1:], np.empty((5, 2), np.float32).T]
    word = ctypes.sizeof(ctypes.c_void_p)

    def at(obj, off):
        return ctypes.c_void_p.from_address(id(obj) + off).value

    for data in range(word, 8 * word, word):
        if all(at(x, data) == x.ctypes.data for x in probes):
            dims, strides = data + 2 * word, data + 3 * word     # after data and nd
            ok = all(
                [ctypes.c_int64.from_address(at(x, dims) + 8 * i).value for i in range(2)]
                == list(x.shape)
                and [ctypes.c_int64.from_address(at(x, strides) + 8 * i).value
                     for i in range(2)] == list(x.strides)
                for x in probes)
            return (data, dims, strides) if ok and word == 8 else None
    return None


def _compile() -> Dict[str, Callable]:
    import llvmlite
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    offsets = _array_offsets()
    source = "\n".join(
        [ir.DECLARATIONS]
        + [ir.kernel(rows, 1 if masked else ir.COL_BLOCK // ir.W, masked)
           for rows in ir.ROW_BLOCKS for masked in (False, True)]
        + [ir.dot_kernel(rows, wrows) for rows in ir.ROW_BLOCKS for wrows in (2, 1)]
        + [ir.driver(), ir.dot_driver()]
        + ([ir.object_driver(*offsets), ir.dot_object_driver(*offsets)] if offsets else []))
    cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=cpu, features=features, opt=3, codemodel="jitdefault")
    module = llvm.parse_assembly(source)
    module.verify()
    cache = _ObjectCache("\0".join([source, llvm.get_process_triple(), cpu, features,
                                    llvmlite.__version__, str(llvm.llvm_version_info)]))
    if cache.cached is None and hasattr(llvm, "create_pass_builder"):   # llvmlite >= 0.44
        passes = llvm.create_pass_builder(machine,
                                          llvm.create_pipeline_tuning_options(speed_level=3))
        passes.getModulePassManager().run(module, passes)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.set_object_cache(cache.store, cache.load)
    engine.finalize_object()
    _COMPILED["engine"] = engine          # the code lives as long as its engine
    address = engine.get_function_address
    if offsets:
        gemm = _OBJ(address("popxl_sgemm_obj"))
        dot = _DOT_OBJ(address("popxl_sdot_obj"))
        return {"gemm": lambda a, b, c, lo, hi: gemm(a, b, c, lo, hi, PANEL), "dot": dot}
    gemm_raw = _RAW(address("popxl_sgemm_raw"))
    dot_raw = _DOT_RAW(address("popxl_sdot_raw"))

    def gemm_ptrs(a, b, c, lo, hi):
        gemm_raw(a.ctypes.data, a.strides[0] // _ITEM, a.strides[1] // _ITEM, b.ctypes.data,
                 b.strides[0] // _ITEM, c.ctypes.data, c.strides[0] // _ITEM, a.shape[0],
                 a.shape[1], lo, hi, PANEL)

    def dot_ptrs(a, b, c, lo, hi):
        dot_raw(a.ctypes.data, a.strides[0] // _ITEM, b.ctypes.data, b.strides[1] // _ITEM,
                c.ctypes.data, c.strides[0] // _ITEM, a.shape[0], a.shape[1], lo, hi)
    return {"gemm": gemm_ptrs, "dot": dot_ptrs}


class _ObjectCache:
    """The compiled kernels' machine code on disk, named by a hash of everything it depends on,
    its own hash in front (a torn or foreign file is recompiled, never loaded). Unwritable:
    compiled in every process."""

    def __init__(self, key: str):
        home = os.path.expanduser("~")
        base = os.environ.get("XDG_CACHE_HOME") or (
            None if home.startswith("~") else os.path.join(home, ".cache"))
        name = hashlib.sha256(key.encode()).hexdigest()[:40]
        self.path = (os.path.join(base, "popxl-dist", "kernels", f"{name}.o")
                     if base else None)           # (no home directory: no cache)
        self.cached = self._read()

    def _read(self) -> Optional[bytes]:
        if self.path is None:
            return None
        try:
            with open(self.path, "rb") as f:
                blob = f.read()
        except OSError:
            return None
        digest, code = blob[:32], blob[32:]
        return code if code and hashlib.sha256(code).digest() == digest else None

    def load(self, module) -> Optional[bytes]:
        return self.cached

    def store(self, module, code: bytes) -> None:
        if self.cached is not None or self.path is None:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(hashlib.sha256(code).digest() + code)
            os.replace(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
