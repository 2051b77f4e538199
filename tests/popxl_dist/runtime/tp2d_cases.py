"""2-D tensor parallelism's replica groupings, run unchanged under every backend.

    python tp2d_cases.py                               # local backend (in-process)
    popxl-run --backend mpi --workers 2 tp2d_cases.py
    poprun --num-instances 2 --num-replicas 8 ...      # via instance_suite.py's `cases` part

8 replicas = 2 (data parallel) x 2 (TP1, stride 2) x 2 (TP2, stride 1). The communication
grouping of TP1 is `(stride 2, size 2)`; the variables one TP1 shard lives in are its
transpose, the non-constant grouping `[0, 0, 1, 1, 0, 0, 1, 1]`, which the device stores as its
`const_rg` `[0, 0, 1, 1, 2, 2, 3, 3]`. One program uses them all:

* a grouped variable with that grouping (both retrieval modes) in a matmul, updated by the
  gradient of an all-gather over TP1 (autodiff), read and rewritten by the host;
* all-reduce (add over TP1, mean over const_rg), all-gather over TP1, reduce-scatter over
  const_rg, the replicated and replica-sharded slices;
* an RTS variable with the non-constant grouping, sharded over its const_rg groups, gathered,
  updated by a reduce-scatter and stored back.

Every replica's value is compared with NumPy references computed here (per-replica loops over
the group members). `digest()` is a sha256 of every output and host read, so runs on different
backends and worker counts can be compared bit for bit. Prints `ok <case>` / `FAIL <case>:
<details>` and `tp2d digest <hex>`; `main()` returns the number of failing cases.
"""
from __future__ import annotations

import hashlib
import sys
import traceback

import numpy as np
import popxl
from popxl import ops

C = ops.collectives
R = 8
VAR_ASSIGNMENT = [0, 0, 1, 1, 0, 0, 1, 1]          # replicas holding the same TP1 shard
CONST_GROUPS = [[0, 1], [2, 3], [4, 5], [6, 7]]     # what the device stores it as
TP1_GROUPS = [[0, 2], [1, 3], [4, 6], [5, 7]]       # TP1 communication (stride 2, size 2)
TP2_GROUPS = [[0, 1], [2, 3], [4, 5], [6, 7]]
LR = np.float32(0.01)


def _group(r: int, groups) -> list:
    return next(g for g in groups if r in g)


def _close(got, want, what: str, errs: list) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        errs.append(f"{what}: shape {got.shape}, expected {want.shape}")
    elif not np.allclose(got, want, rtol=1e-5, atol=1e-5):
        errs.append(f"{what}: max |diff| {np.max(np.abs(got - want))}")


