"""MPI entry point (`mpiexec -n W python -m popxl_launch.mpi_main script.py args...`, which
`popxl-run --backend mpi` runs): rank 0 runs the script as the host, the other ranks serve."""
from __future__ import annotations

import os
import signal
import sys
import traceback


def _use_host_stdio() -> None:
    """Write to popxl-run's own stdout/stderr (see `popxl_launch.cli._run_mpi`)."""
    fds = os.environ.get("POPXL_HOST_STDIO", "")
    if fds:
        out, err = (int(x) for x in fds.split(","))
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out, 1)
        os.dup2(err, 2)


def _report_exit(code: int) -> None:
    path = os.environ.get("POPXL_EXIT_FILE", "")
    if path:
        with open(path, "w") as f:
            f.write(str(code))


def _report_abandoned() -> None:
    """Tell popxl-run not to wait for the rest of the job (`POPXL_EXIT_FILE` + ".abandoned"):
    this process ends without MPI_Finalize, and across hosts mpiexec would wait for ever for a
    host that stopped answering."""
    path = os.environ.get("POPXL_EXIT_FILE", "")
    if path:
        try:
            open(path + ".abandoned", "w").close()
        except OSError:
            pass


def _ignore_exit_notices() -> None:
    """mpiexec -disable-auto-cleanup sends SIGUSR1 when a rank exits; once the job is finishing
    that is expected, and its default action would kill this process mid-teardown."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def main() -> int:
    from popxl.runtime.backends.mpi import launched_by_popxl_run, mpi_pool

    launched_by_popxl_run()
    pool = mpi_pool()
    if pool.rank != 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the host's to handle
        pool.serve()
        _ignore_exit_notices()
        return 0
    _use_host_stdio()
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # The rank wrapper runs the script in the background of a shell, which starts it with
        # SIGINT ignored; popxl-run passes Ctrl-C on as SIGINT and the script must see it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 1
    try:
        code = _run_target(sys.argv[1], sys.argv[2:], pool.size)
    finally:
        _flush_quietly()
        _report_exit(code)
        ok = pool.shutdown()      # always: a rank left serving would hang MPI_Finalize
        _ignore_exit_notices()
        if not ok:
            # MPI cannot finalise with a stuck or dead worker: end every rank here (after
            # Ctrl-C that is expected, and the script already said it was interrupted; a
            # failure the script was told of is not said twice).
            if not pool.interrupted and not pool.reported:
                print(f"popxl-run: the MPI worker pool is broken ({pool.broken}); stopping "
                      f"every rank", file=sys.stderr, flush=True)
            pool.kill_workers()
            _flush_quietly()
            _report_abandoned()
            os._exit(code or 1)
    return code


def _run_target(target: str, args, workers: int) -> int:
    """The host's program: a YAML job (checked again here) or the user's script."""
    if target.endswith((".yaml", ".yml")):
        from .job.run import main as job_main

        try:
            return job_main([target, *args], "mpi", workers)
        except Exception:  # noqa: BLE001 - reported as the interpreter would, before the
            traceback.print_exc()      # shutdown (which may have to end the process at once)
            return 1
    from .scripts import run_script

    return run_script(target, args)


def _flush_quietly() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass

if __name__ == "__main__":
    sys.exit(main())
