"""Many multi-instance scenarios in one launch (process starts are few):

    poprun --num-instances 2 --num-replicas 4 python instance_suite.py PART [PART...]
    popxl-run --backend ray --instances 2 --replicas 4 instance_suite.py PART [PART...]

Parts:
  dp=DIR        examples/mnist_popdist.py as launched (losses and weights saved into DIR)
  rts           examples/rts_popdist.py --groupings, 2 replicas per instance
  hierarchical  examples/hierarchical_all_reduce.py, 4 replicas per instance
  cases         the backend suite's collective, remote-buffer, tensor-parallel (1-D, 2-D), float8 and
                upstream-semantics cases with R = 2, 4, 8 split over the instances (`Ir(replication=R)` becomes
                a popdist Ir; each instance feeds its replicas' rows of the inputs and the
                outputs are gathered back, so the cases check every replica unchanged)
  mpi-user      the script's own mpi4py traffic (a pending any-source receive, bcast, barrier)
                around popdist runs: nothing of popxl's reaches it (MPI launches only)
  instance0-io  weights read by every instance (collective), written by instance 0 only, read
                back by all after a barrier (MPI launches only)
  host-shapes   the global array fed where this instance's replicas are expected: a clear error
  weights       `Session.copy_weights_to` between two popdist Sessions (plain and RTS variables,
                copied on the instance), and `TaskSession` checkpoints: every instance reads,
                instance 0 alone writes, every instance loads them back
  fail-last     (last) instance 1 raises; instance 0 must get InstanceFailed naming it from its
                next collective and prints how long that took

Parts that change the replica count set the POPDIST_* variables themselves before building
their Irs (the placement is read when an Ir is created). Prints `ok`/`FAIL` lines and
`suite: K failed part(s)`; the exit status is K.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import popdist  # noqa: E402
import popxl  # noqa: E402
from popxl import ops  # noqa: E402
from popxl.errors import InstanceFailed  # noqa: E402
from popxl.runtime.instances.group import current_group  # noqa: E402

N = popdist.getNumInstances()
INDEX = popdist.getInstanceIndex()
_PLACEMENT_VARS = ("POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_LOCAL_REPLICAS",
                   "POPDIST_REPLICA_INDEX_OFFSET")


@contextlib.contextmanager
def local_replicas(local: int):
    """Irs created inside get `local` replicas per instance (N * local in all)."""
    saved = {k: os.environ.get(k) for k in _PLACEMENT_VARS}
    os.environ.update({"POPDIST_NUM_TOTAL_REPLICAS": str(N * local),
                       "POPDIST_NUM_LOCAL_REPLICAS": str(local),
                       "POPDIST_REPLICA_INDEX_OFFSET": str(INDEX * local)})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- the single-process cases, split over the instances ------------------------------------
class _SplitIr(popxl.Ir):
    """`Ir(replication=R)` with R a multiple of the instance count becomes a popdist Ir."""

    def __init__(self, replication=1):
        if isinstance(replication, int) and replication >= N and replication % N == 0:
            with local_replicas(replication // N):
                super().__init__("popdist")
        else:
            super().__init__(replication)


def _replica_axis(ir) -> int:
    return 1 if ir.num_host_transfers > 1 else 0


def _to_local(ir, arr: np.ndarray) -> np.ndarray:
    p = ir._data.instance
    ax = _replica_axis(ir)
    part = np.take(np.asarray(arr), np.arange(p.offset, p.offset + p.local), axis=ax)
    return part if p.local > 1 else np.squeeze(part, axis=ax)


def _split_run(original):
    def run(self, inputs=None, downcast_inputs=True):
        p = self.ir._data.instance
        if p is None:
            return original(self, inputs, downcast_inputs)
        local_in = {s: _to_local(self.ir, a) for s, a in (inputs or {}).items()}
        out = original(self, local_in, downcast_inputs)
        streams = list(out)
        parts = current_group().allgather([out[s] for s in streams])
        ax = _replica_axis(self.ir)
        merged = {}
        for k, s in enumerate(streams):
            pieces = [part[k] if p.local > 1 else np.expand_dims(part[k], ax) for part in parts]
            merged[s] = np.concatenate(pieces, axis=ax)
        return merged
    return run


def part_cases() -> int:
    import collective_cases
    import fp8_cases
    import remote_cases
    import surface_cases
    import tp2d_cases
    import tp_cases

    saved = popxl.Ir, popxl.Session.run, list(remote_cases.RUNNERS)
    popxl.Ir = _SplitIr
    popxl.Session.run = _split_run(popxl.Session.run)
    # An out-of-range offset on the last replica raises on the instance holding it only.
    remote_cases.RUNNERS[:] = [r for r in remote_cases.RUNNERS
                               if r is not remote_cases.run_offset_error]
    try:
        return sum(int(cases.main() != 0)
                   for cases in (collective_cases, remote_cases, tp_cases, tp2d_cases,
                                 fp8_cases, surface_cases))
    finally:
        popxl.Ir, popxl.Session.run, remote_cases.RUNNERS[:] = saved


# --- the examples --------------------------------------------------------------------------
def part_dp(out_dir: str) -> int:
    import mnist_popdist

    return mnist_popdist.main(["--limit", "3", "--test-batches", "2", "--save-losses", out_dir,
                               "--save-weights", os.path.join(out_dir, "weights.npz")])


def part_rts() -> int:
    import rts_popdist

    with local_replicas(2):
        return rts_popdist.main(["--groupings"])


def part_hierarchical() -> int:
    import hierarchical_all_reduce

    with local_replicas(4):
        return hierarchical_all_reduce.main()


# --- the script's own MPI ------------------------------------------------------------------
def _sum_program():
    """y = all_reduce(x) over every replica, and a variable accumulating y."""
    ir = popxl.Ir(replication="popdist")
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        y = ops.collectives.replicated_all_reduce(ops.host_load(xs), op="add")
        v = popxl.variable(np.zeros(3, np.float32), name="v")
        ops.var_updates.accumulate_(v, y)
        ys = popxl.d2h_stream((3,), popxl.float32, "y")
        ops.host_store(ys, y)
    return ir, xs, ys, v


def _feed(ir, step: int) -> tuple:
    """This instance's rows of the global input, and the all-reduce every replica expects."""
    R, L = ir.replication_factor, ir.instance_replication_factor
    x = (np.arange(R * 3, dtype=np.float32).reshape(R, 3) + step)
    off = popdist.getReplicaIndexOffset()
    mine = x[off:off + L]
    return (mine if L > 1 else mine[0]), x.sum(0)


