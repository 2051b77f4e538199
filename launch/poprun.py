"""`poprun`: Graphcore's multi-instance launcher, emulated over MPI.

    poprun --num-instances 2 --num-replicas 4 python3 train.py --epochs 1

Starts `--num-instances` MPI ranks (the mpich wheel's `mpiexec`), each running the command with
the `POPDIST_*` environment poprun exports, so `popdist` and `Ir(replication="popdist")` place
`--num-replicas / --num-instances` replicas in each instance (contiguous blocks). Each line an
instance prints is prefixed `[1,<instance>]<stdout>: ` / `<stderr>: ` like poprun's (Open MPI
`--tag-output`); with `--only-output-from-instance N` the other instances' stdout is dropped
(their stderr is kept, so failures stay visible: a deliberate difference). The exit code is the
first failing instance's; the others are stopped a few seconds after a failure.

Open MPI options in `--mpi-global-args` / `--mpi-local-args` / `--instance-mpi-local-args` are
translated to MPICH hydra's where they have an equivalent (`-x NAME=VALUE`, `--bind-to`,
`--map-by`) and dropped with a note otherwise. V-IPU, partition and other IPU-system options are
accepted and ignored with a one-line note: there is no IPU system to configure.
"""
from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional

from .cli import crowding_note, missing_backend
from .instances import InstanceLaunch, handle_ctrl_c, run_mpi_instances, topology_table
from .output import POPRUN_PREFIX

__all__ = ["main"]

# Accepted and ignored (name -> takes a value).
_IGNORED = {"--vipu-server-host": True, "--vipu-server-port": True, "--vipu-partition": True,
            "--vipu-cluster": True, "--vipu-server-timeout": True, "--vipu-allocation": True,
            "--reset-partition": True, "--update-partition": True, "--remove-partition": True,
            "--sync-type": True, "--num-ilds": True, "--ipus-per-ild": True,
            "--executable-cache-path": True, "--numa-aware": True, "--process-placement": True,
            "--offline-mode": True, "--interactive": False, "--mpi-debug": False,
            "--verbose": False, "-v": False}


def _yes_no(text: str) -> bool:
    low = text.strip().lower()
    if low in ("yes", "y", "true", "1", "on"):
        return True
    if low in ("no", "n", "false", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected yes or no, got {text!r}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="poprun", usage="poprun [options] command [args...]",
        description="Run a command as several popdist instances over MPI (popxl-dist's "
                    "emulation of Graphcore's poprun).")
    p.add_argument("--num-instances", type=int, default=1, help="instances (processes)")
    p.add_argument("--num-replicas", type=int, default=None,
                   help="global replicas (default: one per instance)")
    p.add_argument("--ipus-per-replica", type=int, default=1, metavar="N",
                   help="IPUs each replica spans (exported to popdist; default 1)")
    p.add_argument("--host", "-H", action="append", default=[],
                   help="comma-separated hosts (default: this host)")
    p.add_argument("--print-topology", type=_yes_no, default=False, metavar="yes|no",
                   help="print the table of hosts, instances and replicas before starting "
                        "(default no)")
    p.add_argument("--only-output-from-instance", type=int, default=None, metavar="N",
                   help="drop the stdout of every other instance (their stderr is kept)")
    p.add_argument("--mpi-global-args", action="append", default=[], metavar="ARGS",
                   help="options for mpiexec (Open MPI's are translated to MPICH's)")
    p.add_argument("--mpi-local-args", action="append", default=[], metavar="ARGS",
                   help="options for every instance's part of the mpiexec command")
    p.add_argument("--instance-mpi-local-args", action="append", default=[],
                   metavar="N:ARGS", help="MPI local arguments of instance N")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command each instance runs")
    for name, takes_value in _IGNORED.items():
        if takes_value:
            p.add_argument(name, dest=f"ignored{name}", default=None, help=argparse.SUPPRESS)
        else:
            p.add_argument(name, dest=f"ignored{name}", action="store_true",
                           help=argparse.SUPPRESS)
    return p


def _instance_args(specs: List[str]) -> Dict[int, List[str]]:
    import shlex

    out: Dict[int, List[str]] = {}
    for spec in specs:
        index, sep, args = spec.partition(":")
        if not sep or not index.strip().isdigit():
            raise ValueError(f"--instance-mpi-local-args expects INSTANCE:ARGS, got {spec!r}")
        out.setdefault(int(index), []).extend(shlex.split(args))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = _parser()
    ns = p.parse_args(argv)
    for name in _IGNORED:
        value = getattr(ns, f"ignored{name}")
        if value not in (None, False):
            print(f"poprun: ignoring {name} (popxl-dist emulates the IPUs: there is no IPU "
                  f"system to configure)", file=sys.stderr)
    if not ns.command:
        p.print_usage(sys.stderr)
        print("poprun: error: no command given", file=sys.stderr)
        return 2
    try:
        launch = InstanceLaunch(
            num_instances=ns.num_instances,
            num_replicas=ns.num_replicas if ns.num_replicas is not None else ns.num_instances,
            ipus_per_replica=ns.ipus_per_replica,
            hosts=[h.split(":")[0] for spec in ns.host for h in spec.split(",") if h],
            mpi_global_args=ns.mpi_global_args, mpi_local_args=ns.mpi_local_args,
            instance_mpi_local_args=_instance_args(ns.instance_mpi_local_args),
            prefix=POPRUN_PREFIX, only_output_from=ns.only_output_from_instance, prog="poprun")
        launch.check()
    except ValueError as e:
        print(f"poprun: error: {e}", file=sys.stderr)
        return 2
    if ns.ipus_per_replica < 1:
        print(f"poprun: error: --ipus-per-replica must be >= 1, got {ns.ipus_per_replica}",
              file=sys.stderr)
        return 2
    missing = missing_backend("mpi")
    if missing:
        print(f"poprun: error: {missing}", file=sys.stderr)
        return 2
    note = "" if launch.hosts else crowding_note(launch.num_instances, "instances")
    if note:
        print(f"poprun: {note}", file=sys.stderr, flush=True)
    if ns.print_topology:
        print(topology_table(launch), flush=True)
    handle_ctrl_c()
    try:
        return run_mpi_instances(launch, ns.command)
    except FileNotFoundError as e:
        print(f"poprun: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
