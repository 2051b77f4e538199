"""The host side shared by the multi-worker backends: a `WorkerPool` answers commands on every
worker; `PoolRuntime` splits a Session's host arrays into the workers' replica blocks and puts
the results back together."""
from __future__ import annotations

import itertools
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from ..._ir.records import IrData
from ...engine.comm import Layout
from ...engine.compile import stream_slots
from ...errors import WorkerDied
from ..base import Runtime, host_value, needed_replicas, unwrap_printed
from ..transport.reported import with_flights

__all__ = ["WorkerPool", "PoolRuntime"]


class WorkerPool:
    """A fixed set of `size` workers. `call(sid, cmd, payloads)` runs `cmd` on workers
    0..len(payloads)-1 with one payload each and returns their results in order; it raises
    the first worker failure (naming the replica and op) after stopping the others."""

    name = "pool"
    size = 1
    closed = False      # set when the pool shuts down; sessions closing later do nothing
    _sids = itertools.count(1)
    _runs = itertools.count(1)
    _busy = 0           # calls in progress (a Session collected during one closes after it)
    _closing: List[int] = []

    def call(self, sid: int, cmd: str, payloads: Sequence[Any]) -> List[Any]:
        raise NotImplementedError

    def session_call(self, sid: int, cmd: str, payloads: Sequence[Any]) -> List[Any]:
        """`call`, after closing the Sessions collected while another call was running."""
        if self._closing and not self._busy:
            self._close_pending()
        self._busy += 1
        try:
            return self.call(sid, cmd, payloads)
        finally:
            self._busy -= 1

    def new_session(self, ir: IrData, layout: Layout) -> int:
        sid = next(self._sids)
        self.session_call(sid, "open", [(ir, layout)] * self.size)
        return sid

    def close_session(self, sid: int) -> None:
        """Free a Session on the workers. Called by the garbage collector, which may run in the
        middle of another call: the close then waits for the next call (a nested call would
        take that call's replies)."""
        if self.closed:
            return
        if self._busy:
            self._closing = self._closing + [sid]
            return
        self.call(sid, "close", [None] * self.size)

    def _close_pending(self) -> None:
        pending, self._closing = self._closing, []
        for sid in pending:
            try:
                self.close_session(sid)
            except Exception:  # noqa: BLE001 - as PoolRuntime.close: nothing left to free
                pass


class PoolRuntime(Runtime):
    """A Session's program on a WorkerPool: replicas in contiguous blocks, one per worker."""

    def __init__(self, ir: IrData, pool: WorkerPool):
        super().__init__(ir)
        self.pool = pool
        self.name = pool.name
        self.layout = Layout(ir.replication_factor, pool.size)
        self.num_workers = self.layout.num_workers
        self.h2d_streams, self.d2h_streams = stream_slots(ir)
        self.sid = pool.new_session(ir, self.layout)
        self._closed = False

    def _call(self, cmd: str, payloads: Sequence[Any]) -> List[Any]:
        try:
            return self.pool.session_call(self.sid, cmd, payloads)
        except WorkerDied as e:
            held = []
            for w in getattr(e, "workers", ()):
                if w < self.num_workers:
                    reps = list(self.layout.replicas_of(w))
                    held.append(f"worker {w} held replica{'s' if len(reps) > 1 else ''} "
                                f"{', '.join(map(str, reps))}")
            if not held:
                raise
            # The same error (type and fields), naming the replicas lost with the workers.
            err = type(e)(f"{e} ({'; '.join(held)})")
            err.__dict__.update(e.__dict__)
            raise err from None

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        payloads = []
        for lo, hi in self.layout.blocks:
            ins = [a[:, lo:hi] for a in inputs]
            specs = [((o.shape[0], hi - lo) + o.shape[2:], o.dtype) for o in outputs]
            payloads.append((ins, specs))
        try:
            replies = self._call("run", payloads)
        except BaseException as e:
            self._add_flights(e)
            raise
        results = [unwrap_printed(r) for r in replies]
        for (lo, hi), res in zip(self.layout.blocks, results):
            for o, r in zip(outputs, res):
                o[:, lo:hi] = r

    def _add_flights(self, err: BaseException) -> None:
        """A failed run's error that carries flight records gets every worker's (those that
        finished their part of the run too), when the workers can still answer."""
        if getattr(err, "flight", None) is None or getattr(self.pool, "broken", None):
            return
        try:
            snapshots = self._call("flight", [None] * self.num_workers)
        except Exception:  # noqa: BLE001 - the run's failure is what the caller must see
            return
        with_flights(err, snapshots)

    def run_fragment(self, which: str) -> None:
        for reply in self._call("run_fragment", [which] * self.num_workers):
            unwrap_printed(reply)

    def read_variables(self, tids: Sequence[str]) -> Dict[str, np.ndarray]:
        wanted = {t: needed_replicas(self.ir, t) for t in tids}
        payloads = [{t: [r for r in rs if lo <= r < hi] for t, rs in wanted.items()}
                    for lo, hi in self.layout.blocks]
        per_replica: Dict[str, List] = {t: [None] * self.ir.replication_factor for t in tids}
        for res in self._call("read", payloads):
            for t, by_r in res.items():
                for r, v in by_r.items():
                    per_replica[t][r] = v
        return {t: host_value(self.ir, t, per_replica[t]) for t in tids}

    def write_variables(self, values: Dict[str, np.ndarray]) -> None:
        self._call("write", [values] * self.num_workers)

    def memory_report(self) -> List[Dict[str, int]]:
        return self._call("memory", [None] * self.num_workers)

    def set_taps(self, taps) -> None:
        self._call("set_taps", [taps] * self.num_workers)

    def take_taps(self) -> Dict[int, list]:
        out: Dict[int, list] = {}
        for part in self._call("take_taps", [None] * self.num_workers):
            out.update(part)
        return out

    def save_recording(self) -> List[str]:
        return sorted({p for p in self._call("save_recording", [None] * self.num_workers) if p})

    def take_profile(self) -> List[dict]:
        return [p for p in self._call("take_profile", [None] * self.num_workers) if p]

    def blocks(self) -> List[Tuple[int, int]]:
        return list(self.layout.blocks)

    def shares_workers_with(self, other: Runtime) -> bool:
        return isinstance(other, PoolRuntime) and other.pool is self.pool

    def copy_to(self, other: Runtime, plans: Sequence[list]) -> None:
        self._call("copy_to", [(other.sid, plan) for plan in plans])

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.pool.close_session(self.sid)
            except Exception:  # noqa: BLE001 - a broken pool has nothing left to free
                pass
