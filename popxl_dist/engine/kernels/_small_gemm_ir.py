"""LLVM IR of the thin-product kernels of `_small_gemm` (text, compiled there by llvmlite):
the "gemm" kernels (`kernel`), the "dot" kernels (`dot_kernel`), and drivers that call them on
a range of output columns, given pointers (`driver`, `dot_driver`) or NumPy arrays
(`object_driver`, `dot_object_driver`).

One "gemm" function per (rows, column vectors, masked) computes C = A @ B in blocks of that many rows
and vectors of columns:

    void f(float *A, i64 sam, i64 sak, float *B, i64 ldb, float *C, i64 ldc,
           i64 M, i64 K, i64 N, i64 KB)

A[m, k] is at `A + m*sam + k*sak` (any strides), B[k, n] at `B + k*ldb + n`, C[m, n] at
`C + m*ldc + n`; M rows (a multiple of the kernel's rows), N columns (unmasked: a multiple of
the block width). Every element is

    c = a[m, 0] * b[0, n];  c = fma(a[m, k], b[k, n], c)  for k = 1 .. K-1

in that order, whichever block, vector lane, CPU or thread computes it. K is walked in panels of
KB rows (a panel of B stays in cache across the row and column blocks); between panels a partial
sum is parked in C, which, being float32 already, changes no bit.
"""
from __future__ import annotations

from typing import List

W = 16                   # lanes per vector: <16 x float> (LLVM splits it where the CPU has 8)
VT = f"<{W} x float>"
MT = f"<{W} x i1>"

DECLARATIONS = f"""
declare {VT} @llvm.fma.v{W}f32({VT}, {VT}, {VT})
declare {VT} @llvm.masked.load.v{W}f32.p0(ptr, i32, {MT}, {VT})
declare void @llvm.masked.store.v{W}f32.p0({VT}, ptr, i32, {MT})
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
"""
PREFETCH = 64            # B's next lines two column blocks ahead, in the row being read (-10-15%)


def name(rows: int, vectors: int, masked: bool) -> str:
    return f"popxl_sgemm_{rows}x{vectors}{'m' if masked else ''}"


