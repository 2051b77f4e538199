"""MPICH's process managers, as `popxl-run --backend mpi` and `poprun` use them (the mpich wheel
installs both beside this Python).

* One node: `mpiexec.gforker`, MPICH's fork-based process manager. It talks to the ranks over
  socketpairs they inherit (`PMI_FD`) and opens no network listener. When a rank ends without
  MPI_Finalize (killed, or leaving a job with a dead peer) it signals every other rank (SIGINT,
  then SIGQUIT), which would keep the others from reporting the failure: each rank runs under a
  wrapper that ignores gforker's SIGINT / SIGQUIT (a terminal's Ctrl-C reaches the ranks
  themselves: they share the launcher's process group) and exits 0 (the launchers learn the
  exit codes from files).
  MPICH's network module would still open listeners of its own (UCX's and libfabric's TCP
  transports, on every interface) although ranks of one node talk through shared memory:
  `one_node_env` limits both to shared memory.
* Several nodes (`poprun --host`), or MPI options only hydra knows: hydra (`mpiexec`). Its
  control port listens on every interface (the proxies on the other nodes connect back to it),
  unauthenticated: a multi-node MPI job is as private as the network between its nodes.
  Between nodes MPICH talks TCP through libfabric's `sockets` provider (`across_hosts_env`):
  with the UCX netmod a rank whose TCP peer dies crashes (SIGSEGV), and libfabric's `tcp`
  provider hangs in the next call; the sockets provider returns an error for a call towards
  the dead peer, which the runtime reports as its death, but still aborts a rank that had a
  message in flight to it (an error MPICH takes as fatal), so the rank wrapper names a rank
  killed by a signal and its host (`HOSTS_RANK_WRAPPER`).

"""
from __future__ import annotations

import os
import shutil
import sys
from typing import List, Optional, Sequence

__all__ = ["install_hint", "find_mpiexec", "find_gforker", "gforker_takes", "one_node_env",
           "across_hosts_env", "RANK_WRAPPER", "HOSTS_RANK_WRAPPER", "EXIT_ZERO_ENV"]

# Set for ranks under gforker: their wrapper exits 0 whatever the command's exit code.
EXIT_ZERO_ENV = "POPXL_RANK_EXIT_ZERO"

# A rank of a single-controller job: exit code 0 (the host reports the script's own through a
# file; a worker's death is the host's to report, not a reason to stop the job), the process
# manager's SIGINT / SIGQUIT caught (a trap, not an ignore: the command keeps the default
# actions and gets a terminal's Ctrl-C itself), hydra's SIGUSR1 exit notices ignored.
RANK_WRAPPER = 'trap "" USR1; trap : INT QUIT; "$@"; exit 0'

# The same across hosts, where MPICH cannot outlive a dead peer (the ranks with messages in
# flight to it abort): a rank ended by a signal is named, with its host, before that happens.
HOSTS_RANK_WRAPPER = ('trap "" USR1; trap : INT QUIT; "$@"; code=$?; if [ $code -gt 128 ]; then '
                      'echo "popxl-run: worker $PMI_RANK (MPI rank $PMI_RANK) on $(hostname) '
                      'was killed by signal $((code - 128))" >&2; fi; exit 0')

# gforker's options, with the number of values each takes.
_GFORKER_OPTIONS = {"-genv": 2, "-env": 2, "-wdir": 1, "-genvlist": 1, "-envlist": 1,
                    "-genvnone": 0, "-envnone": 0}


def one_node_env(env: dict) -> dict:
    """`env` for ranks that all run on this node: MPICH's network module restricted to shared
    memory (UCX: `self,sm`; libfabric: its `shm` provider), so the ranks open no TCP listener.
    Settings the user made win."""
    out = dict(env)
    out.setdefault("UCX_TLS", "self,sm")
    out.setdefault("FI_PROVIDER", "shm")
    return out


def across_hosts_env(env: dict) -> dict:
    """`env` for ranks on several hosts: MPICH's libfabric netmod with its `sockets` provider
    (a peer that dies is an error MPI returns, not a crash or a hang). Settings the user made
    win."""
    out = dict(env)
    if "MPIR_CVAR_CH4_NETMOD" not in out and "FI_PROVIDER" not in out:
        out["MPIR_CVAR_CH4_NETMOD"] = "ofi"
        out["FI_PROVIDER"] = "sockets"
    return out


def install_hint(extra: str) -> str:
    """How to install one of the project's extras, for error messages."""
    return f'the {extra} extra: pip install -e ".[{extra}]" in the popxl-dist clone'


def find_mpiexec() -> str:
    """The `mpiexec` (hydra) beside this Python (the mpich wheel installs it there), else on
    PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(f"mpiexec is not installed ({install_hint('mpi')})")
    return found


def find_gforker() -> Optional[str]:
    """MPICH's `mpiexec.gforker` beside the `mpiexec` in use, or None."""
    try:
        hydra = find_mpiexec()
    except FileNotFoundError:
        return None
    path = os.path.join(os.path.dirname(os.path.realpath(hydra)), "mpiexec.gforker")
    if not os.path.exists(path):
        path = os.path.join(os.path.dirname(hydra), "mpiexec.gforker")
    return path if os.access(path, os.X_OK) else None


def gforker_takes(args: Sequence[str]) -> bool:
    """Whether every option in `args` (hydra-style, as `translate_mpi_args` gives them) is one
    gforker understands."""
    it: List[str] = list(args)
    i = 0
    while i < len(it):
        n = _GFORKER_OPTIONS.get(it[i])
        if n is None:
            return False
        i += 1 + n
    return True
