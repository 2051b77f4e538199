"""The executor: a Worker owns a block of replicas (their device memory) and runs a Program on them.

A worker is the only place its replicas' variables (and later remote buffers and RTS shards) live
while a Session is attached. Backends place workers: in the calling process (`local`), on MPI
ranks or Ray actors; the protocol is `weights_from_host`, `run`, `weights_to_host`.
"""
from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._ir.records import IrData, TensorKind
from ..dtypes import storage_numpy
from ..errors import (CollectiveTimeout, EngineError, EngineRuntimeError, NonFiniteError,
                      RunAborted, WorkerError)
from ..runtime.cores import worker_threads
from ..runtime.env import positive_int
from .comm import Communicator, Layout
from . import parallel
from .compile import CollectiveStep, Program, explain_error
from .memory_plan import aligned_copy
from .flight import (FlightRecorder, attach as attach_flight, dump as flight_dump,
                     merge_peers as merge_flights)
from .instrument import Instrument
from .kernels._util import fp_events
from .nonfinite import call_chain, floating_point_error
from .profiler import RUN, WorkerProfiler, clock
from .recorder import Recorder
from .replica_check import ReplicaCheck

__all__ = ["ReplicaContext", "Worker", "group_layout", "shard_of", "unshard"]


class ReplicaContext:
    """One replica's device memory and its host-stream cursors for the current run."""

    __slots__ = ("replica", "state", "in_chunks", "in_count", "out_chunks", "out_count",
                 "remote", "prints", "buffers", "run", "taps", "sites", "prof")

    def __init__(self, replica: int, n_state: int, n_in: int, n_out: int):
        self.replica = replica
        self.state: List[Optional[np.ndarray]] = [None] * n_state
        self.in_chunks: List[Sequence[np.ndarray]] = [()] * n_in
        self.in_count = [0] * n_in
        self.out_chunks: List[Sequence[np.ndarray]] = [()] * n_out
        self.out_count = [0] * n_out
        self.remote: Dict[int, np.ndarray] = {}
        self.prints: List[str] = []       # PrintTensor output of the current run
        self.buffers: Dict[object, List[np.ndarray]] = {}   # memory-plan buffers, per graph
        self.run = 0                      # the Session's run number (1 for the first run)
        self.taps: List[tuple] = []       # tensors kept this run (see engine/instrument.py)
        self.sites: List[int] = []        # the control-flow ops being run (taps' call sites)
        self.prof: List[tuple] = []       # the profiler's op records of the current run

    def next_input(self, slot: int) -> np.ndarray:
        k = self.in_count[slot]
        self.in_count[slot] = k + 1
        chunks = self.in_chunks[slot]
        return chunks[k % len(chunks)]

    def store_output(self, slot: int, value: np.ndarray) -> None:
        k = self.out_count[slot]
        self.out_count[slot] = k + 1
        chunks = self.out_chunks[slot]
        chunks[k % len(chunks)][...] = value


def replica_threads(local_replicas: int, workers: int) -> int:
    """How many of a worker's replicas run at once: one per thread of the worker's budget
    (`runtime.cores.worker_threads`: `POPXL_THREADS`, else the machine's cores divided among the
    workers on it), at most its replica count; `POPXL_REPLICA_THREADS` sets it. Each replica
    computes exactly as when run alone (its own buffers and scratch), and collectives combine
    the replicas in replica order, so the bits do not depend on it."""
    n = positive_int("POPXL_REPLICA_THREADS")
    if n is not None:
        return max(1, min(n, local_replicas))
    return max(1, min(local_replicas, worker_threads(workers)))