def kernel(rows: int, vectors: int, masked: bool) -> str:
    """The IR of one kernel (`masked`: the last column block may be partial; one vector)."""
    assert not masked or vectors == 1
    cells = [(m, v) for m in range(rows) for v in range(vectors)]
    iota = "<" + ", ".join(f"i64 {i}" for i in range(W)) + ">"
    L: List[str] = []
    e = L.append

    def vector_load(dst: str, ptr: str) -> None:
        """%dst = the vector at ptr (masked: the lanes below N, others zero)."""
        if masked:
            e(f"  %{dst} = call {VT} @llvm.masked.load.v{W}f32.p0(ptr {ptr}, i32 4, "
              f"{MT} %mask, {VT} zeroinitializer)")
        else:
            e(f"  %{dst} = load {VT}, ptr {ptr}, align 4")

    def vector_store(value: str, ptr: str) -> None:
        if masked:
            e(f"  call void @llvm.masked.store.v{W}f32.p0({VT} {value}, ptr {ptr}, i32 4, "
              f"{MT} %mask)")
        else:
            e(f"  store {VT} {value}, ptr {ptr}, align 4")

    def load_b(dst: str, row: str, v: int) -> None:
        """dst = B[row, j + v*W : ...]."""
        e(f"  %{dst}.o = add i64 {row}, %j{'' if v == 0 else f'.{v}'}")
        e(f"  %{dst}.p = getelementptr float, ptr %B, i64 %{dst}.o")
        vector_load(dst, f"%{dst}.p")

    def splat_a(dst: str, m: int, col: str) -> None:
        """dst = A[m, k] in every lane (col = k * sak)."""
        e(f"  %{dst}.r = mul i64 {m}, %sam")
        e(f"  %{dst}.o = add i64 %{dst}.r, {col}")
        e(f"  %{dst}.p = getelementptr float, ptr %Ar, i64 %{dst}.o")
        e(f"  %{dst}.s = load float, ptr %{dst}.p, align 4")
        e(f"  %{dst}.i = insertelement {VT} poison, float %{dst}.s, i32 0")
        e(f"  %{dst} = shufflevector {VT} %{dst}.i, {VT} poison, <{W} x i32> zeroinitializer")

    def c_ptr(dst: str, m: int, v: int) -> None:
        e(f"  %{dst}.r = mul i64 {m}, %ldc")
        e(f"  %{dst}.o = add i64 %{dst}.r, %j{'' if v == 0 else f'.{v}'}")
        e(f"  %{dst} = getelementptr float, ptr %Cr, i64 %{dst}.o")

    e(f"define void @{name(rows, vectors, masked)}(ptr noalias %A, i64 %sam, i64 %sak, "
      "ptr noalias %B, i64 %ldb, ptr noalias %C, i64 %ldc, i64 %M, i64 %K, i64 %N, i64 %KB) "
      "nounwind {")
    e("entry:")
    e("  %no.rows = icmp eq i64 %M, 0")
    e("  %no.cols = icmp eq i64 %N, 0")
    e("  %empty = or i1 %no.rows, %no.cols")
    e("  br i1 %empty, label %exit, label %panel")
    # for k0 in range(0, K, KB): k1 = min(k0 + KB, K)
    e("panel:")
    e("  %k0 = phi i64 [0, %entry], [%k1, %panel.end]")
    e("  %k1.a = add i64 %k0, %KB")
    e("  %k1.lt = icmp ult i64 %k1.a, %K")
    e("  %k1 = select i1 %k1.lt, i64 %k1.a, i64 %K")
    e("  %first = icmp eq i64 %k0, 0")
    e("  br label %row")
    # for m0 in range(0, M, rows)
    e("row:")
    e("  %m0 = phi i64 [0, %panel], [%m0.next, %row.end]")
    e("  %ar.o = mul i64 %m0, %sam")
    e("  %Ar = getelementptr float, ptr %A, i64 %ar.o")
    e("  %cr.o = mul i64 %m0, %ldc")
    e("  %Cr = getelementptr float, ptr %C, i64 %cr.o")
    e("  br label %col")
    # for j in range(0, N, vectors * W)
    e("col:")
    e("  %j = phi i64 [0, %row], [%j.next, %col.end]")
    for v in range(1, vectors):
        e(f"  %j.{v} = add i64 %j, {v * W}")
    if masked:
        e(f"  %jv.i = insertelement <{W} x i64> poison, i64 %j, i32 0")
        e(f"  %jv = shufflevector <{W} x i64> %jv.i, <{W} x i64> poison, "
          f"<{W} x i32> zeroinitializer")
        e(f"  %lanes = add <{W} x i64> %jv, {iota}")
        e(f"  %nv.i = insertelement <{W} x i64> poison, i64 %N, i32 0")
        e(f"  %nv = shufflevector <{W} x i64> %nv.i, <{W} x i64> poison, "
          f"<{W} x i32> zeroinitializer")
        e(f"  %mask = icmp ult <{W} x i64> %lanes, %nv")
    e("  br i1 %first, label %init.product, label %init.parked")
    # the first panel starts from the products at k = 0
    e("init.product:")
    for v in range(vectors):
        load_b(f"b0.{v}", "0", v)
    for m in range(rows):
        splat_a(f"a0.{m}", m, "0")
    for m, v in cells:
        e(f"  %p.{m}.{v} = fmul {VT} %a0.{m}, %b0.{v}")
    e("  br label %panel.start")
    # later panels continue from the partial sums parked in C
    e("init.parked:")
    for m, v in cells:
        c_ptr(f"lp.{m}.{v}", m, v)
        vector_load(f"l.{m}.{v}", f"%lp.{m}.{v}")
    e("  br label %panel.start")
    e("panel.start:")
    for m, v in cells:
        e(f"  %s.{m}.{v} = phi {VT} [%p.{m}.{v}, %init.product], [%l.{m}.{v}, %init.parked]")
    e("  %ks = phi i64 [1, %init.product], [%k0, %init.parked]")
    e("  %any = icmp ult i64 %ks, %k1")
    e("  br i1 %any, label %k.loop, label %k.done")
    e("k.loop:")
    e("  %k = phi i64 [%ks, %panel.start], [%k.next, %k.loop]")
    for m, v in cells:
        e(f"  %c.{m}.{v} = phi {VT} [%s.{m}.{v}, %panel.start], [%cn.{m}.{v}, %k.loop]")
    e("  %brow = mul i64 %k, %ldb")
    for v in range(vectors):
        load_b(f"b.{v}", "%brow", v)
    if not masked:
        e("  %pf.o = add i64 %brow, %j")
        e(f"  %pf.o2 = add i64 %pf.o, {PREFETCH}")
        e("  %pf.p = getelementptr float, ptr %B, i64 %pf.o2")
        e("  call void @llvm.prefetch.p0(ptr %pf.p, i32 0, i32 3, i32 1)")
        e(f"  %pf.o3 = add i64 %pf.o2, {W}")
        e("  %pf.p3 = getelementptr float, ptr %B, i64 %pf.o3")
        e("  call void @llvm.prefetch.p0(ptr %pf.p3, i32 0, i32 3, i32 1)")
    e("  %acol = mul i64 %k, %sak")
    for m in range(rows):
        splat_a(f"a.{m}", m, "%acol")
        for v in range(vectors):
            e(f"  %cn.{m}.{v} = call {VT} @llvm.fma.v{W}f32({VT} %a.{m}, {VT} %b.{v}, "
              f"{VT} %c.{m}.{v})")
    e("  %k.next = add i64 %k, 1")
    e("  %k.more = icmp ult i64 %k.next, %k1")
    e("  br i1 %k.more, label %k.loop, label %k.done")
    e("k.done:")
    for m, v in cells:
        e(f"  %f.{m}.{v} = phi {VT} [%s.{m}.{v}, %panel.start], [%cn.{m}.{v}, %k.loop]")
    for m, v in cells:
        c_ptr(f"sp.{m}.{v}", m, v)
        vector_store(f"%f.{m}.{v}", f"%sp.{m}.{v}")
    e("  br label %col.end")
    e("col.end:")
    e(f"  %j.next = add i64 %j, {vectors * W}")
    e("  %j.more = icmp ult i64 %j.next, %N")
    e("  br i1 %j.more, label %col, label %row.end")
    e("row.end:")
    e(f"  %m0.next = add i64 %m0, {rows}")
    e("  %m0.more = icmp ult i64 %m0.next, %M")
    e("  br i1 %m0.more, label %row, label %panel.end")
    e("panel.end:")
    e("  %k.left = icmp ult i64 %k1, %K")
    e("  br i1 %k.left, label %panel, label %exit")
    e("exit:")
    e("  ret void")
    e("}")
    return "\n".join(L)