def part_mpi_user() -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    problems = []
    with local_replicas(2):
        ir, xs, ys, v = _sum_program()
        with popxl.Session(ir, "ipu_hw") as sess:
            for step in range(3):
                # Posted before popxl's collectives run, matched only by the script's message.
                pending = comm.irecv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
                x, want = _feed(ir, step)
                out = sess.run({xs: x})[ys]
                if not np.array_equal(out.reshape(-1, 3)[0], want):
                    problems.append(f"step {step}: all-reduce {out.tolist()}")
                comm.send(("user", step, INDEX), dest=(INDEX + 1) % N, tag=step)
                got = pending.wait()
                if got != ("user", step, (INDEX - 1) % N):
                    problems.append(f"step {step}: the script's receive got {got!r}")
                root = comm.bcast(step * 10 if INDEX == 0 else None, root=0)
                if root != step * 10:
                    problems.append(f"step {step}: bcast gave {root!r}")
                comm.Barrier()
            whole = sess.get_tensor_data(v)
    want_v = sum(_feed(ir, s)[1] for s in range(3))
    if not np.array_equal(whole, want_v):
        problems.append(f"variable {whole.tolist()}, expected {want_v.tolist()}")
    print(f"{'FAIL' if problems else 'ok'} mpi-user {'; '.join(problems)}", flush=True)
    return int(bool(problems))


