"""Waiting without spinning, and process liveness: shared by the MPI and Ray backends."""
from __future__ import annotations

import os
import time

__all__ = ["Backoff", "process_alive", "process_stopped", "process_start_time"]


class Backoff:
    """Polling that does not spin for long: for the first few milliseconds of a wait, yield the
    CPU between polls (a reply usually comes within them); then sleep, longer the longer the
    wait, so an idle process costs (almost) no CPU."""

    __slots__ = ("start",)
    SPIN = 0.003

    def __init__(self):
        self.start = time.monotonic()

    def wait(self) -> None:
        idle = time.monotonic() - self.start
        if idle < self.SPIN:
            os.sched_yield()      # not sleep(0): that costs the timer slack (~50-250 us)
        else:
            time.sleep(0.0001 if idle < 0.05 else 0.001 if idle < 1.0 else
                       0.005 if idle < 10.0 else 0.02)


def _stat_fields(pid: int):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def process_alive(pid: int) -> bool:
    """Whether process `pid` (on this host) is running; zombies count as dead."""
    try:
        return _stat_fields(pid)[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def process_stopped(pid: int) -> bool:
    """Whether process `pid` (on this host) is stopped (SIGSTOP, or a debugger's trace stop)."""
    try:
        return _stat_fields(pid)[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def process_start_time(pid: int) -> int:
    """The start time of `pid` in clock ticks since boot (tells a process from a later one that
    reuses its pid); -1 if it is gone or /proc is unavailable."""
    try:
        return int(_stat_fields(pid)[19])
    except (OSError, IndexError, ValueError):
        return -1