ROW_BLOCKS = (8, 4, 2, 1)
COL_BLOCK = 2 * W           # columns per unmasked block (two vectors)
_RAW_ARGS = ("ptr %A, i64 %sam, i64 %sak, ptr %B, i64 %ldb, ptr %C, i64 %ldc, i64 %M, i64 %K, "
             "i64 %lo, i64 %hi, i64 %KB")


def _row_groups(e, row_stride: str):
    """For each block height of ROW_BLOCKS, in order: emit %count.i (the rows left from %r0.i,
    rounded down to whole blocks), %Ar.i (A at row %r0.i, rows `row_stride` apart), %co.i and
    %Cr.i (C's offset and %Cj at that row), yield (i, height) for the caller's calls, then
    advance %r0.{i + 1} past the counted rows."""
    e("  %r0.0 = add i64 0, 0")
    for i, rows in enumerate(ROW_BLOCKS):
        r0 = f"%r0.{i}"
        e(f"  %left.{i} = sub i64 %M, {r0}")
        e(f"  %count.{i}.q = udiv i64 %left.{i}, {rows}")
        e(f"  %count.{i} = mul i64 %count.{i}.q, {rows}")
        e(f"  %ao.{i} = mul i64 {r0}, {row_stride}")
        e(f"  %Ar.{i} = getelementptr float, ptr %A, i64 %ao.{i}")
        e(f"  %co.{i} = mul i64 {r0}, %ldc")
        e(f"  %Cr.{i} = getelementptr float, ptr %Cj, i64 %co.{i}")
        yield i, rows
        e(f"  %r0.{i + 1} = add i64 {r0}, %count.{i}")


