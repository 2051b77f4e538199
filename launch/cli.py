"""`popxl-run [--backend local|mpi|ray] [--workers W] script.py [args...]` or
`popxl-run [--backend B] [--workers W] CONFIG.yaml [--run-dir DIR] [--resume DIR]
[--set key=value ...] [--stop-at-step N]`

Runs an unchanged PopXL script with its replicas placed by the chosen backend: it sets
`POPXL_BACKEND` / `POPXL_WORKERS` and runs the script (under `mpiexec -n W` for mpi). The exit
code is the script's. A YAML target is the built-in job (`popxl_launch.job`): checked here
(bad input exits 2 before anything starts), then run on the host, which is MPI rank 0 for mpi.

`--hosts h1,h2` (or `--hostfile FILE`, and `--remote-exec CMD`, default ssh) runs the MPI ranks
on several hosts under hydra, in blocks (see `hosts.py`).

`popxl-run --backend mpi|ray --instances N [--replicas R] script.py [args...]` runs the script N
times instead, as popdist instances (like `poprun`): MPI ranks or Ray actors, each with its share of
the R global replicas (default R = N) for `Ir(replication="popdist")`; output lines are prefixed
`[instance N] `; the exit code is the first failing instance's.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .hosts import (hydra_host_args, is_this_host, parse_hosts, place, read_hostfile,
                    remote_exec_path)
from .mpiexec import (HOSTS_RANK_WRAPPER, RANK_WRAPPER, across_hosts_env, find_gforker,
                      find_mpiexec, install_hint, one_node_env)
from .supervise import run_job

__all__ = ["main", "find_mpiexec", "missing_backend", "crowding_note"]

BACKENDS = ("local", "mpi", "ray")


@dataclass(frozen=True)
class HostLaunch:
    """Where the processes of an MPI launch across hosts run, and how hydra reaches the
    hosts (`--hosts` / `--hostfile`, `--remote-exec`)."""

    placement: Sequence[str]             # the host of each process
    remote_exec: Optional[str] = None    # hydra's default (ssh) when None
    specs: Sequence[tuple] = ()          # the hosts as given, (name, slots or None)


def _host_launch(ns: argparse.Namespace, n: int, what: str) -> Tuple[Optional[HostLaunch], str]:
    """The hosts named by `--hosts` / `--hostfile` for `n` processes (None without them), and
    what is wrong with them (one line naming the option; empty when nothing is)."""
    if ns.hosts and ns.hostfile:
        return None, "give --hosts or --hostfile, not both"
    hostfile = ns.hostfile or (os.environ.get("HYDRA_HOST_FILE", "") if not ns.hosts else "")
    if not (ns.hosts or hostfile):
        return None, "--remote-exec needs --hosts or --hostfile" if ns.remote_exec else ""
    if ns.backend != "mpi":
        return None, ("--hosts / --hostfile place MPI ranks (--backend mpi); the Ray backend "
                      "places its workers on the cluster at POPXL_RAY_ADDRESS")
    try:
        specs = parse_hosts(",".join(ns.hosts)) if ns.hosts else read_hostfile(hostfile)
        return HostLaunch(place(n, specs, what), remote_exec_path(ns.remote_exec),
                          tuple(specs)), ""
    except ValueError as e:
        return None, str(e)


def missing_backend(backend: str) -> Optional[str]:
    """What `backend` lacks here and which extra installs it, or None. The sentence names no
    program: `popxl-run` and `poprun` print it after their own prefix (one line, exit
    status 2)."""
    import importlib.util

    if backend == "mpi":
        missing = [] if importlib.util.find_spec("mpi4py") is not None else ["mpi4py"]
        try:
            find_mpiexec()
        except FileNotFoundError:
            missing.append("mpiexec")
        if missing:
            return (f"{' and '.join(missing)} {'are' if len(missing) > 1 else 'is'} not "
                    f"installed ({install_hint('mpi')})")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        return f"Ray is not installed ({install_hint('ray')})"
    return None


def _run_mpi(workers: int, target: str, args: List[str],
             hosts: Optional[HostLaunch] = None) -> int:
    """W ranks of the MPI entry point under MPICH's gforker (one node, no network listener;
    hydra where gforker is missing, or across `hosts`). Rank 0 (the host script, on this
    machine) writes straight to our stdout/stderr through inherited descriptors and reports the
    script's exit code through a file."""
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
        gforker = None if hosts else find_gforker()
        if hosts:
            env = across_hosts_env(env)
            manager = [find_mpiexec(), "-disable-auto-cleanup",
                       *hydra_host_args(hosts.placement, hosts.remote_exec)]
        else:
            env = one_node_env(env)
            manager = [gforker] if gforker else [find_mpiexec(), "-disable-auto-cleanup"]
        wrapper = HOSTS_RANK_WRAPPER if hosts else RANK_WRAPPER
        cmd = [*manager, "-n", str(workers), "sh", "-c", wrapper, "sh", sys.executable,
               "-m", "popxl_launch.mpi_main", target, *args]
        try:
            # Across hosts, once the script has ended the job is given a few seconds to end:
            # hydra waits for ever for the processes of a host that stopped answering.
            code = run_job(cmd, env, pass_fds=fds, done_file=exit_file if hosts else None)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            with open(exit_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            if code < 128:      # (not stopped by a signal to popxl-run: it knows why)
                why = ("killed, or aborted by MPI after another rank died: MPICH cannot "
                       "outlive a peer's death across hosts" if hosts else "killed?")
                print(f"popxl-run: the host (MPI rank 0, the script) ended without an exit "
                      f"code ({why}); mpiexec exited with {code}", file=sys.stderr)
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
    p.add_argument("--hosts", action="append", default=[], metavar="H1,H2|H1:N,H2:M",
                   help="mpi: run the ranks on these hosts, in blocks (slots :N say how many "
                        "on each); the first must be this machine for --workers")
    p.add_argument("--hostfile", metavar="FILE",
                   help="mpi: the hosts, one `host[:slots]` a line (hydra's format; default: "
                        "$HYDRA_HOST_FILE)")
    p.add_argument("--remote-exec", metavar="CMD",
                   help="with --hosts: the command that starts processes on another host, "
                        "called as `CMD HOST COMMAND...` (default: ssh)")
    debug = p.add_argument_group("debugging (popxl-dist; see popxl.debug)")
    debug.add_argument("--debug-nans", action="store_true",
                       help="stop at the first op that makes a NaN or infinity "
                            "(POPXL_DEBUG_NANS=1)")
    debug.add_argument("--check-replicas", action="store_true",
                       help="compare the variables replicas must agree on after every run "
                            "(POPXL_CHECK_REPLICAS=1)")
    debug.add_argument("--record", metavar="DIR",
                       help="keep each Session's latest run; write a failing run's replay "
                            "bundle to DIR (POPXL_RECORD=DIR; replay with popxl-replay)")
    debug.add_argument("--flight-recorder", metavar="DIR",
                       help="write every worker's last collectives to DIR when a run fails "
                            "(POPXL_FLIGHT_RECORDER=DIR)")
    debug.add_argument("--profile", metavar="DIR",
                       help="time every op on every replica; write a Chrome trace (Perfetto, "
                            "chrome://tracing) and a table to DIR at the end "
                            "(POPXL_PROFILE=DIR; see docs/profiling.md)")
    p.add_argument("target", nargs="?",
                   help="the Python script to run unchanged, or a YAML config of the built-in "
                        "job (e.g. configs/mnist.yaml; `popxl-run CONFIG.yaml --help` lists "
                        "its options and keys)")
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
    problem = problem or _backend_problem(ns.backend)
    hosts, problem = _host_launch(ns, n, "instances") if not problem else (None, problem)
    if problem:
        print(f"popxl-run: {problem}", file=sys.stderr)
        return 2
    if not os.path.isfile(ns.target):
        print(f"popxl-run: no such script: {ns.target}", file=sys.stderr)
        return 2
    if hosts is None:
        _print_crowding_note(ns.backend, n, "instances")
    from .instances import handle_ctrl_c

    handle_ctrl_c()
    if ns.backend == "ray":
        from .ray_instances import run_ray_instances

        return run_ray_instances(n, replicas, ns.target, ns.args)
    from .instances import InstanceLaunch, run_mpi_instances
    from .output import POPXL_RUN_PREFIX

    launch = InstanceLaunch(num_instances=n, num_replicas=replicas, prefix=POPXL_RUN_PREFIX,
                            prog="popxl-run")
    if hosts is not None:
        launch.hosts = [h for h, _ in hosts.specs]
        launch.slots = [k for _, k in hosts.specs] if hosts.specs[0][1] else []
        launch.remote_exec = hosts.remote_exec
    return run_mpi_instances(launch, [sys.executable, ns.target, *ns.args])


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def crowding_note(processes: int, what: str) -> str:
    """One line when `processes` worker processes (MPI ranks, Ray actors, instances) outnumber
    the usable CPUs, else empty. Every launcher accepts more processes than CPUs (they share
    the cores: slower, same results) and says so with this note."""
    cpus = usable_cpus()
    if processes <= cpus:
        return ""
    return (f"note: {processes} {what} on {cpus} usable CPU{'s' if cpus > 1 else ''} share the "
            f"cores (slower; the results are the same)")


def _print_crowding_note(backend: str, processes: int, what: str = "") -> None:
    """The note for worker processes started on this machine: none for local (threads) or a
    Ray cluster, which places its own actors (the address read as popxl.runtime.env's
    ray_address does, without importing popxl here)."""
    if backend == "local" or backend == "ray" and (
            os.environ.get("POPXL_RAY_ADDRESS", "").strip()
            or os.environ.get("RAY_ADDRESS", "").strip()):
        return
    note = crowding_note(processes, what or ("MPI ranks" if backend == "mpi" else
                                             "Ray workers"))
    if note:
        print(f"popxl-run: {note}", file=sys.stderr, flush=True)


def _backend_problem(backend: str) -> str:
    """`--backend B: <what is missing>`, or empty when the backend can start."""
    missing = missing_backend(backend)
    return f"--backend {backend}: {missing}" if missing else ""


def _run_job(backend: str, workers: int, target: str, args: List[str],
             hosts: Optional[HostLaunch] = None) -> int:
    """Check a YAML job here, then run it (on MPI rank 0 for mpi)."""
    if "numpy" not in sys.modules:
        # Workers run BLAS single-threaded whatever this says (popxl's own threads share the
        # cores: docs/threads.md); one BLAS thread here keeps the job's host-side NumPy work
        # from starting BLAS threads that would compete with them.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from .job.config import ConfigError
    from .job.run import prepare, run_job

    try:
        job = prepare([target, *args], backend, workers)
    except ConfigError as e:
        print(f"popxl-run: {e}", file=sys.stderr)
        return 2
    if hosts is None:
        _print_crowding_note(backend, workers)
    if backend == "mpi":
        if not job.run_dir.resume:
            job.run_dir.reserve()           # the name chosen here, claimed before the launch
            args = [*args, "--run-dir", str(job.run_dir.path)]
        return _run_mpi(workers, target, args, hosts)
    return run_job(job)


_WHAT_TO_RUN = ("popxl-run: give a PopXL script or a job config to run, e.g. `popxl-run "
                "configs/mnist.yaml` (the built-in MNIST job) or `popxl-run --backend mpi "
                "--workers 2 script.py`; `popxl-run --help` lists the options")


def _is_config(target: str) -> bool:
    return target.endswith((".yaml", ".yml"))


def _debug_env(ns: argparse.Namespace) -> None:
    """The debugging options as the POPXL_* variables every process of the job reads."""
    if ns.debug_nans:
        os.environ["POPXL_DEBUG_NANS"] = "1"
    if ns.check_replicas:
        os.environ["POPXL_CHECK_REPLICAS"] = "1"
    if ns.record:
        os.environ["POPXL_RECORD"] = os.path.abspath(ns.record)
    if ns.flight_recorder:
        os.environ["POPXL_FLIGHT_RECORDER"] = os.path.abspath(ns.flight_recorder)
    if ns.profile:
        os.environ["POPXL_PROFILE"] = os.path.abspath(ns.profile)


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    _debug_env(ns)
    if ns.target is None:
        parser.print_usage(sys.stderr)
        print(_WHAT_TO_RUN, file=sys.stderr)
        return 2
    if _is_config(ns.target) and any(a in ("-h", "--help") for a in ns.args):
        from .job.run import job_help

        print(job_help(ns.target, ns.args))
        return 0
    if ns.instances is not None or ns.replicas is not None:
        if _is_config(ns.target):
            print("popxl-run: --instances runs a script as popdist instances; the built-in job "
                  "(a YAML config) runs single-controller: use --workers", file=sys.stderr)
            return 2
        return _run_instances(ns)
    workers = ns.workers if ns.workers is not None else (1 if ns.backend == "local" else 2)
    if workers < 1:
        print(f"popxl-run: --workers must be >= 1, got {workers}", file=sys.stderr)
        return 2
    problem = _backend_problem(ns.backend)
    hosts, problem = _host_launch(ns, workers, "MPI ranks (--workers)") if not problem \
        else (None, problem)
    if hosts is not None and not is_this_host(hosts.placement[0]):
        problem = (f"the first host ({hosts.placement[0]}) must be this machine "
                   f"({socket.gethostname()}): MPI rank 0 runs the script here")
    if problem:
        print(f"popxl-run: {problem}", file=sys.stderr)
        return 2
    os.environ["POPXL_BACKEND"] = ns.backend
    os.environ["POPXL_WORKERS"] = str(workers)
    _handle_ctrl_c()
    if _is_config(ns.target):
        return _run_job(ns.backend, workers, ns.target, ns.args, hosts)
    if hosts is None:
        _print_crowding_note(ns.backend, workers)
    if ns.backend == "mpi":
        return _run_mpi(workers, ns.target, ns.args, hosts)
    from .scripts import run_script

    return run_script(ns.target, ns.args)


if __name__ == "__main__":
    sys.exit(main())
