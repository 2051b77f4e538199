"""The process around each instance of an MPI instance launch (`poprun`, `popxl-run --backend mpi
--instances N`): `python -m popxl_launch.instance_wrapper COMMAND...` under `mpiexec`.

It runs the instance's command with the MPI environment (inherited descriptors included, so the
command joins the MPI job), prefixes each line of its output (`POPXL_OUTPUT_PREFIX`) and writes it
straight to the launcher's stdout/stderr when on the launcher's host (hydra stops forwarding output
once a rank dies), drops the stdout of other instances under `--only-output-from-instance`, and
records the exit code and time in `POPXL_EXIT_DIR/<instance>` for the launcher, which stops the
others when one fails. A command killed by a signal is reported by name and becomes exit code 1
here: hydra kills every rank when one dies by a signal, and the others must live to report it.
Under gforker (`POPXL_RANK_EXIT_ZERO`), which stops the job when any rank exits with an error,
the wrapper always exits 0 (the launcher reads the codes from the files) and ignores gforker's
SIGINT / SIGQUIT, with which it stops every rank when one ends without MPI_Finalize.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import List, Optional

from .mpiexec import EXIT_ZERO_ENV
from .output import host_fds, pump, write_all

__all__ = ["main", "write_exit_file", "read_exit_file"]


def write_exit_file(directory: str, index: int, code: int, sig: int = 0) -> None:
    """Record `code` (and the killing signal) of instance `index` with the current time."""
    if not directory:
        return
    path = os.path.join(directory, str(index))
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(f"{code} {time.time():.6f} {sig}\n")
        os.replace(tmp, path)
    except OSError:
        pass          # on another host than the launcher's: mpiexec's exit code tells it


def read_exit_file(directory: str, index: int) -> Optional[tuple]:
    """(code, time, signal) of instance `index`, or None if it has not exited."""
    try:
        with open(os.path.join(directory, str(index))) as f:
            code, when, sig = f.read().split()
        return int(code), float(when), int(sig)
    except (OSError, ValueError):
        return None


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ
    index = int(env.get("POPDIST_INSTANCE_INDEX", env.get("PMI_RANK", "0")))
    prog = env.get("POPXL_LAUNCHER_NAME", "popxl-run")
    fmt = env.get("POPXL_OUTPUT_PREFIX", "")
    only = env.get("POPXL_ONLY_OUTPUT_FROM", "")
    out_fd, err_fd = host_fds(env) or (1, 2)
    # hydra (-disable-auto-cleanup) signals SIGUSR1 to every rank when one exits; ignored here
    # and, as ignored dispositions survive exec, in the command (popxl listens for it there).
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def prefix(stream: str) -> Optional[str]:
        return fmt.format(i=index, stream=stream) if fmt else None

    def err(text: str) -> None:
        write_all(err_fd, f"{prefix('stderr') or ''}{prog}: {text}\n".encode())

    pipes = [os.pipe(), os.pipe()]
    try:
        proc = subprocess.Popen(argv, stdout=pipes[0][1], stderr=pipes[1][1], close_fds=False)
    except OSError as e:
        err(f"instance {index} cannot run {argv[:1]}: {e}")
        write_exit_file(env.get("POPXL_EXIT_DIR", ""), index, 127)
        return 127
    finally:
        os.close(pipes[0][1])
        os.close(pipes[1][1])
    # Ctrl-C reaches the command through the terminal's process group; the process manager's
    # SIGINT / SIGQUIT (gforker's when a rank ends without MPI_Finalize) are not passed on:
    # the other instances must live to report the failure. SIGTERM is.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda s, f: proc.send_signal(signal.SIGTERM))
    keep_out = not only or only == str(index)
    threads = [pump(pipes[0][0], lambda b: write_all(out_fd, b), prefix("stdout"), keep_out),
               pump(pipes[1][0], lambda b: write_all(err_fd, b), prefix("stderr"))]
    code = proc.wait()
    for t in threads:
        t.join(timeout=5.0)       # a child the command left running may hold the pipes
    sig = 0
    exit_dir = env.get("POPXL_EXIT_DIR", "")
    if code < 0:
        sig = -code
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        first = _failed_before(exit_dir, index)
        if sig == signal.SIGINT:
            pass        # Ctrl-C: Python ends by SIGINT after KeyboardInterrupt; it said so
        elif first is not None and sig in (signal.SIGTERM, signal.SIGKILL):
            err(f"instance {index} was stopped (signal {name}) after instance {first} failed")
        else:
            err(f"instance {index} was killed by signal {sig} ({name})")
        code = 128 + sig
    write_exit_file(exit_dir, index, code, sig)
    if env.get(EXIT_ZERO_ENV) == "1":
        return 0
    return 1 if sig else code


def _failed_before(directory: str, index: int) -> Optional[int]:
    """Another instance that has already failed (the launcher then stops the rest)."""
    if not directory or not os.path.isdir(directory):
        return None
    for name in sorted(os.listdir(directory)):
        if name.isdigit() and int(name) != index:
            rec = read_exit_file(directory, int(name))
            if rec is not None and rec[0] != 0:
                return int(name)
    return None


if __name__ == "__main__":
    sys.exit(main())
