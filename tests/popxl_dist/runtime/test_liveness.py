"""The pieces that keep faults visible without processes: the watchdog raising in the armed
thread, process references, the launcher reference popxl-run passes to the ranks, MPICH
segment unlinking, and a Session collected in the middle of a pool call."""
from __future__ import annotations

import mmap
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from popxl.errors import WorkerDied
from popxl.runtime.process.liveness import ProcessRef, Watchdog
from popxl.runtime.process.mpi_segments import mpich_segments, unlink_mpich_segments
from popxl.runtime.backends.pool import WorkerPool
from popxl_launch.supervise import launcher_ref


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_watchdog_raises_in_the_armed_thread_during_pure_python_work():
    found = threading.Event()

    def check():
        if found.is_set():
            err = WorkerDied("worker 3 died")
            err.workers = [3]
            return err
        return None

    dog = Watchdog(check, period=0.02)
    try:
        with pytest.raises(WorkerDied, match="worker 3 died") as info:
            with dog.armed():
                found.set()
                _busy(10)
        assert info.value.workers == [3]
        assert isinstance(dog.found, WorkerDied)
    finally:
        dog.stop()


def test_watchdog_outside_armed_only_records():
    dog = Watchdog(lambda: WorkerDied("gone"), period=0.01)
    try:
        deadline = time.monotonic() + 10
        while dog.found is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert isinstance(dog.found, WorkerDied)
        _busy(0.1)                # nothing is raised here
        with dog.armed():         # nor later: the first failure was already found
            _busy(0.1)
    finally:
        dog.stop()


def test_process_ref_tells_a_dead_process_and_pid_reuse():
    me = ProcessRef.current()
    assert not me.gone()
    assert ProcessRef.parse(str(me)).pid == me.pid
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ref = ProcessRef(me.host, proc.pid, -1)
    proc.wait()
    assert ref.gone()
    assert ProcessRef(me.host, me.pid, me.start + 1).gone()          # same pid, other process
    assert not ProcessRef("another-host", 1, 1).gone()                # cannot see it
    assert ProcessRef.parse("") is None and ProcessRef.parse("a:b:c") is None


def test_launcher_ref_is_what_the_ranks_parse():
    ref = ProcessRef.parse(launcher_ref())
    me = ProcessRef.current()
    assert (ref.host, ref.pid, ref.start) == (me.host, me.pid, me.start)


def test_unlink_mpich_segments_unlinks_what_this_process_maps():
    path = f"/dev/shm/mpich_shm_test_{uuid.uuid4().hex}"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        with mmap.mmap(fd, 4096):
            assert path in mpich_segments()
            unlink_mpich_segments()
            assert not os.path.exists(path)
            assert path in mpich_segments()          # still mapped, as "(deleted)"
    finally:
        os.close(fd)
        if os.path.exists(path):
            os.unlink(path)


class _RecordingPool(WorkerPool):
    size = 2

    def __init__(self):
        self.log = []
        self.during = None

    def call(self, sid, cmd, payloads):
        self.log.append((cmd, sid))
        if self.during is not None:      # the garbage collector runs a finalizer here
            during, self.during = self.during, None
            during()
        return [None] * len(payloads)


def test_a_session_closed_during_a_call_is_closed_after_it():
    pool = _RecordingPool()
    pool.during = lambda: pool.close_session(7)
    pool.session_call(1, "run", [None, None])
    assert pool.log == [("run", 1)]              # not nested inside the run
    pool.session_call(1, "run", [None, None])
    assert pool.log == [("run", 1), ("close", 7), ("run", 1)]
    pool.close_session(8)                        # outside a call: at once
    assert pool.log[-1] == ("close", 8)
