"""Multi-instance launches over MPI (what `poprun` and `popxl-run --backend mpi --instances N`
run): one MPI rank per instance, each running the whole command with the popdist environment.

MPICH's process manager (`mpiexec.gforker` on one node: no network listener; hydra's `mpiexec`
with `--host` or hydra-only MPI options, see `mpiexec.py`) starts every instance under
`instance_wrapper` (output prefix, exit code file); this launcher watches the exit files and,
once an instance has failed, gives the others `FAIL_GRACE` seconds to report it (they raise
`InstanceFailed` naming it from their collectives) before it stops the job. The exit code is the
first failing instance's.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .hosts import hydra_host_args, place
from .instance_wrapper import read_exit_file
from .mpiexec import (EXIT_ZERO_ENV, across_hosts_env, find_gforker, find_mpiexec,
                      gforker_takes, one_node_env)
from .output import POPRUN_PREFIX
from .supervise import die_with_parent, kill_tree

__all__ = ["InstanceLaunch", "run_mpi_instances", "topology_table", "translate_mpi_args",
           "handle_ctrl_c", "FAIL_GRACE"]

FAIL_GRACE = 3.0          # seconds the other instances get to report a failure before a stop

# Open MPI options poprun users type, as MPICH hydra options (None: dropped, with a note).
_OMPI_FLAGS = {"--tag-output": None, "--allow-run-as-root": None, "--oversubscribe": None,
               "--report-bindings": None, "--display-map": None, "-q": None, "--quiet": None,
               "--timestamp-output": None}
_OMPI_VALUED = {"--bind-to": "-bind-to", "--map-by": "-map-by",
                "--output-filename": None, "-wdir": "-wdir", "--wdir": "-wdir"}


@dataclass
class InstanceLaunch:
    """What to launch: `num_instances` ranks sharing `num_replicas` global replicas."""

    num_instances: int
    num_replicas: int
    ipus_per_replica: int = 1
    hosts: Sequence[str] = ()
    slots: Sequence[int] = ()          # instances on each host (default: as many on each)
    remote_exec: Optional[str] = None  # how hydra starts processes on other hosts (ssh)
    mpi_global_args: Sequence[str] = ()
    mpi_local_args: Sequence[str] = ()
    instance_mpi_local_args: Dict[int, List[str]] = field(default_factory=dict)
    prefix: str = POPRUN_PREFIX
    only_output_from: Optional[int] = None
    prog: str = "poprun"

    @property
    def local_replicas(self) -> int:
        return self.num_replicas // self.num_instances

    def check(self) -> None:
        """Raise ValueError (one line, naming the option) for an impossible launch."""
        if self.num_instances < 1:
            raise ValueError(f"--num-instances must be >= 1, got {self.num_instances}")
        if self.num_replicas < 1:
            raise ValueError(f"--num-replicas must be >= 1, got {self.num_replicas}")
        if self.num_replicas % self.num_instances:
            raise ValueError(f"--num-replicas {self.num_replicas} is not divisible by "
                             f"--num-instances {self.num_instances}")
        if self.hosts and not self.slots and self.num_instances % len(self.hosts):
            raise ValueError(f"--num-instances {self.num_instances} is not divisible by the "
                             f"{len(self.hosts)} hosts {list(self.hosts)}")
        self.placement()
        if self.only_output_from is not None and not \
                0 <= self.only_output_from < self.num_instances:
            raise ValueError(f"--only-output-from-instance {self.only_output_from} is not an "
                             f"instance of 0..{self.num_instances - 1}")
        bad = [i for i in self.instance_mpi_local_args if not 0 <= i < self.num_instances]
        if bad:
            raise ValueError(f"--instance-mpi-local-args names instance(s) {bad} outside "
                             f"0..{self.num_instances - 1}")

    def placement(self) -> List[str]:
        """The host of each instance (blocks, in host order); empty on this host alone."""
        if not self.hosts:
            return []
        specs = list(zip(self.hosts, self.slots)) if self.slots else \
            [(h, None) for h in self.hosts]
        return place(self.num_instances, specs, "instances")

    def host_of(self, instance: int) -> str:
        return (self.placement() or [socket.gethostname()] * self.num_instances)[instance]

    def local_index(self, instance: int) -> int:
        plan = self.placement()
        return plan[:instance].count(plan[instance]) if plan else instance


def topology_table(launch: InstanceLaunch, num_ilds: int = 1) -> str:
    """poprun's `--print-topology yes` table: hosts, IPU-link domains, instances and replicas,
    each cell spanning the replicas it holds."""
    R, N = launch.num_replicas, launch.num_instances
    plan = launch.placement() or ["localhost"] * N
    hosts = list(dict.fromkeys(plan))
    title = "poprun topology"
    label = len("instances") + 2
    rows = [("hosts", [(h, plan.count(h) * launch.local_replicas) for h in hosts]),
            ("ILDs", [(str(i), R // num_ilds) for i in range(num_ilds)]),
            ("instances", [(str(i), launch.local_replicas) for i in range(N)]),
            ("replicas", [(str(r), 1) for r in range(R)])]
    # One replica column is `unit` wide; a cell of `span` replicas spans their columns and the
    # bars between them. The unit grows until every cell's text (and the title) fits with a
    # space on each side, so every row has the same width.
    unit = len(str(R - 1)) + 2
    while any(span * unit + span - 1 < len(text) + 2 for _, items in rows
              for text, span in items) or label + 1 + R * unit + R - 1 < len(title) + 2:
        unit += 1
    width = R * unit + (R - 1)
    inner = label + 1 + width

    def cells(items: List[Tuple[str, int]]) -> str:
        return "|".join(text.center(span * unit + span - 1) for text, span in items)

    lines = [" " + "=" * inner, "|" + title.center(inner) + "|",
             "|" + "=" * inner + "|"]
    for k, (name, items) in enumerate(rows):
        lines.append("|" + f" {name}".ljust(label) + "|" + cells(items) + "|")
        if k < len(rows) - 1:
            lines.append("|" + "-" * label + "|" + "-" * width + "|")
    lines.append(" " + "-" * inner)
    return "\n".join(lines)


def translate_mpi_args(args: Sequence[str], local: bool) -> Tuple[List[str], List[str]]:
    """Open MPI options (as poprun passes them to `mpirun`) as MPICH hydra options, and notes
    about the ones dropped. `-x NAME=VALUE` sets a variable; `-x NAME` is dropped because hydra
    passes the whole environment; `--mca plm_rsh_agent CMD` (Open MPI's remote-exec command)
    becomes hydra's `-launcher ssh -launcher-exec CMD`. Other options pass through
    unchanged."""
    out: List[str] = []
    notes: List[str] = []
    setenv = "-env" if local else "-genv"
    it = iter(args)
    for a in it:
        if a == "-x":
            spec = next(it, "")
            if "=" in spec:
                name, value = spec.split("=", 1)
                out += [setenv, name, value]
            continue
        if a == "--mca" or a.startswith("--mca="):
            words = a[len("--mca="):].split(None, 1) if "=" in a else []
            name = words[0] if words else next(it, "")
            value = words[1] if len(words) > 1 else next(it, "")
            if name == "plm_rsh_agent" and value:
                out += ["-launcher", "ssh", "-launcher-exec", value]
            else:
                notes.append(f"ignoring Open MPI option --mca {name} {value}".rstrip())
            continue
        if a in _OMPI_FLAGS:
            notes.append(f"ignoring Open MPI option {a} (popxl-dist runs MPICH's mpiexec)")
            continue
        name, eq, value = a.partition("=")
        if name in _OMPI_VALUED:
            value = value if eq else next(it, "")
            target = _OMPI_VALUED[name]
            if target is None:
                notes.append(f"ignoring Open MPI option {name} {value}".rstrip())
            else:
                out += [target, value]
            continue
        out.append(a)
    return out, notes


def _mpiexec_command(launch: InstanceLaunch, cmd: Sequence[str]) -> Tuple[List[str], List[str]]:
    """The process manager's command line and notes about dropped options. gforker (one node,
    no network listener) unless the launch names hosts or MPI options only hydra takes; its
    instances' wrappers then exit 0 (gforker would stop the job at the first failure, before
    the others could report it)."""
    global_args, notes = translate_mpi_args(
        [a for s in launch.mpi_global_args for a in shlex.split(s)], local=False)
    local_args, more = translate_mpi_args(
        [a for s in launch.mpi_local_args for a in shlex.split(s)], local=True)
    notes += more
    own_args = {}
    for i in range(launch.num_instances):
        own_args[i], more = translate_mpi_args(launch.instance_mpi_local_args.get(i, []),
                                               local=True)
        notes += more
    gforker = None if launch.hosts or not gforker_takes(
        [*global_args, *local_args, *(a for own in own_args.values() for a in own)]) \
        else find_gforker()
    if gforker:
        full = [gforker, "-genv", EXIT_ZERO_ENV, "1"]
    else:
        full = [find_mpiexec(), "-disable-auto-cleanup"]
    if launch.hosts:
        full += hydra_host_args(launch.placement(), launch.remote_exec)
    full += global_args
    wrapper = [sys.executable, "-m", "popxl_launch.instance_wrapper", *cmd]
    for i in range(launch.num_instances):
        per = ["-env", "POPDIST_REPLICA_INDEX_OFFSET", str(i * launch.local_replicas),
               "-env", "POPDIST_INSTANCE_INDEX", str(i),
               "-env", "POPDIST_LOCAL_INSTANCE_INDEX", str(launch.local_index(i))]
        full += (([":"] if i else []) + ["-n", "1"] + per + local_args + own_args[i] + wrapper)
    return full, sorted(set(notes))


def _instance_env(launch: InstanceLaunch, exit_dir: str, fds: Tuple[int, int]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("POPXL_WORKERS", "POPXL_SINGLE_CONTROLLER", "POPXL_HOST_STDIO",
                        "POPXL_EXIT_FILE", "POPXL_INSTANCE_LINKS")}
    env.update({
        "POPDIST_NUM_TOTAL_REPLICAS": str(launch.num_replicas),
        "POPDIST_NUM_LOCAL_REPLICAS": str(launch.local_replicas),
        "POPDIST_NUM_INSTANCES": str(launch.num_instances),
        "POPDIST_NUM_IPUS_PER_REPLICA": str(launch.ipus_per_replica),
        "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE": "1",
        # Each instance holds its replicas in-process; a non-popdist Ir stays local too.
        "POPXL_BACKEND": "local",
        "POPXL_HOST_STDIO": f"{fds[0]},{fds[1]}",
        "POPXL_LAUNCH_HOST": socket.gethostname(),
        "POPXL_EXIT_DIR": exit_dir,
        "POPXL_OUTPUT_PREFIX": launch.prefix,
        "POPXL_ONLY_OUTPUT_FROM": "" if launch.only_output_from is None
        else str(launch.only_output_from),
        "POPXL_LAUNCHER_NAME": launch.prog,
    })
    # Idle OpenBLAS threads spin for ~0.1 s: with several instances per core that starves the
    # others. The spin time (unlike the thread count) does not change any result's bits.
    env.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    return env


def handle_ctrl_c() -> None:
    """Make Ctrl-C stop the launch even when this process inherited SIGINT ignored (a command
    started in the background by a non-interactive shell, e.g. a CI runner): Python would then
    never raise KeyboardInterrupt, and a Ray driver would run on."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _first_failure(exit_dir: str, n: int) -> Optional[Tuple[int, float, int, int]]:
    """(instance, code, time, signal) of the first failed instance so far: the earliest to end
    among those that did not fail because of another (they say so in `<i>.caused_by`)."""
    failed = []
    for i in range(n):
        rec = read_exit_file(exit_dir, i)
        if rec is not None and rec[0] != 0:
            secondary = os.path.exists(os.path.join(exit_dir, f"{i}.caused_by"))
            failed.append((secondary, rec[1], i, rec[0], rec[2]))
    if not failed:
        return None
    _, when, i, code, sig = min(failed)
    return i, code, when, sig