def driver() -> str:
    """`popxl_sgemm_raw(A, sam, sak, B, ldb, C, ldc, M, K, lo, hi, KB)`: columns lo..hi of C:
    the columns before B's first 64-byte boundary (masked: a vector load across two cache
    lines costs up to twice one within; only when B's row stride keeps the rows aligned), full
    blocks, then the masked rest; rows in blocks of 8, then 4, 2, 1."""
    L: List[str] = []
    e = L.append
    e(f"define void @popxl_sgemm_raw({_RAW_ARGS}) nounwind {{")
    e("entry:")
    e("  %Bj = getelementptr float, ptr %B, i64 %lo")
    e("  %Cj = getelementptr float, ptr %C, i64 %lo")
    e("  %width = sub i64 %hi, %lo")
    e("  %baddr = ptrtoint ptr %Bj to i64")
    e("  %mis.n = sub i64 0, %baddr")
    e("  %mis = and i64 %mis.n, 63")
    e("  %head.a = lshr i64 %mis, 2")
    e("  %ldb.bytes = shl i64 %ldb, 2")
    e("  %ldb.mis = and i64 %ldb.bytes, 63")
    e("  %rows.aligned = icmp eq i64 %ldb.mis, 0")
    e("  %head.b = select i1 %rows.aligned, i64 %head.a, i64 0")
    e("  %head.lt = icmp ult i64 %head.b, %width")
    e("  %head = select i1 %head.lt, i64 %head.b, i64 %width")
    e("  %rest = sub i64 %width, %head")
    e(f"  %full = and i64 %rest, {-COL_BLOCK}")
    e("  %tail = sub i64 %rest, %full")
    e("  %tail.at = add i64 %head, %full")
    for i, rows in _row_groups(e, "%sam"):
        for part, (at, width, masked) in enumerate((("0", "%head", True),
                                                   ("%head", "%full", False),
                                                   ("%tail.at", "%tail", True))):
            e(f"  %Bp.{i}.{part} = getelementptr float, ptr %Bj, i64 {at}")
            e(f"  %Cp.{i}.{part} = getelementptr float, ptr %Cr.{i}, i64 {at}")
            fn = name(rows, 1 if masked else COL_BLOCK // W, masked)
            e(f"  call void @{fn}(ptr %Ar.{i}, i64 %sam, i64 %sak, ptr %Bp.{i}.{part}, "
              f"i64 %ldb, ptr %Cp.{i}.{part}, i64 %ldc, i64 %count.{i}, i64 %K, i64 {width}, "
              "i64 %KB)")
    e("  ret void")
    e("}")
    return "\n".join(L)


def _array_fields(e, x: str, data: int, strides: int, axes) -> None:
    """Emit %{x}.data and %{x}.s{axis} (the stride in floats) for each axis of the array
    object %{x}o, read at these byte offsets of NumPy's array struct."""
    e(f"  %{x}.dp = getelementptr i8, ptr %{x}o, i64 {data}")
    e(f"  %{x}.data = load ptr, ptr %{x}.dp")
    e(f"  %{x}.sp = getelementptr i8, ptr %{x}o, i64 {strides}")
    e(f"  %{x}.str = load ptr, ptr %{x}.sp")
    for axis in axes:
        e(f"  %{x}.s{axis}p = getelementptr i64, ptr %{x}.str, i64 {axis}")
        e(f"  %{x}.s{axis}b = load i64, ptr %{x}.s{axis}p")
        e(f"  %{x}.s{axis} = sdiv exact i64 %{x}.s{axis}b, 4")


def _object_driver(fn: str, raw: str, args: str, fields, dims: int, data: int,
                   strides: int, extra: str = "") -> str:
    """`fn(a, b, c, lo, hi[, KB])` calling `raw(args)` on the arrays' fields and A's shape
    (%M, %K)."""
    L: List[str] = []
    e = L.append
    e(f"define void @{fn}(ptr %ao, ptr %bo, ptr %co, i64 %lo, i64 %hi{extra}) nounwind {{")
    e("entry:")
    for x, axes in fields:
        _array_fields(e, x, data, strides, axes)
    e(f"  %a.shp = getelementptr i8, ptr %ao, i64 {dims}")
    e("  %a.shape = load ptr, ptr %a.shp")
    e("  %M = load i64, ptr %a.shape")
    e("  %Kp = getelementptr i64, ptr %a.shape, i64 1")
    e("  %K = load i64, ptr %Kp")
    e(f"  call void @{raw}({args})")
    e("  ret void")
    e("}")
    return "\n".join(L)


def object_driver(data: int, dims: int, strides: int) -> str:
    """`popxl_sgemm_obj(a, b, c, lo, hi, KB)`: `popxl_sgemm_raw` on three 2-D float32 NumPy
    arrays passed as objects, their data pointers, shapes and strides read at these byte
    offsets of NumPy's array struct (checked by the caller): no conversions in Python."""
    return _object_driver(
        "popxl_sgemm_obj", "popxl_sgemm_raw",
        "ptr %a.data, i64 %a.s0, i64 %a.s1, ptr %b.data, i64 %b.s0, ptr %c.data, i64 %c.s0, "
        "i64 %M, i64 %K, i64 %lo, i64 %hi, i64 %KB",
        (("a", (0, 1)), ("b", (0,)), ("c", (0,))), dims, data, strides, ", i64 %KB")


# --- rows times a transposed matrix: dot products ---------------------------------------------
def dot_name(rows: int, wrows: int) -> str:
    return f"popxl_sdot_{rows}x{wrows}"


def dot_kernel(rows: int, wrows: int) -> str:
    """C[i, j] = dot(A[i, :], Wt[j, :]) for `rows` rows of A and `wrows` rows of Wt at a time
    (both rows contiguous), as

        s = a[i, l] * w[j, l];  s = fma(a[i, l + 16 t], w[j, l + 16 t], s)   for each lane l
        c = ((s0 + s8) + (s4 + s12)) + ... (a fixed tree over the 16 lanes: `_tree`)

    the lanes past K masked to zero, whichever block computes it:

        void f(float *A, i64 lda, float *Wt, i64 ldw, float *C, i64 ldc, i64 M, i64 K, i64 N)

    for i in 0..M-1 (M a multiple of rows), j in 0..N-1 (N a multiple of wrows)."""
    cells = [(i, w) for i in range(rows) for w in range(wrows)]
    iota = "<" + ", ".join(f"i64 {i}" for i in range(W)) + ">"
    L: List[str] = []
    e = L.append

    def load(dst: str, base: str, ld: str, row: str, col: str, mask: str) -> None:
        e(f"  %{dst}.r = mul i64 {row}, %{ld}")
        e(f"  %{dst}.o = add i64 %{dst}.r, {col}")
        e(f"  %{dst}.p = getelementptr float, ptr %{base}, i64 %{dst}.o")
        e(f"  %{dst} = call {VT} @llvm.masked.load.v{W}f32.p0(ptr %{dst}.p, i32 4, {MT} {mask}, "
          f"{VT} zeroinitializer)")

    e(f"define void @{dot_name(rows, wrows)}(ptr noalias %A, i64 %lda, ptr noalias %Wt, "
      "i64 %ldw, ptr noalias %C, i64 %ldc, i64 %M, i64 %K, i64 %N) nounwind {")
    e("entry:")
    e("  %no.rows = icmp eq i64 %M, 0")
    e("  %no.cols = icmp eq i64 %N, 0")
    e("  %empty = or i1 %no.rows, %no.cols")
    e(f"  %kv.i = insertelement <{W} x i64> poison, i64 %K, i32 0")
    e(f"  %kv = shufflevector <{W} x i64> %kv.i, <{W} x i64> poison, <{W} x i32> zeroinitializer")
    e("  br i1 %empty, label %exit, label %col")
    e("col:")
    e("  %j = phi i64 [0, %entry], [%j.next, %col.end]")
    for w in range(wrows):
        e(f"  %j.{w} = add i64 %j, {w}")
    e("  br label %row")
    e("row:")
    e("  %i = phi i64 [0, %col], [%i.next, %row.end]")
    for i in range(rows):
        e(f"  %i.{i} = add i64 %i, {i}")
    # the first lanes' products, then fused multiply-adds
    e("  %mask0 = icmp ult <{W} x i64> {iota}, %kv".replace("{W}", str(W)).replace("{iota}", iota))
    for w in range(wrows):
        load(f"w0.{w}", "Wt", "ldw", f"%j.{w}", "0", "%mask0")
    for i in range(rows):
        load(f"a0.{i}", "A", "lda", f"%i.{i}", "0", "%mask0")
        for w in range(wrows):
            e(f"  %p.{i}.{w} = fmul {VT} %a0.{i}, %w0.{w}")
    e(f"  %more0 = icmp ult i64 {W}, %K")
    e("  br i1 %more0, label %k.loop, label %k.done")
    e("k.loop:")
    e(f"  %k = phi i64 [{W}, %row], [%k.next, %k.loop]")
    for i, w in cells:
        e(f"  %s.{i}.{w} = phi {VT} [%p.{i}.{w}, %row], [%sn.{i}.{w}, %k.loop]")
    e(f"  %kl.i = insertelement <{W} x i64> poison, i64 %k, i32 0")
    e(f"  %kl = shufflevector <{W} x i64> %kl.i, <{W} x i64> poison, <{W} x i32> zeroinitializer")
    e(f"  %lanes = add <{W} x i64> %kl, {iota}")
    e(f"  %mask = icmp ult <{W} x i64> %lanes, %kv")
    for w in range(wrows):
        load(f"w.{w}", "Wt", "ldw", f"%j.{w}", "%k", "%mask")
    for i in range(rows):
        load(f"a.{i}", "A", "lda", f"%i.{i}", "%k", "%mask")
        for w in range(wrows):
            e(f"  %sn.{i}.{w} = call {VT} @llvm.fma.v{W}f32({VT} %a.{i}, {VT} %w.{w}, "
              f"{VT} %s.{i}.{w})")
    e(f"  %k.next = add i64 %k, {W}")
    e("  %k.more = icmp ult i64 %k.next, %K")
    e("  br i1 %k.more, label %k.loop, label %k.done")
    e("k.done:")
    for i, w in cells:
        e(f"  %f.{i}.{w} = phi {VT} [%p.{i}.{w}, %row], [%sn.{i}.{w}, %k.loop]")
    for i, w in cells:
        total = _tree(e, f"t.{i}.{w}", f"%f.{i}.{w}")
        e(f"  %co.{i}.{w}.r = mul i64 %i.{i}, %ldc")
        e(f"  %co.{i}.{w} = add i64 %co.{i}.{w}.r, %j.{w}")
        e(f"  %cp.{i}.{w} = getelementptr float, ptr %C, i64 %co.{i}.{w}")
        e(f"  store float {total}, ptr %cp.{i}.{w}, align 4")
    e("  br label %row.end")
    e("row.end:")
    e(f"  %i.next = add i64 %i, {rows}")
    e("  %i.more = icmp ult i64 %i.next, %M")
    e("  br i1 %i.more, label %row, label %col.end")
    e("col.end:")
    e(f"  %j.next = add i64 %j, {wrows}")
    e("  %j.more = icmp ult i64 %j.next, %N")
    e("  br i1 %j.more, label %col, label %exit")
    e("exit:")
    e("  ret void")
    e("}")
    return "\n".join(L)


def _tree(e, tag: str, v: str) -> str:
    """Emit the sum of the 16 lanes of vector v as a fixed tree (halves added lane-wise:
    lane l + lane l + 8, then + 4, + 2, + 1); returns the scalar's name."""
    width = W
    cur = v
    step = 0
    while width > 1:
        half = width // 2
        lo = f"<{half} x i32> <" + ", ".join(f"i32 {i}" for i in range(half)) + ">"
        hi = f"<{half} x i32> <" + ", ".join(f"i32 {i + half}" for i in range(half)) + ">"
        src_t = f"<{width} x float>"
        e(f"  %{tag}.l{step} = shufflevector {src_t} {cur}, {src_t} poison, {lo}")
        e(f"  %{tag}.h{step} = shufflevector {src_t} {cur}, {src_t} poison, {hi}")
        e(f"  %{tag}.s{step} = fadd <{half} x float> %{tag}.l{step}, %{tag}.h{step}")
        cur = f"%{tag}.s{step}"
        width = half
        step += 1
    e(f"  %{tag} = extractelement <1 x float> {cur}, i32 0")
    return f"%{tag}"


def dot_driver() -> str:
    """`popxl_sdot_raw(A, lda, Wt, ldw, C, ldc, M, K, lo, hi)`: columns lo..hi of C = A @ Wt.T,
    two rows of Wt at a time (then one), rows of A in blocks of ROW_BLOCKS."""
    L: List[str] = []
    e = L.append
    e("define void @popxl_sdot_raw(ptr %A, i64 %lda, ptr %Wt, i64 %ldw, ptr %C, i64 %ldc, "
      "i64 %M, i64 %K, i64 %lo, i64 %hi) nounwind {")
    e("entry:")
    e("  %wo = mul i64 %lo, %ldw")
    e("  %Wj = getelementptr float, ptr %Wt, i64 %wo")
    e("  %Cj = getelementptr float, ptr %C, i64 %lo")
    e("  %width = sub i64 %hi, %lo")
    e("  %pairs = and i64 %width, -2")
    e("  %odd = sub i64 %width, %pairs")
    e("  %wo1 = mul i64 %pairs, %ldw")
    e("  %W1 = getelementptr float, ptr %Wj, i64 %wo1")
    e("  %C1 = getelementptr float, ptr %Cj, i64 %pairs")
    for n, rows in _row_groups(e, "%lda"):
        e(f"  %Cr1.{n} = getelementptr float, ptr %C1, i64 %co.{n}")
        e(f"  call void @{dot_name(rows, 2)}(ptr %Ar.{n}, i64 %lda, ptr %Wj, i64 %ldw, "
          f"ptr %Cr.{n}, i64 %ldc, i64 %count.{n}, i64 %K, i64 %pairs)")
        e(f"  call void @{dot_name(rows, 1)}(ptr %Ar.{n}, i64 %lda, ptr %W1, i64 %ldw, "
          f"ptr %Cr1.{n}, i64 %ldc, i64 %count.{n}, i64 %K, i64 %odd)")
    e("  ret void")
    e("}")
    return "\n".join(L)


def dot_object_driver(data: int, dims: int, strides: int) -> str:
    """`popxl_sdot_obj(a, b, c, lo, hi)`: `popxl_sdot_raw` on NumPy arrays passed as objects:
    a (M, K) with contiguous rows, b = Wt.T (K, N) with contiguous columns, c (M, N) with
    contiguous rows (see `object_driver`)."""
    return _object_driver(
        "popxl_sdot_obj", "popxl_sdot_raw",
        "ptr %a.data, i64 %a.s0, ptr %b.data, i64 %b.s1, ptr %c.data, i64 %c.s0, i64 %M, "
        "i64 %K, i64 %lo, i64 %hi", (("a", (0,)), ("b", (1,)), ("c", (0,))), dims, data, strides)
