"""Running a job's root process (`mpiexec`) so that nothing of the job outlives `popxl-run`,
whatever stops it:

- SIGTERM or SIGHUP: forwarded to mpiexec as SIGTERM (it signals every rank and ends the job);
  after a grace period mpiexec is killed. The exit code is 128 + the signal.
- Ctrl-C: every rank receives it too (same process group; the process manager's own forward
  is ignored by the rank wrappers, so each rank sees one) and the host script handles
  KeyboardInterrupt; if the job is still running after the grace period (or at a second
  Ctrl-C) mpiexec gets SIGTERM, then it is killed.
- SIGKILL: cannot be caught; mpiexec is started with a parent-death signal (SIGTERM, on Linux),
  and every rank watches the launcher named by `POPXL_LAUNCHER` and exits when it is gone
  (`popxl.runtime.process.liveness`).
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, Optional, Sequence

__all__ = ["run_job", "launcher_ref", "die_with_parent", "kill_tree"]

# Read by every rank (popxl.runtime.process.liveness.LAUNCHER_ENV; not imported: popxl-run starts
# without importing popxl).
LAUNCHER_ENV = "POPXL_LAUNCHER"

_GRACE = 5.0          # seconds mpiexec gets to end the job after a signal, before it is killed
DONE_GRACE = 5.0      # seconds the job gets to end once its script has ended (`done_file`)
_PR_SET_PDEATHSIG = 1


class _Stop(Exception):
    """Raised by the handler of a stopping signal (to leave a blocking wait)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def launcher_ref() -> str:
    """This process as `host:pid:start_time` (the format of
    `popxl.runtime.process.liveness.ProcessRef`)."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        start = -1
    return f"{socket.gethostname()}:{os.getpid()}:{start}"


def die_with_parent(parent: int):
    """A `preexec_fn`: the child gets SIGTERM when this process dies (Linux)."""
    def setup() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:      # the parent died before the prctl took effect
            os._exit(1)
    return setup


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` and every process it started (the job's ranks and their wrappers: a rank
    that is stopped or ignores signals would otherwise outlive the job)."""
    # imported here: the launchers start without popxl
    from popxl.runtime.process.proc_tree import descendants
    for pid in [*descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run_job(cmd: Sequence[str], env: Dict[str, str], pass_fds: Sequence[int] = (),
            done_file: Optional[str] = None) -> int:
    """Run `cmd` (mpiexec ...) to completion and return its exit code, or 128 + the signal
    that stopped popxl-run (130 for Ctrl-C). The ranks find this process in `POPXL_LAUNCHER`.
    Once `done_file` exists (the script has ended), the job gets `DONE_GRACE` seconds to end
    before this machine's part of it is killed (at once if `done_file`.abandoned exists too:
    rank 0 ended without MPI_Finalize): across hosts, mpiexec waits for ever for a host that
    stopped answering (whose processes end by themselves)."""
    env = dict(env)
    env[LAUNCHER_ENV] = launcher_ref()
    preexec = die_with_parent(os.getpid()) if sys.platform.startswith("linux") else None
    proc = subprocess.Popen(list(cmd), env=env, pass_fds=tuple(pass_fds), preexec_fn=preexec)
    main = threading.current_thread() is threading.main_thread()
    previous = {}
    if main:
        stopping = []

        def on_signal(signum, frame):
            if not stopping:             # (a repeat must not interrupt the handling of the first)
                stopping.append(signum)
                raise _Stop(signum)

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _supervise(proc, done_file)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _supervise(proc: subprocess.Popen, done_file: Optional[str] = None) -> int:
    stopped_by: Optional[int] = None
    deadline: Optional[float] = None
    forwarded_interrupt = False
    done_at: Optional[float] = None
    while True:
        try:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if done_file is not None and deadline is None:
                try:
                    code = proc.wait(0.2)
                except subprocess.TimeoutExpired:
                    if done_at is None and os.path.exists(done_file):
                        done_at = time.monotonic()
                        if os.path.exists(done_file + ".abandoned"):
                            done_at -= DONE_GRACE       # rank 0 left the job as it is
                    if done_at is not None and time.monotonic() - done_at > DONE_GRACE:
                        # (not SIGTERM: hydra reports every proxy it cannot reach any more)
                        kill_tree(proc)
                        done_file = None
                    continue
            else:
                code = proc.wait(timeout)
            return code if stopped_by is None else 128 + stopped_by
        except _Stop as e:
            if stopped_by is None or stopped_by == signal.SIGINT:
                stopped_by = e.signum
                _send(proc, signal.SIGTERM)
                deadline = time.monotonic() + _GRACE
        except KeyboardInterrupt:
            if stopped_by is None:
                stopped_by = signal.SIGINT        # the ranks got the same Ctrl-C
                deadline = time.monotonic() + _GRACE
            elif not forwarded_interrupt:
                forwarded_interrupt = True         # a second Ctrl-C: end the job
                _send(proc, signal.SIGTERM)
        except subprocess.TimeoutExpired:
            if stopped_by == signal.SIGINT and not forwarded_interrupt:
                forwarded_interrupt = True
                _send(proc, signal.SIGTERM)
                deadline = time.monotonic() + _GRACE
            else:
                kill_tree(proc)
                deadline = None


def _send(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except OSError:
        pass
