"""The hosts of an MPI launch across machines (`popxl-run --backend mpi --hosts ...` /
`--hostfile FILE`, `poprun --host ...`): which host each process runs on, and the options that
make hydra (MPICH's `mpiexec`) start them there.

Hosts are given as `h1,h2` or with slots, `h1:2,h2:1`; a hostfile has hydra's format, one
`host[:slots]` a line (`#` starts a comment). The N processes go to the hosts in blocks, in
order: with slots, each host takes that many; without, every host takes N / (number of hosts).
Hydra starts the processes of other hosts with a remote-exec command (`ssh` by default; any
program taking ssh's `HOST COMMAND...` arguments: `--remote-exec`).
"""
from __future__ import annotations

import os
import socket
from typing import List, Optional, Sequence, Tuple

__all__ = ["parse_hosts", "read_hostfile", "place", "hydra_host_args", "is_this_host",
           "remote_exec_path"]

HostSpec = Tuple[str, Optional[int]]        # (name, slots or None)


def _spec(item: str, where: str) -> HostSpec:
    name, sep, slots = item.strip().partition(":")
    if not name:
        raise ValueError(f"{where}: empty host name in {item!r}")
    if not sep:
        return name, None
    if not slots.strip().isdigit() or int(slots) < 1:
        raise ValueError(f"{where}: slots of host {name!r} must be a positive integer, got "
                         f"{slots!r}")
    return name, int(slots)


def parse_hosts(text: str, where: str = "--hosts") -> List[HostSpec]:
    """`h1,h2` or `h1:2,h2:1` (several comma-separated groups may be given as a list)."""
    hosts = [_spec(item, where) for item in text.split(",") if item.strip()]
    if not hosts:
        raise ValueError(f"{where}: no host given")
    return hosts


def read_hostfile(path: str) -> List[HostSpec]:
    """A hostfile: one `host[:slots]` a line; blank lines and `#` comments are skipped."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"--hostfile {path}: {e.strerror}") from None
    hosts = [_spec(line.split("#", 1)[0], f"--hostfile {path}, line {i + 1}")
             for i, line in enumerate(lines) if line.split("#", 1)[0].strip()]
    if not hosts:
        raise ValueError(f"--hostfile {path}: no host in it")
    return hosts


def place(n: int, hosts: Sequence[HostSpec], what: str = "processes") -> List[str]:
    """The host of each of `n` processes (blocks, in host order)."""
    names = [h for h, _ in hosts]
    if len(set(names)) != len(names):
        raise ValueError(f"a host is listed twice in {names}: give it slots instead "
                         f"(host:N)")
    slots = [s for _, s in hosts]
    if any(s is not None for s in slots):
        if any(s is None for s in slots):
            raise ValueError(f"give slots for every host or for none: {_show(hosts)}")
        if sum(slots) != n:
            raise ValueError(f"the hosts' slots ({_show(hosts)}: {sum(slots)}) must add up to "
                             f"the {n} {what}")
    else:
        if n % len(hosts):
            raise ValueError(f"{n} {what} do not divide evenly over the {len(hosts)} hosts "
                             f"{names} (give slots: host:N)")
        slots = [n // len(hosts)] * len(hosts)
    return [h for h, k in zip(names, slots) for _ in range(k)]


def _show(hosts: Sequence[HostSpec]) -> str:
    return ",".join(h if s is None else f"{h}:{s}" for h, s in hosts)


def hydra_host_args(placement: Sequence[str], remote_exec: Optional[str] = None) -> List[str]:
    """hydra's options placing the processes as `placement` says (host of each process, in
    blocks), started on other hosts by `remote_exec` (hydra's default, ssh, when None)."""
    counts: List[Tuple[str, int]] = []
    for h in placement:
        if counts and counts[-1][0] == h:
            counts[-1] = (h, counts[-1][1] + 1)
        else:
            counts.append((h, 1))
    args = ["-hosts", ",".join(f"{h}:{k}" for h, k in counts)]
    if remote_exec:
        args += ["-launcher", "ssh", "-launcher-exec", remote_exec]
    return args


def is_this_host(name: str) -> bool:
    """Whether host `name` (a name or an address) is this machine."""
    me = socket.gethostname()
    if name in ("localhost", me, me.split(".")[0]) or name.split(".")[0] == me:
        return True
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return False
    if address.startswith("127."):
        return True
    try:                     # an address of this machine can be bound here
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def remote_exec_path(command: Optional[str]) -> Optional[str]:
    """`--remote-exec`: a program name found on PATH, or a path (hydra needs the path)."""
    if not command:
        return None
    if os.sep in command:
        if not os.access(command, os.X_OK):
            raise ValueError(f"--remote-exec {command}: not an executable file")
        return os.path.abspath(command)
    import shutil

    found = shutil.which(command)
    if found is None:
        raise ValueError(f"--remote-exec {command}: not found on PATH")
    return found
