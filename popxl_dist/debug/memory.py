"""How much memory a program will take, from its Ir, before anything runs (`popxl-inspect`, and
the warning a Session gives when its arrays alone cannot fit this machine).

What a process holds while a Session runs (the model `popxl-inspect` prints):

* its **base**: the interpreter, NumPy, popxl-dist and the engine after a first run (numba's
  compiled loops when the `fast` extra is installed), measured by starting such a process
  (`measure_base`); the script's own process also holds what the script built before its first
  Session (its data, the Ir with every variable's initial value): `popxl-inspect` reads that
  from its own resident set when the script stops;
* a **copy of the Ir** in every worker process other than the host (it arrives pickled): the
  initial values of variables and the constants;
* per **replica**: its variables and RTS shards (device state), its remote buffers, the memory
  plan's buffers of every compiled graph (allocated on the first run and kept), and the peak of
  the values kernels allocate during a run (`transient_peak`: liveness over the schedule, called
  graphs counted where they are called);
* per **run**: the host transfer buffers (inputs and outputs of every stream, `T x R x shape`),
  on the host and, for its block of replicas, on each worker process;
* on the host, after the first weights sync, one more copy of the variables (the host weights).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .._ir.records import GraphData, IrData, TensorKind
from ..dtypes import storage_numpy
from .op_info import tensor_bytes

__all__ = ["IrMemory", "GraphMemory", "estimate", "transient_peak", "available_memory",
           "measure_base", "check_fits", "check_session_fits", "launch_shape", "MemoryWarning",
           "fmt_bytes", "current_rss"]


class MemoryWarning(UserWarning):
    """A program that will not fit this machine's memory (given before anything is
    allocated)."""


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _proc_kib(path: str, key: str) -> Optional[int]:
    """Bytes of a `key: N kB` line of a /proc file, or None (no /proc: not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_memory() -> Optional[int]:
    """Bytes this machine can still give (`MemAvailable` of /proc/meminfo), or None."""
    got = _proc_kib("/proc/meminfo", "MemAvailable")
    if got is not None:
        return got
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def current_rss() -> int:
    """This process's resident set now, in bytes (its peak where there is no /proc)."""
    got = _proc_kib("/proc/self/status", "VmRSS")
    if got is not None:
        return got
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --- the Ir's arrays --------------------------------------------------------------------------
def _data_bytes(ir: IrData) -> int:
    """Bytes of the arrays an Ir carries (variables' initial values, constants); memory-mapped
    variables stay in their files."""
    seen, total = set(), 0
    for gd in ir.graphs.values():
        for info in gd.tensors.values():
            d = info.data
            if isinstance(d, np.ndarray) and not isinstance(d, np.memmap) and id(d) not in seen:
                seen.add(id(d))
                total += d.nbytes
    return total


def _state_bytes(ir: IrData) -> Tuple[int, int]:
    """(on-chip variables, RTS shards) bytes of one replica."""
    main = ir.main
    variables = sum(tensor_bytes(i) for i in main.tensors.values()
                    if i.kind == TensorKind.VARIABLE and "remote" not in (i.extra or {}))
    used_outside = {t for op in main.ops if op.exec_ctx != "WeightsFromHostFragment"
                    for t in op.inputs}
    shards = {o for op in main.ops if op.exec_ctx == "WeightsFromHostFragment"
              for o in op.outputs if o in used_outside}
    return variables, sum(tensor_bytes(main.tensors[t]) for t in shards)


def _remote_bytes(ir: IrData) -> int:
    total = 0
    for rec in ir.remote_buffers.values():
        if rec.get("dtype") is None:
            continue
        n = int(np.prod(rec["shape"], dtype=np.int64)) * int(rec["entries"])
        try:
            total += n * storage_numpy(rec["dtype"]).itemsize
        except TypeError:
            pass
    return total


def _stream_bytes(ir: IrData) -> Tuple[int, int]:
    """(inputs, outputs) bytes of one replica's host transfers of one run."""
    ins = outs = 0
    seen = set()
    for gd in ir.graphs.values():          # (streams are read in called graphs too)
        for op in gd.ops:
            if op.type in ("HostLoad", "HostStore") and op.attrs["stream"] not in seen:
                seen.add(op.attrs["stream"])
                t = op.outputs[0] if op.type == "HostLoad" else op.inputs[0]
                n = tensor_bytes(gd.tensors[t]) * max(int(ir.num_host_transfers), 1)
                if op.type == "HostLoad":
                    ins += n
                else:
                    outs += n
    return ins, outs


def _host_weight_bytes(ir: IrData) -> int:
    """The host copy of the weights a sync makes (one value per group, or per replica for
    `all_replicas` retrieval)."""
    total = 0
    R = ir.replication_factor
    for info in ir.main.tensors.values():
        if info.kind != TensorKind.VARIABLE:
            continue
        rg = info.extra.get("replica_grouping")
        copies = rg.num_groups if rg is not None else 1
        if info.extra.get("retrieval_mode") == "all_replicas":
            copies = R
        total += tensor_bytes(info) * copies
    return total


# --- the compiled program's arrays ----------------------------------------------------------
def transient_peak(program, cg, _memo: Optional[Dict[int, int]] = None) -> int:
    """The most bytes that kernels of one run of compiled graph `cg` hold at once outside the
    memory plan (values left to their kernels, graph outputs), called graphs included where
    they are called. Views and in-place results take no new memory."""
    from ..engine.kernels.registry import spec_of

    memo = {} if _memo is None else _memo
    key = id(cg)
    if key in memo:
        return memo[key]
    memo[key] = 0                              # (recursion guard)
    gd: GraphData = program.ir.graphs[cg.gid]
    plan = cg.memory_plan
    last: Dict[str, int] = {}
    for pos, op in enumerate(cg.ops):
        for t in op.inputs:
            last[t] = pos
    keep = set(gd.outputs) if cg.gid else set()
    live: Dict[str, int] = {}
    now = peak = 0
    for pos, op in enumerate(cg.ops):
        inner = 0
        if op.type in ("Call", "Loop"):
            inner = transient_peak(program, program.graph(op.called[0]), memo)
            spec = None
        elif op.type == "If":
            inner = max(transient_peak(program, program.graph(c), memo) for c in op.called)
            spec = None
        else:
            spec = spec_of(op)
        new = 0
        if spec is None or not (spec.view or spec.alias or spec.external
                                or (spec.modifies and spec.returns_input)):
            for t in op.outputs:
                if t in plan.assignment or t in plan.root_output:
                    continue
                info = gd.tensors.get(t)
                if info is not None and info.kind == TensorKind.INTERMEDIATE:
                    live[t] = tensor_bytes(info)
                    new += live[t]
        peak = max(peak, now + max(inner, new))
        now += new
        for t in set(op.inputs) | set(op.outputs):
            if t in live and last.get(t, pos) <= pos and t not in keep:
                now -= live.pop(t)
    memo[key] = peak
    return peak


@dataclass
class GraphMemory:
    """One compiled graph: its memory plan's buffers (per replica, kept between runs) and the
    peak of the values its kernels allocate during a run."""

    graph: str
    ops: int
    plan_bytes: int
    plan_buffers: int
    transient_bytes: int


@dataclass
class IrMemory:
    """The memory estimate of one Ir on a launch (see the module docstring). Byte counts are per
    replica unless named otherwise."""

    name: str
    replicas: int                    # replicas of this process's Ir (local ones for popdist)
    blocks: List[Tuple[int, int]]    # replica blocks of the workers (processes or threads)
    separate_workers: bool           # workers are processes other than the host
    variables: int = 0
    rts_shards: int = 0
    remote_buffers: int = 0
    plan_buffers: int = 0
    transient: int = 0
    stream_in: int = 0
    stream_out: int = 0
    ir_arrays: int = 0               # the Ir's own arrays (each worker process has a copy)
    host_weights: int = 0
    graphs: List[GraphMemory] = field(default_factory=list)

    @property
    def per_replica(self) -> int:
        return (self.variables + self.rts_shards + self.remote_buffers + self.plan_buffers
                + self.transient + self.stream_in + self.stream_out)

    def worker_bytes(self, w: int) -> int:
        """What worker w adds for its replicas (and its copy of the Ir when it is a process of
        its own other than the host)."""
        lo, hi = self.blocks[w]
        own_ir = self.ir_arrays if self.separate_workers and w > 0 else 0
        return (hi - lo) * self.per_replica + own_ir

    def host_bytes(self) -> int:
        """What the host (the script's process) adds besides its workers: the host weights
        and the run's host transfer buffers."""
        return self.host_weights + self.replicas * (self.stream_in + self.stream_out)


def estimate(ir: IrData, workers: int, separate_workers: bool, name: str = "",
             program=None) -> IrMemory:
    """The memory estimate of `ir` with its replicas on `workers` workers (compiles the program
    for its memory plans unless `program` is given; nothing is allocated)."""
    from ..engine.comm import Layout
    from ..engine.compile import Program

    R = ir.instance.local if getattr(ir, "instance", None) is not None else ir.replication_factor
    layout = Layout(R, workers)
    if program is None:
        program = Program(ir)
    mem = IrMemory(name=name, replicas=R, blocks=list(layout.blocks),
                   separate_workers=separate_workers)
    mem.variables, mem.rts_shards = _state_bytes(ir)
    mem.remote_buffers = _remote_bytes(ir)
    mem.stream_in, mem.stream_out = _stream_bytes(ir)
    mem.ir_arrays = _data_bytes(ir)
    mem.host_weights = _host_weight_bytes(ir)
    graphs = [("main", program.main), ("weights_from_host", program.weights_from_host),
              ("weights_to_host", program.weights_to_host)]
    graphs += [(gid, program.graph(gid)) for gid in ir.graphs if gid]
    memo: Dict[int, int] = {}
    for label, cg in graphs:
        gm = GraphMemory(label, len(cg.ops), cg.memory_plan.peak_bytes,
                         cg.memory_plan.num_buffers, transient_peak(program, cg, memo))
        mem.graphs.append(gm)
        mem.plan_buffers += gm.plan_bytes
    mem.transient = max((g.transient_bytes for g in mem.graphs), default=0)
    return mem


# --- the base of a process --------------------------------------------------------------------
_BASE_PROBE = r"""
import json, sys
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
import numpy as np, popxl, popxl.ops as ops
for name in sys.argv[1:]:
    __import__(name)
imported = rss()
ir = popxl.Ir()
with ir.main_graph:
    xs = popxl.h2d_stream((64, 64), popxl.float32, "x")
    w = popxl.variable(np.ones((64, 64), np.float32))
    x = ops.host_load(xs, "x")
    y = ops.layer_norm(ops.gelu(x @ w), popxl.constant(np.ones(64, np.float32)),
                       popxl.constant(np.zeros(64, np.float32)))
    ys = popxl.d2h_stream(y.shape, y.dtype, "y")
    ops.host_store(ys, y)
with popxl.Session(ir, "cpu") as s:
    s.run({xs: np.ones((64, 64), np.float32)})
print(json.dumps({"imported": imported, "ran": rss()}))
"""

_BACKEND_MODULES = {"local": [], "mpi": ["mpi4py.MPI"], "ray": ["ray"]}


def measure_base(backend: str = "local") -> Dict[str, int]:
    """The resident set of a fresh interpreter that imported popxl-dist (and the backend's
    library): `imported`; and after a first run of a small program (the engine's compiled loops
    loaded): `ran`. Measured in a child process with this process's environment (the backend
    variables removed: the probe runs in one process)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("POPXL_", "POPDIST_", "OMPI_", "PMI_", "MPI_"))}
    out = subprocess.run([sys.executable, "-c", _BASE_PROBE, *_BACKEND_MODULES.get(backend, [])],
                         capture_output=True, text=True, env=env, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"measuring the base memory of a process failed: "
                           f"{out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- the warning at Session creation ----------------------------------------------------------
def arrays_lower_bound(ir: IrData, workers: int, separate_workers: bool) -> int:
    """The bytes a Session of `ir` will certainly allocate on this machine (device state, remote
    buffers, the workers' copies of the Ir, the host weights), without compiling anything."""
    R = ir.instance.local if getattr(ir, "instance", None) is not None else ir.replication_factor
    variables, shards = _state_bytes(ir)
    copies = max(min(workers, R) - 1, 0) if separate_workers else 0
    return (R * (variables + shards + _remote_bytes(ir)) + copies * _data_bytes(ir)
            + _host_weight_bytes(ir))


def check_fits(ir: IrData, workers: int, separate_workers: bool,
               stacklevel: int = 2) -> Optional[str]:
    """Warn (MemoryWarning) when the arrays a Session of `ir` will allocate on this machine
    exceed its available memory; the message, or None when it fits."""
    need = arrays_lower_bound(ir, workers, separate_workers)
    have = available_memory()
    if have is None or need <= have:
        return None
    msg = (f"this program needs at least {fmt_bytes(need)} for its variables, remote buffers "
           f"and their copies ({ir.replication_factor} replica(s) on {workers} worker(s)), more "
           f"than this machine's {fmt_bytes(have)} available: it will swap or be killed. "
           f"`popxl-inspect SCRIPT.py` prints the whole estimate per replica and worker")
    warnings.warn(msg, MemoryWarning, stacklevel=stacklevel + 1)
    return msg


def launch_shape(ir: IrData) -> Tuple[int, bool]:
    """(workers, whether they are processes other than the host) of a Session of `ir` created
    now: `POPXL_BACKEND` / `POPXL_WORKERS` as `create_runtime` reads them; a popdist instance
    counts its own process only."""
    from ..runtime.env import backend_name, worker_count

    if getattr(ir, "instance", None) is not None:
        return 1, False
    name = backend_name()
    if name == "local":
        return worker_count(default=1), False
    return worker_count(default=2), True


def check_session_fits(ir: IrData) -> Optional[str]:
    """`check_fits` for the launch a Session of `ir` gets now."""
    workers, separate = launch_shape(ir)
    return check_fits(ir, workers, separate, stacklevel=4)    # warns at the Session's maker