class Program:
    """The Ir, its streams and variables, and the NumPy model of every replica."""

    def __init__(self, rng: np.random.Generator):
        self.W0 = rng.normal(size=(2, 4, 3)).astype(np.float32)    # per variable group
        self.V0 = rng.normal(size=(2, 10)).astype(np.float32)
        ir = popxl.Ir(replication=R)
        self.ir = ir
        with ir.main_graph, popxl.in_sequence():
            tp1 = ir.replica_grouping(stride=2, group_size=2)
            tp2 = ir.replica_grouping(stride=1, group_size=2)
            rg = tp1.transpose()
            assert rg.assignment == VAR_ASSIGNMENT and not rg.is_const
            const = rg.const_rg
            assert [const.members(g) for g in range(4)] == CONST_GROUPS
            self.x_s = popxl.h2d_stream((4,), popxl.float32, "x")
            self.d_s = popxl.h2d_stream((10,), popxl.float32, "d")
            x = ops.host_load(self.x_s)
            d = ops.host_load(self.d_s)
            self.W = popxl.variable(self.W0, name="W", replica_grouping=rg)
            self.Wa = popxl.variable(self.W0, name="Wa", replica_grouping=rg,
                                     retrieval_mode="all_replicas")
            outs = {}

            def out(name, t):
                s = popxl.d2h_stream(t.shape, t.dtype, name)
                ops.host_store(s, t)
                outs[name] = s

            for var in (self.W, self.Wa):
                y = (x.reshape((1, 4)) @ var).reshape((3,))
                out(f"y_{var.name}", y)
            out("ar_tp1", C.replicated_all_reduce(y, "add", group=tp1))
            out("mean_const", C.replicated_all_reduce(y, "mean", group=const))
            gathered = C.replicated_all_gather(y, group=tp1)
            out("ag_tp1", gathered)
            out("rs_const", C.replicated_reduce_scatter(gathered, "add", group=const))
            out("slice_tp2", C.replicated_slice(gathered, 0, group=tp2))
            out("sharded_slice_tp1", C.replica_sharded_slice(gathered, group=tp1))

            # W -= lr * d/dW sum(all_gather_tp1(x @ W)^2), for both variables
            def loss(xx, ww):
                h = (xx.reshape((1, 4)) @ ww).reshape((3,))
                z = C.replicated_all_gather(h, group=tp1)
                return ops.sum(z * z)

            fwd = ir.create_graph(loss, x.spec, popxl.TensorSpec((4, 3), popxl.float32))
            bwd = popxl.transforms.autodiff(fwd, grads_required=fwd.inputs[1:])
            one = popxl.constant(1.0, popxl.float32, "one")
            for var in (self.W, self.Wa):
                info = ops.call_with_info(fwd, x, var)
                dw, = ops.call(bwd.graph, one, inputs_dict=bwd.inputs_dict(info))
                out(f"dW_{var.name}", dw)
                ops.var_updates.accumulate_(var, dw, -LR)

            # An RTS variable with the non-constant grouping: shards over const_rg groups.
            buf = popxl.replica_sharded_buffer((2, 10), popxl.float32, rg)
            assert buf.tensor_shape == (5,) and buf.meta_shape == (10,)
            self.V = popxl.remote_replica_sharded_variable(self.V0, buf, 0, name="V",
                                                           replica_grouping=rg)
            shard = ops.remote_load(buf, 0)
            out("V_full", C.replicated_all_gather(shard, group=const))
            shard = shard + C.replicated_reduce_scatter(d, "add", group=const)
            ops.remote_store(buf, 0, shard)
        self.outs = outs

    # --- the NumPy model ---------------------------------------------------------------
    def reference(self, W, V, x, d):
        """Expected outputs of one run from per-replica W (R, 4, 3) and V (R, 10); returns
        (outputs, W after, V after)."""
        y = np.einsum("ri,rij->rj", x, W)
        ref = {"y_W": y, "y_Wa": y}
        ref["ar_tp1"] = np.stack([y[_group(r, TP1_GROUPS)].sum(0) for r in range(R)])
        ref["mean_const"] = np.stack([y[_group(r, CONST_GROUPS)].mean(0) for r in range(R)])
        ag = np.stack([np.concatenate(y[_group(r, TP1_GROUPS)]) for r in range(R)])
        ref["ag_tp1"] = ag
        ref["rs_const"] = np.stack(
            [ag[_group(r, CONST_GROUPS)].sum(0)[3 * (r % 2):3 * (r % 2) + 3] for r in range(R)])
        ref["slice_tp2"] = np.stack([ag[r][3 * (r % 2):3 * (r % 2) + 3] for r in range(R)])
        ref["sharded_slice_tp1"] = np.stack(
            [ag[r][3 * ((r // 2) % 2):3 * ((r // 2) % 2) + 3] for r in range(R)])
        # d/dh_r of the loss: the all-gather's gradient is a "local" reduce-scatter (each
        # replica keeps its own slice of dz = 2 z, no sum), as upstream.
        dw = np.stack([np.outer(x[r], 2 * y[r]) for r in range(R)])
        ref["dW_W"] = ref["dW_Wa"] = dw
        W_after = W - LR * dw
        ref["V_full"] = V
        V_after = V.copy()
        for g in CONST_GROUPS:
            V_after[g] = V[g] + d[g].sum(0)
        return ref, W_after, V_after


def _check_run(prog, got, ref, tag, errs):
    for name, stream in prog.outs.items():
        _close(got[stream], ref[name], f"{tag} {name}", errs)


def run_all(results: list, blobs: list) -> None:
    rng = np.random.default_rng(8)
    prog = Program(rng)
    W = prog.W0[VAR_ASSIGNMENT].copy()                # per replica
    V = prog.V0[VAR_ASSIGNMENT].copy()
    first = [VAR_ASSIGNMENT.index(g) for g in range(2)]
    errs = []
    sess = popxl.Session(prog.ir, "ipu_hw")
    with sess:
        for step in range(2):
            x = rng.normal(size=(R, 4)).astype(np.float32)
            d = rng.normal(size=(R, 10)).astype(np.float32)
            got = sess.run({prog.x_s: x, prog.d_s: d})
            ref, W, V = prog.reference(W, V, x, d)
            _check_run(prog, got, ref, f"run {step}", errs)
            blobs += [got[s] for s in prog.outs.values()]
        host = sess.get_tensors_data([prog.W, prog.Wa, prog.V])
        _close(host[prog.W], W[first], "get W (one per group)", errs)
        _close(host[prog.Wa], W, "get Wa (all replicas)", errs)
        _close(host[prog.V], V[first], "get V (RTS, one per group)", errs)
        blobs += list(host.values())
        # Host writes: per group of the non-constant grouping.
        newW = rng.normal(size=(2, 4, 3)).astype(np.float32)
        newV = rng.normal(size=(2, 10)).astype(np.float32)
        sess.write_variables_data({prog.W: newW, prog.V: newV})
        Wa = W.copy()                                    # Wa keeps its device values
        W = newW[VAR_ASSIGNMENT].copy()
        V = newV[VAR_ASSIGNMENT].copy()
        x = rng.normal(size=(R, 4)).astype(np.float32)
        d = rng.normal(size=(R, 10)).astype(np.float32)
        got = sess.run({prog.x_s: x, prog.d_s: d})
        yW = np.einsum("ri,rij->rj", x, W)
        _close(got[prog.outs["y_W"]], yW, "after write: y_W", errs)
        _close(got[prog.outs["y_Wa"]], np.einsum("ri,rij->rj", x, Wa), "after write: y_Wa",
               errs)
        _close(got[prog.outs["V_full"]], V, "after write: V_full", errs)
        blobs += [got[s] for s in prog.outs.values()]
    results.append(("R8 2-D TP: grouped variable [0,0,1,1,0,0,1,1], collectives over TP1 / "
                    "const_rg, gradients, RTS over const_rg, host reads and writes",
                    "; ".join(errs[:4])))


def run_refusals(results: list) -> None:
    """A non-constant grouping has no GCL form: collectives refuse it, as upstream."""
    ir = popxl.Ir(replication=R)
    errs = []
    with ir.main_graph:
        rg = ir.replica_grouping_from_assignments(VAR_ASSIGNMENT)
        t = popxl.variable(np.zeros(4, np.float32))
        for name, fn in [("all_reduce", lambda: C.replicated_all_reduce(t, group=rg)),
                         ("all_gather", lambda: C.replicated_all_gather(t, group=rg)),
                         ("reduce_scatter", lambda: C.replicated_reduce_scatter(t, group=rg))]:
            try:
                fn()
                errs.append(f"{name} accepted a non-constant grouping")
            except NotImplementedError:
                pass
    results.append(("R8 collectives refuse the non-constant grouping", "; ".join(errs)))


def digest(blobs) -> str:
    h = hashlib.sha256()
    for b in blobs:
        b = np.ascontiguousarray(b)
        h.update(f"{b.dtype}{b.shape}".encode())
        h.update(b.tobytes())
    return h.hexdigest()


def run() -> tuple:
    """Run the cases: ([(case, error or '')], digest)."""
    results, blobs = [], []
    for runner in (lambda: run_all(results, blobs), lambda: run_refusals(results)):
        try:
            runner()
        except Exception:  # noqa: BLE001 - reported as a failed case
            results.append(("R8 2-D TP", traceback.format_exc()))
    return results, digest(blobs)


def main() -> int:
    """Run the cases; print `ok` / `FAIL` lines and the digest; return the failure count."""
    results, dig = run()
    failed = 0
    for name, err in results:
        failed += bool(err)
        print(f"FAIL {name}: {err}" if err else f"ok {name}", flush=True)
    print(f"tp2d digest {dig}", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