def part_instance0_io() -> int:
    """Every instance reads (collective), instance 0 alone writes, all read the file back."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="popxl-io-") if INDEX == 0 else None, root=0)
    target = os.path.join(path, "v.npy")
    with local_replicas(1):
        ir, xs, ys, v = _sum_program()
        with popxl.Session(ir, "ipu_hw") as sess:
            x, want = _feed(ir, 0)
            sess.run({xs: x})
            data = sess.get_tensors_data([v])[v]
        if popdist.getInstanceIndex() == 0:
            if os.path.exists(target):
                raise AssertionError("the file existed before instance 0 wrote it")
            np.save(target, data)
        comm.Barrier()
        back = np.load(target)
    writers = comm.allgather(INDEX == 0)
    ok = np.array_equal(back, want) and sum(writers) == 1
    print(f"{'ok' if ok else 'FAIL'} instance0-io (read {back.tolist()}, expected "
          f"{want.tolist()})", flush=True)
    comm.Barrier()
    if INDEX == 0:
        os.remove(target)
        os.rmdir(path)
    return int(not ok)


def _weights_program(scale: float):
    """A plain variable and an RTS variable, both accumulating the all-reduced input * scale."""
    ir = popxl.Ir(replication="popdist")
    with ir.main_graph:
        xs = popxl.h2d_stream((3,), popxl.float32, "x")
        y = ops.collectives.replicated_all_reduce(ops.host_load(xs), op="add") * scale
        v = popxl.variable(np.zeros(3, np.float32), name="v")
        ops.var_updates.accumulate_(v, y)
        w, w_shard = popxl.replica_sharded_variable(np.zeros(4, np.float32), name="w")
        part = ops.collectives.replica_sharded_slice(ops.concat([y, y[:1]]))
        ops.var_updates.accumulate_(w_shard, part)
    return ir, xs, v, w


def part_weights() -> int:
    from popxl_addons import NamedTensors, TaskSession
    from popxl_addons.named_tensors import NamedTensorData  # noqa: F401 - import path check

    problems = []
    with local_replicas(2):
        train_ir, xs, v, w = _weights_program(1.0)
        test_ir, xs_t, v_t, w_t = _weights_program(0.0)
        train = popxl.Session(train_ir, "ipu_hw")
        test = TaskSession([xs_t], [], NamedTensors(v=v_t, w=w_t), ir=test_ir,
                           device_desc="ipu_hw")
        group = current_group()             # made by the first popdist Session
        with train, test:
            for step in range(2):
                train.run({xs: _feed(train_ir, step)[0]})
            assert train._runtime.shares_workers_with(test._runtime)
            train.copy_weights_to(test, {v: v_t, w: w_t})
            want = sum(_feed(train_ir, s)[1] for s in range(2))
            got = test.get_tensors_data([v_t, w_t])          # collective: every instance
            if not (np.array_equal(got[v_t], want)
                    and np.array_equal(got[w_t], np.concatenate([want, want[:1]]))):
                problems.append(f"copy gave {got[v_t].tolist()} {got[w_t].tolist()}")
            path = group.allgather(tempfile.mkdtemp(prefix="popxl-ckpt-") if INDEX == 0
                                   else None)[0]
            ckpt = os.path.join(path, "step_2")
            test.session_state["steps"] = 2
            test.save_checkpoint(ckpt)
            wrote = group.allgather(os.path.exists(os.path.join(ckpt, "session_info.json")))
            if wrote != [True] * N:             # instance 0 wrote it, the others see it
                problems.append(f"checkpoint visible on instances: {wrote}")
            test.write_variables_data({v_t: np.full(3, -1, np.float32)})
            test.session_state["steps"] = 0
            test.load_checkpoint(ckpt, report_missing="error")
            back = test.get_tensors_data([v_t, w_t])
            if not (np.array_equal(back[v_t], want) and np.array_equal(back[w_t], got[w_t])
                    and test.session_state["steps"] == 2):
                problems.append(f"checkpoint loaded {back[v_t].tolist()} "
                                f"{back[w_t].tolist()} steps={test.session_state}")
            group.allgather(None)               # every instance has read before the delete
            if INDEX == 0:
                import shutil

                shutil.rmtree(path)
    print(f"{'FAIL' if problems else 'ok'} weights {'; '.join(problems)}", flush=True)
    return int(bool(problems))


def part_host_shapes() -> int:
    """Feeding the global array instead of this instance's replicas is a clear error (raised
    by every instance before any collective), and the session still works afterwards."""
    with local_replicas(2):
        ir, xs, ys, v = _sum_program()
        R = ir.replication_factor
        with popxl.Session(ir, "ipu_hw") as sess:
            try:
                sess.run({xs: np.zeros((R, 3), np.float32)})
                err = "no error"
            except ValueError as e:
                want = "expects an array of shape (2, 3) (num_host_transfers=1, replicas=2 of " \
                       "this popdist instance"
                err = "" if want in str(e) else f"message: {e}"
            x, total = _feed(ir, 1)
            out = sess.run({xs: x})[ys]
            if not err and not np.array_equal(out[0], total):
                err = f"the next run gave {out.tolist()}"
    print(f"{'FAIL' if err else 'ok'} host-shapes {err}", flush=True)
    return int(bool(err))


# --- failure at the end --------------------------------------------------------------------
def part_fail_last() -> int:
    with local_replicas(1):
        ir, xs, ys, v = _sum_program()
        x, _ = _feed(ir, 0)
        session = popxl.Session(ir, "ipu_hw")
        if INDEX == 1:
            with session:
                session.run({xs: x})
                print(f"instance 1 fails at {time.time():.6f}", flush=True)
                raise ZeroDivisionError("instance 1 gives up")
        try:
            with session:
                session.run({xs: x})
                session.run({xs: x})
        except InstanceFailed as e:
            print(f"instance {INDEX} caught at {time.time():.6f}: {e}", flush=True)
            ok = e.instance == 1 and "ZeroDivisionError: instance 1 gives up" in str(e)
            print(f"{'ok' if ok else 'FAIL'} fail-last", flush=True)
            return int(not ok)
    print("FAIL fail-last: no InstanceFailed", flush=True)
    return 1


def main(parts) -> int:
    failed = 0
    for part in parts:
        name, _, arg = part.partition("=")
        fn = {"dp": part_dp, "rts": part_rts, "hierarchical": part_hierarchical,
              "cases": part_cases, "mpi-user": part_mpi_user, "instance0-io": part_instance0_io,
              "host-shapes": part_host_shapes, "weights": part_weights,
              "fail-last": part_fail_last}[name]
        if name == "fail-last":           # instance 1's exception must end its script
            failed += part_fail_last()
            continue
        try:
            bad = fn(arg) if arg else fn()
        except Exception:  # noqa: BLE001 - reported as a failed part, the rest still run
            traceback.print_exc()
            bad = 1
        failed += int(bool(bad))
        print(f"part {name}: {'FAIL' if bad else 'ok'}", flush=True)
    print(f"suite: {failed} failed part(s)", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
