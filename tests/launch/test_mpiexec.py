"""Which MPICH process manager a launch gets: gforker (no network listener) for one node, hydra
for several hosts or hydra-only options; the one-node environment that keeps MPICH's network
module on shared memory. (The listeners themselves: tests/popxl_dist/runtime/test_listeners.py.)"""
from __future__ import annotations

import os

import pytest

from popxl_launch.instances import InstanceLaunch, _mpiexec_command
from popxl_launch.mpiexec import (EXIT_ZERO_ENV, find_gforker, find_mpiexec, gforker_takes,
                                  one_node_env)

try:
    HAVE_MPICH = bool(find_mpiexec())
except FileNotFoundError:
    HAVE_MPICH = False
needs_gforker = pytest.mark.skipif(not (HAVE_MPICH and find_gforker()),
                                   reason="MPICH's mpiexec.gforker not installed")


def test_gforker_takes_only_its_own_options():
    assert gforker_takes([])
    assert gforker_takes(["-genv", "A", "1", "-env", "B", "2", "-wdir", "/tmp"])
    assert not gforker_takes(["-bind-to", "core"])
    assert not gforker_takes(["-hosts", "a,b"])


def test_one_node_env_keeps_mpich_on_shared_memory_unless_the_user_chose():
    env = one_node_env({"PATH": "/bin"})
    assert env["UCX_TLS"] == "self,sm" and env["FI_PROVIDER"] == "shm"
    assert one_node_env({"UCX_TLS": "tcp"})["UCX_TLS"] == "tcp"


@needs_gforker
def test_one_node_launches_use_gforker_and_hosts_use_hydra():
    cmd, _ = _mpiexec_command(InstanceLaunch(2, 4), ["python", "x.py"])
    assert os.path.basename(cmd[0]) == "mpiexec.gforker"
    assert cmd[1:4] == ["-genv", EXIT_ZERO_ENV, "1"]      # its wrappers exit 0
    cmd, _ = _mpiexec_command(InstanceLaunch(2, 4, hosts=["a", "b"]), ["python", "x.py"])
    assert os.path.basename(cmd[0]) == "mpiexec" and "-hosts" in cmd
    cmd, _ = _mpiexec_command(InstanceLaunch(2, 4, mpi_global_args=["--bind-to none"]),
                              ["python", "x.py"])
    assert os.path.basename(cmd[0]) == "mpiexec" and "-bind-to" in cmd
