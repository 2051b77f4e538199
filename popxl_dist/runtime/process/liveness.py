"""Liveness checked independently of what a process is doing: a `Watchdog` thread runs a check
every fraction of a second, so a worker that dies while the host computes a long loop with no
collective (and so does not poll) is reported within a second, and a worker whose host or
launcher died exits instead of waiting for ever.

A failure the check finds is raised in the thread that `armed()` the watchdog (asynchronously,
between two bytecodes: a NumPy call in progress finishes first); outside `armed()` it is only
recorded, and the next call that polls reports it. `exit_process` is for failures nobody can
handle: the process ends at once, without running MPI_Finalize or atexit handlers, which would
wait for the dead peer.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import sys
import threading
from typing import Callable, Iterator, Optional

from .polling import process_alive, process_start_time

__all__ = ["Watchdog", "ProcessRef", "exit_process", "LAUNCHER_ENV"]

# `host:pid:start_time` of the launcher (`popxl-run`) whose death ends every process of the job.
LAUNCHER_ENV = "POPXL_LAUNCHER"

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class ProcessRef:
    """A process by host, pid and start time (a later process that reuses the pid is not it)."""

    __slots__ = ("host", "pid", "start")

    def __init__(self, host: str, pid: int, start: int):
        self.host, self.pid, self.start = host, pid, start

    @classmethod
    def current(cls) -> "ProcessRef":
        pid = os.getpid()
        return cls(socket.gethostname(), pid, process_start_time(pid))

    @classmethod
    def parse(cls, text: str) -> Optional["ProcessRef"]:
        """From `host:pid:start` (as `str()` gives), or None for an empty or malformed value."""
        try:
            host, pid, start = text.rsplit(":", 2)
            return cls(host, int(pid), int(start))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}:{self.start}"

    def visible(self) -> bool:
        """Whether this host can see the process (it runs here)."""
        return self.host == socket.gethostname()

    def gone(self) -> bool:
        """Whether the process is known to have ended (False if it runs on another host)."""
        if not self.visible():
            return False
        if not process_alive(self.pid):
            return True
        return self.start >= 0 and process_start_time(self.pid) not in (self.start, -1)


def exit_process(reason: str, code: int = 1) -> None:
    """End this process now with `code`, after one line on stderr saying why."""
    try:
        sys.stderr.write(f"popxl-dist (pid {os.getpid()}): {reason}; exiting\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


def _raisable(exc: BaseException) -> type:
    """A subclass of `type(exc)` whose construction without arguments gives a copy of `exc`
    (the C API raises a class in another thread, not an instance)."""
    base = type(exc)
    args, attrs = exc.args, dict(getattr(exc, "__dict__", {}))

    def __init__(self, *a):
        base.__init__(self, *(a or args))
        self.__dict__.update(attrs)

    return type(base.__name__, (base,), {"__init__": __init__, "__module__": base.__module__,
                                         "__qualname__": base.__qualname__})


class Watchdog:
    """Calls `check()` every `period` seconds on a daemon thread until `stop()`. `check` returns
    None, or the exception to raise in the armed thread (it may also end the process with
    `exit_process`). The first exception is raised (and kept in `found`); later ones are not,
    but the checks go on (for their exits)."""

    def __init__(self, check: Callable[[], Optional[BaseException]], period: float = 0.25,
                 name: str = "popxl-watchdog"):
        self._check = check
        self.period = period
        self.found: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._armed: Optional[int] = None         # thread id to raise in
        self._raised = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """While inside, a failure the check finds is raised in the calling thread."""
        with self._lock:
            self._armed = threading.get_ident()
            self._raised = False
        try:
            yield
        finally:
            with self._lock:
                if self._raised:     # if not delivered yet, withdraw it (`found` still tells)
                    _set_async_exc(ctypes.c_ulong(self._armed), None)
                self._armed = None

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                exc = self._check()
            except Exception:  # noqa: BLE001 - a failed check must not end the watching
                continue
            if exc is None or self.found is not None:
                continue
            with self._lock:
                self.found = exc
                if self._armed is not None and not self._stop.is_set():
                    self._raised = True
                    _set_async_exc(ctypes.c_ulong(self._armed), ctypes.py_object(_raisable(exc)))