def op_threads(replicas_at_once: int, workers: int) -> int:
    """The threads each running replica computes its ops with (`engine/parallel.py`): the
    worker's budget divided among the replicas it runs at once."""
    return max(1, worker_threads(workers) // max(1, replicas_at_once))


def _replica_span(replicas: Sequence[int]) -> str:
    """`replica 3` or `replicas 2..5` (a contiguous block)."""
    replicas = list(replicas)
    if len(replicas) == 1:
        return f"replica {replicas[0]}"
    return f"replicas {replicas[0]}..{replicas[-1]}"


def shard_of(value: np.ndarray, info, replica: int, size: int) -> np.ndarray:
    """Replica `replica`'s 1-D shard of an RTS variable's per-group `value`: the data flattened,
    zero-padded to `shard_over * size`, chunk `index_in_group % shard_over`."""
    rg = info.extra.get("replica_grouping")
    i = rg.index_in_group(replica) if rg is not None else replica
    k = info.extra["shard_over"]
    flat = np.asarray(value).reshape(-1)
    j = i % k
    out = np.zeros((size,), dtype=storage_numpy(info.dtype))
    part = flat[j * size:(j + 1) * size]
    out[:part.size] = part
    return out


def unshard(shards: Sequence[np.ndarray], shape: Tuple[int, ...]) -> np.ndarray:
    """The full value from shards 0..k-1 in order (padding dropped)."""
    n = int(np.prod(shape, dtype=np.int64))
    return np.concatenate([np.asarray(s).reshape(-1) for s in shards])[:n].reshape(shape)


def group_layout(info, replication_factor: int) -> Tuple[object, int]:
    """(grouping, number of groups) of a variable TensorInfo."""
    rg = info.extra.get("replica_grouping")
    if rg is None:
        return None, 1
    return rg, rg.num_groups


class Worker:
    """Runs the compiled program on the replicas its communicator holds (a contiguous block).

    Without collectives each replica runs the graph in turn. Graphs with collectives compile to
    generators and the replicas run in lockstep: each runs up to its next collective, then the
    communicator combines every local replica's inputs (and other workers') in one step.
    """

    def __init__(self, ir: IrData, comm: Optional[Communicator] = None):
        self.ir = ir
        self.debug = ir.debug
        self.program = Program(ir, self._instrument())
        self.plain_program = self.program
        self.runs = 0                          # Session.run calls served
        self.replica_check = ReplicaCheck(ir) if self.debug.check_replicas else None
        self.comm = comm or Communicator(Layout(ir.replication_factor, 1), 0)
        self.replicas = list(self.comm.replicas)
        self.flight = FlightRecorder(self.comm.worker, self.replicas, self.debug.flight_size)
        self.profiler = (WorkerProfiler(self.comm.worker, self.replicas)
                         if self.debug.profile_dir else None)
        self.recorder = (Recorder(self.debug.record_dir, self.debug.session_tag)
                         if self.debug.record_dir else None)
        p = self.program
        self.ctxs = [ReplicaContext(r, len(p.state_ids), len(p.h2d_streams), len(p.d2h_streams))
                     for r in self.replicas]
        for ctx in self.ctxs:
            for bid, rec in ir.remote_buffers.items():
                # Entries not tied to a variable start at zero (undefined upstream).
                ctx.remote[bid] = np.zeros((rec["entries"], *rec["shape"]),
                                           storage_numpy(rec["dtype"]))
        self._single = len(self.ctxs) == 1
        # Floating-point events (overflow to inf, 0/0, x/0) give their IEEE results silently,
        # as on the IPU, unless the program enabled SessionOptions.enableFloatingPointChecks:
        # then they raise, naming the op. One errstate per run (and per replica thread: NumPy's
        # error state is per thread), not per kernel.
        self._fp_events = (dict(divide="raise", over="raise", invalid="raise", under="ignore")
                           if getattr(ir, "floating_point_checks", False) else dict(all="ignore"))
        self._pool = None
        workers = self.comm.layout.num_workers
        n = replica_threads(len(self.ctxs), workers)
        self._op_threads = op_threads(n, workers)
        if n > 1:
            self._pool = ThreadPoolExecutor(max_workers=n - 1,
                                            thread_name_prefix="popxl-replica")
            weakref.finalize(self, self._pool.shutdown, wait=False)

    def _instrument(self, taps: Optional[Dict[str, Sequence[str]]] = None
                    ) -> Optional[Instrument]:
        d = self.debug
        instr = Instrument(checks=d.checks_values, fp_checks=d.fp_checks, taps=taps,
                           profile=bool(d.profile_dir))
        return instr if instr.active else None

    # --- taps ----------------------------------------------------------------------------
    def set_taps(self, taps: Optional[Dict[str, Sequence[str]]]) -> None:
        """Keep the values of these tensors (`{graph id: tensor ids}`) in every run from now on
        (the program is compiled again with taps), or stop keeping them (None)."""
        self.program = (Program(self.ir, self._instrument(taps)) if taps
                        else self.plain_program)
        for ctx in self.ctxs:
            ctx.buffers.clear()          # the other program's buffers: allocated again on use
            ctx.taps = []

    def take_profile(self) -> Optional[dict]:
        """The profiler's records since the last call (None when not profiling)."""
        return self.profiler.take() if self.profiler is not None else None

    def take_taps(self) -> Dict[int, List[tuple]]:
        """`{replica: [(graph id, tensor id, call sites, value), ...]}` kept by the last run."""
        return {ctx.replica: list(ctx.taps) for ctx in self.ctxs}

    # --- weights -----------------------------------------------------------------------
    def write_weights(self, values: Dict[str, np.ndarray]) -> None:
        """Copy host values (upstream's host layout: `(G, *shape)` for G > 1 groups, or
        `(R, *shape)` for `all_replicas` variables) into the replicas' variables: on-chip state,
        a remote buffer entry, or this replica's shard of an RTS variable."""
        idx = self.program.state_index
        main = self.ir.main
        n_replicas = self.ir.replication_factor
        for tid, host in values.items():
            info = main.tensors[tid]
            rg, groups = group_layout(info, n_replicas)
            # `all_replicas` host buffers (after a weights_to_host) hold one value per replica.
            per_replica = (info.extra.get("retrieval_mode") == "all_replicas"
                           and (rg is None or rg.group_size > 1)
                           and host.shape == (n_replicas, *info.shape))
            remote = info.extra.get("remote")
            for ctx in self.ctxs:
                if per_replica:
                    src = host[ctx.replica]
                else:
                    src = host[rg.group_of(ctx.replica)] if groups > 1 else host
                if remote is not None:
                    entry = self._stored(ctx, tid)
                    if info.extra.get("sharded"):
                        entry[...] = shard_of(src, info, ctx.replica, entry.size)
                    else:
                        entry[...] = src
                    continue
                cur = ctx.state[idx[tid]]
                if cur is None or cur.shape != info.shape:
                    ctx.state[idx[tid]] = aligned_copy(src, storage_numpy(info.dtype))
                else:
                    cur[...] = src

    def _stored(self, ctx: ReplicaContext, tid: str) -> np.ndarray:
        """Where variable `tid` lives on replica `ctx`: a view in the variable's shape (an RTS
        variable: this replica's shard, flat), also for a buffer entry of another shape."""
        info = self.ir.main.tensors[tid]
        remote = info.extra.get("remote")
        if remote is not None:
            entry = ctx.remote[remote[0]][remote[1], ...]
            return entry.reshape(-1 if info.extra.get("sharded") else info.shape)
        return ctx.state[self.program.state_index[tid]]

    def read_replicas(self, wanted: Dict[str, Sequence[int]]) -> Dict[str, Dict[int, np.ndarray]]:
        """`{tid: {replica: stored value}}` for the (local, global-index) replicas asked for
        (copies; an RTS variable gives the replica's shard)."""
        first = self.replicas[0]
        return {t: {r: self._stored(self.ctxs[r - first], t).copy() for r in rs}
                for t, rs in wanted.items()}

    def copy_to(self, dst: "Worker", plan: Sequence[Tuple[str, str, Sequence[Tuple[int, int]]]]
                ) -> None:
        """Copy variables into `dst`, another session's Worker on this same worker: `plan` is
        `[(source id, destination id, [(destination replica, source replica), ...])]` (see
        `runtime.backends.copy.plan_copy`). RTS variables are copied shard by shard."""
        s_first, d_first = self.replicas[0], dst.replicas[0]
        d_index = dst.program.state_index
        for s_tid, d_tid, pairs in plan:
            remote = "remote" in dst.ir.main.tensors[d_tid].extra
            for r, s in pairs:
                value = self._stored(self.ctxs[s - s_first], s_tid)
                ctx = dst.ctxs[r - d_first]
                if remote:
                    dst._stored(ctx, d_tid)[...] = value
                    continue
                cur = ctx.state[d_index[d_tid]]
                if cur is None or cur.shape != value.shape:
                    ctx.state[d_index[d_tid]] = aligned_copy(value, value.dtype)
                else:
                    cur[...] = value

    def memory_report(self) -> Dict[str, int]:
        """Bytes of device memory of this worker's first replica, by kind."""
        ctx = self.ctxs[0]
        main = self.ir.main
        on_chip = rts = 0
        for tid, arr in zip(self.program.state_ids, ctx.state):
            if arr is None:
                continue
            if main.tensors[tid].kind == TensorKind.VARIABLE:
                on_chip += arr.nbytes
            else:
                rts += arr.nbytes
        return {"replica": ctx.replica, "variables": on_chip, "rts_shards": rts,
                "remote_buffers": sum(a.nbytes for a in ctx.remote.values())}

    def take_prints(self) -> List[str]:
        """The PrintTensor lines of the last run, replica by replica (and clears them)."""
        out: List[str] = []
        for ctx in self.ctxs:
            out.extend(ctx.prints)
            ctx.prints.clear()
        return out

    def run_fragment(self, which: str) -> None:
        cg = getattr(self.program, which)
        if cg.ops:
            self._execute(cg, which)

    # --- run ---------------------------------------------------------------------------
    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run the main program once. `inputs[s]` / `outputs[s]` are `(T, R_local, *shape)`
        arrays for stream slot s."""
        self.runs += 1
        self.comm.run = self.runs
        self.flight.new_run(self.runs)
        if self.recorder is not None:
            self.recorder.start(self, self.runs, inputs)
            self.recorder.expect_outputs(outputs)
        for j, ctx in enumerate(self.ctxs):
            ctx.run = self.runs
            if ctx.taps:
                ctx.taps = []
            ctx.sites.clear()
            for s, arr in enumerate(inputs):
                chunks = [arr[t, j, ...] for t in range(arr.shape[0])]
                for c in chunks:
                    c.flags.writeable = False
                ctx.in_chunks[s] = chunks
                ctx.in_count[s] = 0
            for s, arr in enumerate(outputs):
                ctx.out_chunks[s] = [arr[t, j, ...] for t in range(arr.shape[0])]
                ctx.out_count[s] = 0
        try:
            self._execute(self.program.main)
            self._zero_unstored_transfers()
            if self.replica_check is not None:
                self.replica_check.check(
                    self.comm, [[self._stored(ctx, t) for t, _ in self.replica_check.run_parts]
                                for ctx in self.ctxs], self.runs)
        except BaseException as e:
            if self.recorder is not None:
                self._save_recording(e)
            raise
        if self.recorder is not None:
            self.recorder.succeeded(outputs)

    def save_recording(self) -> Optional[str]:
        """Write this worker's part of the latest run's replay bundle (POPXL_RECORD); its
        directory, or None when not recording or nothing ran yet."""
        return self._save_recording(None) if self.recorder is not None else None

    def _save_recording(self, error: Optional[BaseException]) -> Optional[str]:
        try:
            path = self.recorder.save(self, error)
        except OSError as e:           # the run's own failure matters more than its record
            if error is not None:
                error.replay_bundle = f"(not written: {e})"
            return None
        if error is not None and path and not getattr(error, "replay_bundle", None):
            error.replay_bundle = path
            if isinstance(error, Exception) and error.args and isinstance(error.args[0], str) \
                    and not isinstance(error, RunAborted):
                note = f"\n  replay it in one process: popxl-replay {path}"
                if hasattr(error, "flight_base"):
                    error.flight_base += note
                error.args = (error.args[0] + note,) + error.args[1:]
        return path

    def _zero_unstored_transfers(self) -> None:
        """A d2h stream stored k times in a run, fewer than its output's transfers T, leaves
        transfers k..T-1 unwritten (upstream: whatever the host buffer held, `np.empty` memory
        for `Session.run`). Here they are zero, on every backend."""
        for ctx in self.ctxs:
            for chunks, k in zip(ctx.out_chunks, ctx.out_count):
                for chunk in chunks[k:]:
                    chunk[...] = 0

    def _execute(self, cg, kind: str = RUN) -> None:
        if self.profiler is not None:
            with self.profiler.running(kind, self.runs, self.ctxs):
                self._run_graph(cg)
        else:
            self._run_graph(cg)

    def _run_graph(self, cg) -> None:
        with fp_events(self._fp_events), parallel.threads(self._op_threads):
            if cg.has_collectives:
                self._lockstep(cg)
                return
            if self._pool is not None:
                self._each_replica(lambda ctx, _: cg.run(ctx), [None] * len(self.ctxs))
                return
            for ctx in self.ctxs:
                try:
                    cg.run(ctx)
                except Exception as e:  # noqa: BLE001 - re-raised naming the replica and op
                    err = self._explain(e, ctx.replica)
                    if err is e:
                        raise
                    raise err from e

    def _in_fp_state(self, fn, ctx, arg):
        with fp_events(self._fp_events), parallel.threads(self._op_threads):
            return fn(ctx, arg)

    def _each_replica(self, fn, args: Sequence) -> list:
        """`fn(ctx, arg)` for every local replica, in parallel threads (this thread runs the
        first replica); returns the results in replica order, or raises the first replica's
        failure (in replica order) once all have stopped."""
        futures = [self._pool.submit(self._in_fp_state, fn, ctx, a)
                   for ctx, a in zip(self.ctxs[1:], args[1:])]
        results, errors = [], []
        try:
            results.append(fn(self.ctxs[0], args[0]))
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the others
            results.append(None)
            errors.append((self.ctxs[0], e))
        for ctx, f in zip(self.ctxs[1:], futures):
            try:
                results.append(f.result())
            except BaseException as e:  # noqa: BLE001
                results.append(None)
                errors.append((ctx, e))
        if errors:
            ctx, e = errors[0]
            err = self._explain(e, ctx.replica) if isinstance(e, Exception) else e
            if err is e:
                raise e
            raise err from e
        return results

    def _explain(self, exc: BaseException, replica: int) -> BaseException:
        """An EngineError naming the op (and the replica when there are several); another
        worker's failure (e.g. raised by the Ray backend's watchdog) passes unchanged."""
        if isinstance(exc, (WorkerError, RunAborted)):
            return exc
        if isinstance(exc, NonFiniteError):
            return self._with_call_sites(exc)
        if isinstance(exc, FloatingPointError):
            found = self.program.failing_frame(exc)
            if found is not None:
                op, gid, values = found
                err = floating_point_error(op, gid, replica, self.runs, exc,
                                           [values.get(t) for t in op.inputs])
                return self._with_call_sites(err, exc)
        err = explain_error(self.program, exc)
        if self.ir.replication_factor > 1:
            op = getattr(err, "op", None)
            text = str(err) if err is not exc else f"{type(exc).__name__}: {exc}"
            cls = EngineRuntimeError if isinstance(err, EngineRuntimeError) else EngineError
            err = cls(f"replica {replica}: {text}")
            err.op = op
        if err is not exc:
            err.replica = replica
        return err

    def _with_call_sites(self, err: NonFiniteError,
                         raised: Optional[BaseException] = None) -> NonFiniteError:
        """`err` with the call sites of its graph added (once), outermost first (found in the
        traceback of `raised`, default `err`)."""
        if getattr(err, "_sites_added", False):
            return err
        chain = call_chain(self.program, raised or err)
        err._sites_added = True
        if chain:
            sites = "".join(f"\n  called from {op.describe()} in "
                            f"{'graph ' + repr(g) if g else 'the main graph'}"
                            for op, g in chain)
            err.args = (f"{err.args[0]}{sites}",) + err.args[1:]
        return err

    def _lockstep(self, cg) -> None:
        """Run every local replica's generator to its next collective, run the collective for all
        of them at once, and repeat until all finish."""
        gens = [cg.run(ctx) for ctx in self.ctxs]
        sends: List[object] = [None] * len(gens)
        comm = self.comm
        by_ctx = {id(ctx): gen for ctx, gen in zip(self.ctxs, gens)}
        flight = self.flight

        def advance(ctx, value):
            try:
                return by_ctx[id(ctx)].send(value)
            except StopIteration:
                flight.finish(ctx.replica)
                return None

        while True:
            if self._pool is not None:
                steps = self._each_replica(advance, sends)
            else:
                steps = []
                for ctx, value in zip(self.ctxs, sends):
                    try:
                        steps.append(advance(ctx, value))
                    except Exception as e:  # noqa: BLE001
                        err = self._explain(e, ctx.replica)
                        if err is e:
                            raise
                        raise err from e
            first = steps[0]
            if first is None and all(s is None for s in steps):
                return
            step: CollectiveStep = first[0] if first is not None else None
            if any(s is None or s[0] is not step for s in steps):
                for ctx, s in zip(self.ctxs, steps):
                    if s is not None:
                        flight.start(ctx.replica, s[0].op, s[1])
                raise self._flight_report(EngineError(self._divergence(steps)))
            comm.tag = step.tag
            records = [flight.start(ctx.replica, step.op, s[1])
                       for ctx, s in zip(self.ctxs, steps)]
            began = clock()
            try:
                sends = step.fn(comm, [s[1] for s in steps])
            except CollectiveTimeout as e:
                if e.op is not None:
                    raise self._flight_report(e)   # another worker's, already described
                raise self._flight_report(self._timed_out(step.op, e)) from None
            except (WorkerError, RunAborted) as e:
                raise self._flight_report(e)     # another worker's failure, already described
            except NonFiniteError as e:
                raise self._with_call_sites(e) from None
            except Exception as e:  # noqa: BLE001
                hint = (" (a floating-point exception: the program enabled "
                        "SessionOptions.enableFloatingPointChecks)"
                        if isinstance(e, FloatingPointError) else "")
                err = EngineError(f"{step.op.describe()} failed on replicas "
                                  f"{self.replicas[0]}..{self.replicas[-1]}: "
                                  f"{type(e).__name__}: {e}{hint}")
                err.op = step.op
                raise self._flight_report(err) from e
            flight.end(records)
            if self.profiler is not None:
                self.profiler.step(step.ops, began)

    def _flight_report(self, err: BaseException) -> BaseException:
        """`err` with this worker's flight records (and them written to
        POPXL_FLIGHT_RECORDER's directory when set)."""
        snapshot = self.flight.snapshot()
        if self.debug.flight_dir:
            try:
                path = flight_dump(self.debug.flight_dir, self.debug.session_tag,
                                   self.comm.worker, snapshot, f"{type(err).__name__}: {err}")
                err.flight_files = getattr(err, "flight_files", ()) + (path,)
            except OSError as e:       # the failure matters more than its dump
                err.flight_files = (f"(not written: {e})",)
        if getattr(err, "flight", None) is not None:     # another worker's, with its records
            return merge_flights(err, [snapshot])
        return attach_flight(err, snapshot)

    def _timed_out(self, op, exc: CollectiveTimeout) -> CollectiveTimeout:
        """The transport's timeout, naming the op, the replicas that waited and the silent
        workers with their replicas."""
        layout = self.comm.layout
        silent = ", ".join(f"worker {w} ({_replica_span(layout.replicas_of(w))})"
                           for w in exc.workers)
        err = CollectiveTimeout(
            f"{op.describe()}: collective timed out on {_replica_span(self.replicas)} (worker "
            f"{self.comm.worker}) waiting for {silent or 'its peers'}, which sent nothing "
            f"(stopped, hung, or far slower than the others): {exc}")
        err.op, err.replicas, err.workers = op, tuple(self.replicas), tuple(exc.workers)
        return err

    def _divergence(self, steps) -> str:
        where = []
        for ctx, s in zip(self.ctxs, steps):
            where.append(f"replica {ctx.replica}: "
                         + ("finished" if s is None else f"at {s[0].op.describe()}"))
        return ("replicas diverged: they must run the same collectives in the same order ("
                + "; ".join(where) + ")")
