"""`popxl-run [--backend local|mpi|ray] [--workers W] script.py [args...]` or
`popxl-run [--backend B] [--workers W] CONFIG.yaml [--run-dir DIR] [--resume DIR]
[--set key=value ...] [--stop-at-step N]`

Runs an unchanged PopXL script with its replicas placed by the chosen backend: it sets
`POPXL_BACKEND` / `POPXL_WORKERS` and runs the script (under `mpiexec -n W` for mpi). The exit
code is the script's. A YAML target is the built-in job (`popxl_launch.job`): checked here
(bad input exits 2 before anything starts), then run on the host, which is MPI rank 0 for mpi.

`popxl-run --backend mpi|ray --instances N [--replicas R] script.py [args...]` runs the script N
times instead, as popdist instances (like `poprun`): MPI ranks or Ray actors, each with its share of
the R global replicas (default R = N) for `Ir(replication="popdist")`; output lines are prefixed
`[instance N] `; the exit code is the first failing instance's.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from typing import List, Optional

from .mpiexec import RANK_WRAPPER, find_gforker, find_mpiexec, one_node_env
from .supervise import run_job

__all__ = ["main", "find_mpiexec"]

BACKENDS = ("local", "mpi", "ray")


def _run_mpi(workers: int, target: str, args: List[str]) -> int:
    """W ranks of the MPI entry point under MPICH's gforker (one node, no network listener;
    hydra where gforker is missing). Rank 0 (the host script) writes straight to our
    stdout/stderr through inherited descriptors and reports the script's exit code through a
    file."""
    sys.stdout.flush()
    sys.stderr.flush()
    fds = (os.dup(1), os.dup(2))
    for fd in fds:
        os.set_inheritable(fd, True)
    with tempfile.TemporaryDirectory(prefix="popxl-run-") as tmp:
        exit_file = os.path.join(tmp, "exit_code")
        env = dict(os.environ, POPXL_HOST_STDIO=f"{fds[0]},{fds[1]}", POPXL_EXIT_FILE=exit_file,
                   POPXL_SINGLE_CONTROLLER="1")
        # Idle OpenBLAS threads spin for ~0.1 s by default; with several ranks per core set
        # that oversubscribes the cores (27 s instead of 4 s for the data-parallel example).
        # Changing the spin time, unlike the thread count, keeps every result's bits.
        env.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
        env = one_node_env(env)
        gforker = find_gforker()
        manager = [gforker] if gforker else [find_mpiexec(), "-disable-auto-cleanup"]
        cmd = [*manager, "-n", str(workers), "sh", "-c", RANK_WRAPPER, "sh", sys.executable,
               "-m", "popxl_launch.mpi_main", target, *args]
        try:
            code = run_job(cmd, env, pass_fds=fds)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            with open(exit_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            if code < 128:      # (not stopped by a signal to popxl-run: it knows why)
                print(f"popxl-run: the host (MPI rank 0, the script) ended without an exit "
                      f"code (killed?); mpiexec exited with {code}", file=sys.stderr)
            return code or 1


def _handle_ctrl_c() -> None:
    """Make Ctrl-C (SIGINT) stop the job even when popxl-run inherited SIGINT ignored, as a
    command started in the background by a non-interactive shell (CI runners, `cmd &` in a
    script) does: Python then never raises KeyboardInterrupt, and a Ray driver would run on.
    `mpiexec` and `torchrun` install their own handlers for the same reason."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="popxl-run",
        description="Run a PopXL script with its replicas on local threads, MPI ranks or Ray "
                    "actors.")
    p.add_argument("--backend", choices=BACKENDS,
                   default=os.environ.get("POPXL_BACKEND", "local") or "local",
                   help="where replicas run (default: $POPXL_BACKEND or local)")
    p.add_argument("--workers", type=int, default=None,
                   help="number of workers (processes / actors / threads); default 1 for local, "
                        "2 for mpi and ray")
    p.add_argument("--instances", type=int, default=None,
                   help="run the script as this many popdist instances (mpi or ray)")
    p.add_argument("--replicas", type=int, default=None,
                   help="global replicas of the instances (default: one per instance)")
    p.add_argument("target", help="the Python script to run unchanged, or a YAML config of "
                                  "the built-in job (e.g. configs/mnist.yaml)")
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="arguments passed to the script; for a config: [--run-dir DIR] "
                        "[--resume DIR] [--set key=value ...] [--stop-at-step N]")
    return p


