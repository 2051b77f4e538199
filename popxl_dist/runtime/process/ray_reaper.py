"""The Ray backend's reaper: a small process the driver starts beside the local Ray it starts.
It reads lines on stdin until the driver closes it:

    kill PID START_TIME     a process of the job (Ray's own processes, the worker actors)
    shm PREFIX              the job's shared-memory segment names start with PREFIX
    done                    the driver cleaned up itself

If stdin closes without `done` (the driver was killed, even by SIGKILL, and could not clean
up), it kills every listed process that still runs (the same process: same start time) and
removes the job's segments. Ray's own fate-sharing takes its raylet and GCS down with the
driver, but not the dashboard and runtime-env agents, nor what a raylet left mid-start.

Standalone on purpose (no package imports): it starts fast and survives a broken install.
"""
import glob
import os
import signal
import sys


def _state(pid: int):
    """(state letter, start time) of `pid`, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _running(pid: int, start: int) -> bool:
    st = _state(pid)
    return st is not None and st[1] == start and st[0] not in ("Z", "X")


def main() -> int:
    # Ctrl-C and a closed terminal reach the driver's whole process group: outlive them.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    procs, prefixes, done = [], [], False
    for line in sys.stdin:
        word, *args = line.split() or [""]
        if word == "kill" and len(args) == 2:
            procs.append((int(args[0]), int(args[1])))
        elif word == "shm" and len(args) == 1:
            prefixes.append(args[0])
        elif word == "done":
            done = True
    if done:
        return 0
    # SIGKILL at once: these are orphans of a dead job (Ray's agents ignore SIGTERM).
    for pid, start in procs:
        if _running(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for prefix in prefixes:
        for path in glob.glob(os.path.join("/dev/shm", glob.escape(prefix) + "*")):
            try:
                os.unlink(path)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