def run_mpi_instances(launch: InstanceLaunch, cmd: Sequence[str]) -> int:
    """Run `cmd` as `launch.num_instances` instances; returns the first failing instance's exit
    code (0 if all succeeded)."""
    launch.check()
    if not cmd:
        raise ValueError("no command to run")
    sys.stdout.flush()
    sys.stderr.flush()
    fds = (os.dup(1), os.dup(2))
    for fd in fds:
        os.set_inheritable(fd, True)
    with tempfile.TemporaryDirectory(prefix=f"{launch.prog}-") as exit_dir:
        full, notes = _mpiexec_command(launch, cmd)
        for note in notes:
            print(f"{launch.prog}: {note}", file=sys.stderr, flush=True)
        env = _instance_env(launch, exit_dir, fds)
        env = across_hosts_env(env) if launch.hosts else one_node_env(env)
        try:
            # mpiexec (and so every rank) is stopped when the launcher dies, even by SIGKILL.
            preexec = die_with_parent(os.getpid()) if sys.platform.startswith("linux") else None
            proc = subprocess.Popen(full, env=env, pass_fds=fds, preexec_fn=preexec)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            code = _supervise(proc, launch, exit_dir)
        except KeyboardInterrupt:
            print(f"{launch.prog}: interrupted (Ctrl-C); stopping the instances",
                  file=sys.stderr, flush=True)
            _interrupt(proc)
            return 130
        failure = _first_failure(exit_dir, launch.num_instances)
    if failure is not None:
        return failure[1]
    return code


def _supervise(proc: subprocess.Popen, launch: InstanceLaunch, exit_dir: str) -> int:
    """Wait for mpiexec; once an instance has failed and the others have had `FAIL_GRACE`
    seconds, stop the job."""
    stop_at = None
    while True:
        try:
            return proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        if stop_at is None:
            if _first_failure(exit_dir, launch.num_instances) is not None:
                stop_at = time.monotonic() + FAIL_GRACE
        elif time.monotonic() > stop_at:
            i, code, _, _ = _first_failure(exit_dir, launch.num_instances)
            print(f"{launch.prog}: instance {i} failed (exit code {code}); stopping the other "
                  f"instances", file=sys.stderr, flush=True)
            return _stop(proc)


def _interrupt(proc: subprocess.Popen, patience: float = 10.0) -> None:
    """Ctrl-C reached the instances too (one process group): give them `patience` seconds to
    end, then stop the job (at once at another Ctrl-C)."""
    try:
        proc.wait(timeout=patience)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        _stop(proc)


def _stop(proc: subprocess.Popen, patience: float = 5.0) -> int:
    """SIGTERM mpiexec (it passes it to every rank); SIGKILL the whole job if it does not end in
    time."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout=patience)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        return proc.wait()