def _run_instances(ns: argparse.Namespace) -> int:
    """`--instances N [--replicas R]`: the script as N popdist instances."""
    n = ns.instances if ns.instances is not None else 1
    replicas = ns.replicas if ns.replicas is not None else n
    problem = ("--workers does not apply to --instances (each instance holds its replicas "
               "in-process)" if ns.workers is not None else
               f"--instances needs --backend mpi or ray, got {ns.backend}"
               if ns.backend == "local" else
               f"--instances must be >= 1, got {n}" if n < 1 else
               f"--replicas must be >= 1, got {replicas}" if replicas < 1 else
               f"--replicas {replicas} is not divisible by --instances {n}"
               if replicas % n else "")
    if problem:
        print(f"popxl-run: {problem}", file=sys.stderr)
        return 2
    if not os.path.isfile(ns.target):
        print(f"popxl-run: no such script: {ns.target}", file=sys.stderr)
        return 2
    from .instances import handle_ctrl_c

    handle_ctrl_c()
    if ns.backend == "ray":
        from .ray_instances import run_ray_instances

        return run_ray_instances(n, replicas, ns.target, ns.args)
    from .instances import InstanceLaunch, run_mpi_instances
    from .output import POPXL_RUN_PREFIX

    launch = InstanceLaunch(num_instances=n, num_replicas=replicas, prefix=POPXL_RUN_PREFIX,
                            prog="popxl-run")
    return run_mpi_instances(launch, [sys.executable, ns.target, *ns.args])


def _backend_missing(backend: str) -> Optional[str]:
    """Why `backend` cannot start here, or None."""
    import importlib.util

    if backend == "mpi":
        try:
            find_mpiexec()
        except FileNotFoundError as e:
            return str(e)
        if importlib.util.find_spec("mpi4py") is None:
            return "the mpi backend needs mpi4py: pip install 'popxl-dist[mpi]'"
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        return "the ray backend needs Ray: pip install 'popxl-dist[ray]'"
    return None


def _run_job(backend: str, workers: int, target: str, args: List[str]) -> int:
    """Check a YAML job here, then run it (on MPI rank 0 for mpi)."""
    if "numpy" not in sys.modules:
        # One BLAS thread per worker by default: W processes on few cores with several BLAS
        # threads each slow each other down badly, and every backend must use the same count
        # (OpenBLAS's bits depend on it) for the runs to agree bit for bit.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from .job.config import ConfigError
    from .job.run import job_help, prepare, run_job

    if any(a in ("-h", "--help") for a in args):
        print(job_help())
        return 0
    try:
        job = prepare([target, *args], backend, workers)
        missing = _backend_missing(backend)
        if missing:
            raise ConfigError(missing)
    except ConfigError as e:
        print(f"popxl-run: {e}", file=sys.stderr)
        return 2
    if backend == "mpi":
        if not job.run_dir.resume:
            job.run_dir.reserve()           # the name chosen here, claimed before the launch
            args = [*args, "--run-dir", str(job.run_dir.path)]
        return _run_mpi(workers, target, args)
    return run_job(job)


def main(argv: Optional[List[str]] = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.instances is not None or ns.replicas is not None:
        if ns.target.endswith((".yaml", ".yml")):
            print("popxl-run: --instances runs a script as popdist instances; the built-in job "
                  "(a YAML config) runs single-controller: use --workers", file=sys.stderr)
            return 2
        return _run_instances(ns)
    workers = ns.workers if ns.workers is not None else (1 if ns.backend == "local" else 2)
    if workers < 1:
        print(f"popxl-run: --workers must be >= 1, got {workers}", file=sys.stderr)
        return 2
    os.environ["POPXL_BACKEND"] = ns.backend
    os.environ["POPXL_WORKERS"] = str(workers)
    _handle_ctrl_c()
    if ns.target.endswith((".yaml", ".yml")):
        return _run_job(ns.backend, workers, ns.target, ns.args)
    if ns.backend == "mpi":
        return _run_mpi(workers, ns.target, ns.args)
    from .scripts import run_script

    return run_script(ns.target, ns.args)


if __name__ == "__main__":
    sys.exit(main())
