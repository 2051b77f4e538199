"""Self-checking float8 cases, run unchanged under every backend (see collective_cases.py).

    python fp8_cases.py
    popxl-run --backend mpi --workers 2 fp8_cases.py

On 1, 2 and 4 replicas: per-replica float8 stream data through pow2scale casts and
matmul_pow2scaled against grouped float8 weights, float8 variables updated on the device and
read back (one_per_group and all_replicas), written from the host, remote and RTS float8
variables, gradients of matmul_pow2scaled, and float8 variables of every kind gathered across
replicas and printed (upstream's float8 variable test). Prints `ok <case>` /
`FAIL <case>: <details>`; exit status 1 if any case failed.
"""
from __future__ import annotations

import contextlib
import io
import sys
import traceback

import numpy as np
import popxl
from popxl import ops
from popxl.fp8_utils import host_pow2scale_cast_from_fp8
from popxl.fp8_utils import host_pow2scale_cast_to_fp8 as enc

F8 = popxl.float8_143


def dec(data):
    """float32 values of float8 host data."""
    return host_pow2scale_cast_from_fp8(data, popxl.float32)


def _store(t):
    s = popxl.d2h_stream(t.shape, t.dtype, t.name)
    ops.host_store(s, t)
    return s


def case_matmul_and_variables(R: int) -> list:
    """Errors of the forward case on R replicas (empty when all match)."""
    rng = np.random.default_rng(R)
    groups = 2 if R > 1 else 1
    ir = popxl.Ir()
    ir.replication_factor = R
    with ir.main_graph:
        rg = ir.replica_grouping(group_size=R // groups)
        w_data = rng.normal(size=(groups, 4, 3)) if groups > 1 else rng.normal(size=(4, 3))
        w = popxl.variable(w_data, F8, "w", replica_grouping=rg, log2_scale=1)
        acc = popxl.variable(np.zeros((2, 4)), F8, "acc", retrieval_mode="all_replicas")
        buf = popxl.remote_buffer((3,), F8)
        r_data = rng.normal(size=3)
        rv = popxl.remote_variable(r_data, buf, 0, F8, "rv")
        rts_data = rng.normal(size=7)
        rts, _ = popxl.replica_sharded_variable(rts_data, F8, "rts") if R > 1 else (None, None)
        xs = popxl.h2d_stream((2, 4), popxl.float32, "x")
        x8 = ops.pow2scale_cast_to_fp8(ops.host_load(xs), 2, F8)
        ops.var_updates.copy_var_update_(acc, x8)
        y = ops.matmul_pow2scaled(x8, w, -3)
        rl = ops.pow2scale_cast_from_fp8(ops.remote_load(buf, 0), 0, popxl.float32)
        ys, rs = _store(y), _store(rl)
    x = rng.normal(size=(R, 2, 4)).astype(np.float32) if R > 1 else \
        rng.normal(size=(2, 4)).astype(np.float32)
    new_w = enc(rng.normal(size=w_data.shape), F8)
    errs = []
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run({xs: x})
        got = {t: v.copy() for t, v in   # copies: the results are views of the host buffers
               sess.get_tensors_data([w, acc, rv] + ([rts] if rts is not None else [])).items()}
        sess.write_variable_data(w, new_w)
        res2 = sess.run({xs: x})
    w_codes = enc(w_data, F8, 1)
    xr = x.reshape(R, 2, 4)
    for r in range(R):
        x_codes = enc(xr[r], F8, 2)
        for out, wc in ((res[ys], w_codes), (res2[ys], new_w)):
            wr = wc[rg.assignment[r]] if groups > 1 else wc
            want = (dec(x_codes).astype(np.float64) @ dec(wr) / 8).astype(np.float16)
            o = out.reshape(R, 2, 3)[r]
            if not np.allclose(o, want, rtol=1e-3, atol=1e-6):
                errs.append(f"replica {r}: matmul_pow2scaled differs")
        if not np.array_equal(got[acc].reshape(R, 2, 4)[r], x_codes):
            errs.append(f"replica {r}: all_replicas float8 variable differs")
        if not np.array_equal(res[rs].reshape(R, 3)[r], dec(enc(r_data, F8))):
            errs.append(f"replica {r}: remote float8 variable differs")
    if not np.array_equal(got[w], w_codes) or not np.array_equal(got[rv], enc(r_data, F8)):
        errs.append("grouped / remote float8 weights read back wrong")
    if rts is not None and not np.array_equal(got[rts], enc(rts_data, F8)):
        errs.append("RTS float8 variable read back wrong")
    return errs


def case_grads(R: int) -> list:
    """matmul_pow2scaled gradients on every replica against NumPy."""
    rng = np.random.default_rng(10 + R)
    ir = popxl.Ir()
    ir.replication_factor = R
    with ir.main_graph:
        g = ir.create_graph(lambda a, b: ops.matmul_pow2scaled(a, b, 1),
                            popxl.TensorSpec((3, 4), F8), popxl.TensorSpec((4, 2), F8))
        bwd = popxl.transforms.autodiff(g)
        a_s, b_s = popxl.h2d_stream((3, 4), F8, "a"), popxl.h2d_stream((4, 2), F8, "b")
        dy_s = popxl.h2d_stream((3, 2), popxl.float16, "dy")
        info = ops.call_with_info(g, ops.host_load(a_s), ops.host_load(b_s))
        da, db = ops.call(bwd.graph, ops.host_load(dy_s), inputs_dict=bwd.inputs_dict(info))
        das, dbs = _store(da), _store(db)
    lead = (R,) if R > 1 else ()
    a = enc(rng.normal(size=lead + (3, 4)), F8)
    b = enc(rng.normal(size=lead + (4, 2)), F8)
    dy = rng.normal(size=lead + (3, 2)).astype(np.float16)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run({a_s: a, b_s: b, dy_s: dy})
    errs = []
    for r in range(R):
        ar, br, dr = (v.reshape((R,) + v.shape[len(lead):])[r] for v in (a, b, dy))
        want_da = enc(dr.astype(np.float64) @ dec(br).T * 2, F8)
        want_db = enc(dec(ar).T.astype(np.float64) @ dr * 2, F8)
        got_da = res[das].reshape(R, 3, 4)[r]
        got_db = res[dbs].reshape(R, 4, 2)[r]
        for name, got, want in (("da", got_da, want_da), ("db", got_db, want_db)):
            if np.mean(got == want) < 0.9 or not np.allclose(dec(got), dec(want), rtol=0.25):
                errs.append(f"replica {r}: {name} differs")
    return errs


def case_gathered_variables(R: int) -> list:
    """float8 variables, remote variables and (remote) RTS variables, loaded, all-gathered
    and printed on R replicas; read back and rewritten from the host. The printed values are
    the codes (float8 tensors are bytes on the IPU)."""
    if R == 1:
        return []
    errs = []
    second = enc(np.array([3.0, 4.0]), F8, 1)
    for kind in ("variable", "remote", "rts", "remote_rts"):
        ir = popxl.Ir(replication=R)
        with ir.main_graph, popxl.in_sequence():
            shape = (R,)
            data = np.resize([1.0, 2.0], shape)
            if kind == "variable":
                v = popxl.variable(data, F8, log2_scale=1)
                on_device = v
            elif kind == "remote":
                buf = popxl.remote_buffer(shape, F8, 1)
                v = popxl.remote_variable(data, buf, 0, F8, log2_scale=1)
                on_device = ops.remote_load(buf, 0)
            elif kind == "rts":
                v, shard = popxl.replica_sharded_variable(data, F8, log2_scale=1)
                on_device = ops.collectives.replicated_all_gather(shard)
            else:
                buf = popxl.replica_sharded_buffer(shape, F8)
                v = popxl.remote_replica_sharded_variable(data, buf, 0, F8, log2_scale=1)
                on_device = ops.collectives.replicated_all_gather(ops.remote_load(buf, 0))
            ops.print_tensor(on_device, "f8")
            out = _store(on_device)
        want = enc(data, F8, 1)
        printed = io.StringIO()
        with popxl.Session(ir, "ipu_hw") as sess, contextlib.redirect_stderr(printed):
            res = sess.run()
            if not np.array_equal(sess.get_tensor_data(v), want):
                errs.append(f"{kind}: get_tensor_data differs")
            new = np.resize(second, shape)
            sess.write_variable_data(v, new)
            res2 = sess.run()
            if not np.array_equal(sess.get_tensor_data(v), new):
                errs.append(f"{kind}: written data reads back wrong")
        for r, got in ((res, want), (res2, new)):
            if not np.array_equal(r[out], np.broadcast_to(got, (R,) + shape)):
                errs.append(f"{kind}: the gathered / loaded values differ")
        lines = [ln for ln in printed.getvalue().splitlines() if ln.startswith("f8:")]
        wants = [f"f8: [{' '.join(str(c) for c in d.view(np.uint8))}]" for d in (want, new)]
        p = ir._data.instance            # a popdist instance prints its own replicas' lines
        n = R if p is None else p.local
        if lines != [wants[0]] * n + [wants[1]] * n:     # each run, every replica
            errs.append(f"{kind}: print_tensor printed {lines}, want {wants} for each replica")
    return errs


def main() -> int:
    """Run every case; print `ok <case>` / `FAIL <case>: <details>`; 1 if any failed."""
    failed = 0
    for R in (1, 2, 4):
        for case in (case_matmul_and_variables, case_grads, case_gathered_variables):
            name = f"R{R} fp8 {case.__name__[5:]}"
            try:
                errs = case(R)
            except Exception:  # noqa: BLE001 - reported as a failed case, the rest still run
                errs = [traceback.format_exc()]
            if errs:
                failed += 1
                print(f"FAIL {name}: {'; '.join(errs[:3])}")
            else:
                print(f"ok {name}")
    print(f"{'FAILED' if failed else 'passed'}: {failed} failing fp8 case(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
