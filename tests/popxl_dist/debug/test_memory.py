"""The memory estimate (popxl.debug.memory): a script stops at its first device operation with
every Ir it built, the per-replica arrays equal what NumPy says the program's tensors take, the
estimate of a whole process is within 25% of its measured peak resident set, and a Session whose
arrays cannot fit this machine warns before anything is allocated."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.debug import memory
from popxl.debug.inspection import StopInspection, inspecting
from popxl.engine.compile import Program

T = 3            # host transfers per run


def _program(R: int = 2, big=(64, 32)):
    ir = popxl.Ir(replication=R)
    ir.num_host_transfers = T
    with ir.main_graph:
        xs = popxl.h2d_stream((4, big[0]), popxl.float32, "x")
        w = popxl.variable(np.ones(big, np.float32), name="w")
        m = popxl.variable(np.zeros(big, np.float16), name="m")
        buf = popxl.remote_buffer((5, 7), popxl.float32, 6)
        if R > 1:
            _, shard = popxl.replica_sharded_variable(np.ones(11, np.float32), popxl.float32,
                                                      "rts")
        x = ops.host_load(xs, "x")
        y = ops.gelu(x @ w)
        ops.remote_store(buf, 0, ops.sum(y) * popxl.constant(np.ones((5, 7), np.float32)))
        g = ops.collectives.replicated_all_reduce(x.T @ y[:, :big[1]])
        ops.var_updates.accumulate_(m, ops.cast(g, popxl.float16))
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
        if R > 1:
            ops.host_store(popxl.d2h_stream((11,), popxl.float32, "full"),
                           ops.collectives.replicated_all_gather(shard))
    return ir


def test_stops_at_the_first_device_operation_with_every_ir():
    reached = []
    with inspecting() as seen:
        with pytest.raises(StopInspection):
            a, b = _program(), _program(R=1)
            sa = popxl.Session(a, "ipu_hw")
            popxl.Session(b, "ipu_hw")
            reached.append("sessions")
            with sa:                          # the first device operation
                reached.append("attached")
    assert reached == ["sessions"]
    assert [ir.replication_factor for ir in seen] == [2, 1]
    assert seen[0] is a._data and seen[1] is b._data


def test_arrays_per_replica_against_numpy():
    ir = _program()
    data = ir._data
    mem = memory.estimate(data, workers=2, separate_workers=True)
    assert mem.replicas == 2 and mem.blocks == [(0, 1), (1, 2)]
    w, m = np.ones((64, 32), np.float32), np.zeros((64, 32), np.float16)
    assert mem.variables == w.nbytes + m.nbytes
    shards = 4 * 6            # 11 values padded to 12, one half per replica: an RTS buffer
    assert mem.rts_shards == shards
    assert mem.remote_buffers == np.zeros((6, 5, 7), np.float32).nbytes + shards
    assert mem.stream_in == T * np.zeros((4, 64), np.float32).nbytes
    assert mem.stream_out == T * (np.zeros((4, 32), np.float32).nbytes + 11 * 4)
    held = {id(i.data): i.data.nbytes for gd in data.graphs.values() for i in gd.tensors.values()
            if isinstance(i.data, np.ndarray)}
    assert mem.ir_arrays == sum(held.values()) >= w.nbytes + m.nbytes + 5 * 7 * 4 + 11 * 4
    assert mem.host_weights == w.nbytes + m.nbytes + 11 * 4
    program = Program(data)
    plans = [program.main, program.weights_from_host, program.weights_to_host]
    plans += [program.graph(g) for g in data.graphs if g]
    assert mem.plan_buffers == sum(cg.memory_plan.peak_bytes for cg in plans)
    # worker 0 lives in the host process (no copy of the Ir); worker 1 has its own copy
    assert mem.worker_bytes(0) == mem.per_replica
    assert mem.worker_bytes(1) == mem.per_replica + mem.ir_arrays
    assert mem.host_bytes() == mem.host_weights + 2 * (mem.stream_in + mem.stream_out)


MEASURED = r"""
import json, sys
import numpy as np
import popxl, popxl.ops as ops
R, n = 2, int(sys.argv[1])
ir = popxl.Ir(replication=R)
with ir.main_graph:
    xs = popxl.h2d_stream((16, n), popxl.float32, "x")
    w = popxl.variable(np.full((n, n), 0.001, np.float32), name="w")
    v = popxl.variable(np.zeros((n, n), np.float32), name="v")
    x = ops.host_load(xs, "x")
    h = ops.gelu(x @ w)
    ops.var_updates.accumulate_(v, x.T @ h)
    ys = popxl.d2h_stream(h.shape, h.dtype, "h")
    ops.host_store(ys, h)
with popxl.Session(ir, "ipu_hw") as s:
    for _ in range(3):
        s.run({xs: np.ones((R, 16, n), np.float32)})
with open("/proc/self/status") as f:
    print(json.dumps({"peak": next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))}))
"""


def test_estimate_within_25_percent_of_the_measured_peak(tmp_path):
    """A program whose arrays (~200 MB) outweigh the interpreter: popxl-inspect's estimate of
    the process against the peak resident set of the same script run for real."""
    script = tmp_path / "measured.py"
    script.write_text(MEASURED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    n = "2048"
    ran = subprocess.run([sys.executable, str(script), n], capture_output=True, text=True,
                         env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    peak = json.loads(ran.stdout.strip().splitlines()[-1])["peak"]
    inspect = os.path.join(os.path.dirname(sys.executable), "popxl-inspect")
    got = subprocess.run([inspect, "--no-graphs", str(script), n], capture_output=True,
                         text=True, env=env, timeout=300, cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-2000:]
    line = next(ln for ln in got.stdout.splitlines() if "this machine:" in ln)
    value, unit = line.split("this machine: ")[1].split(" for the job")[0].split()
    estimate = float(value) * {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}[unit]
    arrays = 4 * 2048 * 2048 * (2 * 2 + 2 + 1)      # 2 variables: 2 replicas, the Ir, host copy
    assert peak > arrays                             # the arrays dominate this process
    assert abs(estimate - peak) <= 0.25 * peak, (estimate, peak, got.stdout)


def test_session_warns_before_allocating(monkeypatch):
    made = []
    from popxl import runtime

    real = runtime._create_runtime
    monkeypatch.setattr(runtime, "_create_runtime", lambda ir: made.append(ir) or real(ir))
    monkeypatch.setattr(memory, "available_memory", lambda: 1000)
    ir = _program()
    with warnings.catch_warnings():
        warnings.simplefilter("error", memory.MemoryWarning)
        with pytest.raises(memory.MemoryWarning, match="popxl-inspect") as info:
            popxl.Session(ir, "ipu_hw")
    assert made == []                                   # nothing was allocated
    assert "available" in str(info.value)
    monkeypatch.setattr(memory, "available_memory", lambda: 10 ** 12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", memory.MemoryWarning)
        popxl.Session(_program(), "ipu_hw")             # fits: no warning
    assert len(made) == 1


def test_estimate_agrees_with_the_device_memory_report(monkeypatch):
    """What the estimate says per replica before the run is what `device_memory_report` finds
    on the device after attaching."""
    monkeypatch.setenv("POPXL_WORKERS", "2")
    ir = _program()
    mem = memory.estimate(ir._data, workers=2, separate_workers=False)
    with popxl.Session(ir, "ipu_hw") as sess:
        reports = sess.device_memory_report()
    assert [r["replica"] for r in reports] == [0, 1]
    for r in reports:
        assert (r["variables"], r["rts_shards"], r["remote_buffers"]) == \
            (mem.variables, mem.rts_shards, mem.remote_buffers)
