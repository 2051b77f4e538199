"""Naming the hosts of an MPI launch: `--hosts` / `--hostfile` parsing and placement, hydra's
options, the checks popxl-run makes before it starts anything, and Open MPI's remote-exec
option in poprun. (Launches across hosts: tests/popxl_dist/runtime/test_hosts_mpi.py.)"""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from popxl_launch.hosts import (hydra_host_args, is_this_host, parse_hosts, place,
                                read_hostfile)
from popxl_launch.instances import InstanceLaunch, _mpiexec_command, translate_mpi_args


def test_hosts_and_slots_place_processes_in_blocks():
    assert parse_hosts("a,b") == [("a", None), ("b", None)]
    assert place(4, parse_hosts("a,b")) == ["a", "a", "b", "b"]
    assert place(3, parse_hosts("a:2,b:1")) == ["a", "a", "b"]
    assert hydra_host_args(["a", "a", "b"]) == ["-hosts", "a:2,b:1"]
    assert hydra_host_args(["a", "b"], "/x/ssh") == ["-hosts", "a:1,b:1", "-launcher", "ssh",
                                                     "-launcher-exec", "/x/ssh"]


@pytest.mark.parametrize("n, spec, message", [
    (3, "a,b", "do not divide evenly over the 2 hosts"),
    (4, "a:2,b:1", "must add up to the 4"),
    (3, "a:2,b", "slots for every host or for none"),
    (2, "a,a", "listed twice"),
    (2, "a:0", "positive integer"),
    (2, ",", "no host given"),
])
def test_impossible_placements_are_refused(n, spec, message):
    with pytest.raises(ValueError, match=message):
        place(n, parse_hosts(spec))


def test_a_hostfile_has_hydras_format(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the cluster\nh1:2   # first\n\n  h2:2\n")
    assert read_hostfile(str(path)) == [("h1", 2), ("h2", 2)]
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="no host in it"):
        read_hostfile(str(path))
    with pytest.raises(ValueError, match="No such file"):
        read_hostfile(str(tmp_path / "missing"))


def test_this_host_is_recognised():
    assert is_this_host(socket.gethostname()) and is_this_host("localhost")
    assert not is_this_host("no-such-host.invalid")


def _popxl_run(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "popxl_launch", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_hydras_own_hostfile_variable_is_honoured(tmp_path):
    """(hydra's HYDRA_HOST_FILE used to be ignored: gforker ran every rank on this host)"""
    import os

    path = tmp_path / "hosts"
    path.write_text("no-such-host.invalid\nb\n")
    res = _popxl_run("--backend", "mpi", "--workers", "2", "script.py",
                     env={**os.environ, "HYDRA_HOST_FILE": str(path)})
    assert res.returncode == 2 and "(no-such-host.invalid) must be this machine" in res.stderr


@pytest.mark.parametrize("args, message", [
    (["--backend", "mpi", "--workers", "2", "--hosts", "no-such-host.invalid,b"],
     "must be this machine"),
    (["--backend", "ray", "--workers", "2", "--hosts", "a,b"], "place MPI ranks"),
    (["--backend", "mpi", "--workers", "2", "--remote-exec", "ssh"], "needs --hosts"),
    (["--backend", "mpi", "--workers", "3", "--hosts", "localhost,b"], "divide evenly"),
    (["--backend", "mpi", "--workers", "2", "--hosts", "a,b", "--hostfile", "f"], "not both"),
    (["--backend", "mpi", "--instances", "2", "--hosts", "a,b", "--remote-exec",
      "/no/such/ssh"], "not an executable"),
])
def test_popxl_run_refuses_bad_hosts_before_starting(args, message):
    res = _popxl_run(*args, "script.py")
    assert res.returncode == 2 and message in res.stderr, res.stderr


def test_instances_on_hosts_with_slots_and_a_remote_exec_command():
    launch = InstanceLaunch(3, 6, hosts=["a", "b"], slots=[2, 1], remote_exec="/x/ssh")
    assert [launch.host_of(i) for i in range(3)] == ["a", "a", "b"]
    assert [launch.local_index(i) for i in range(3)] == [0, 1, 0]
    cmd, _ = _mpiexec_command(launch, ["python", "x.py"])
    assert cmd[cmd.index("-hosts"):cmd.index("-hosts") + 6] == [
        "-hosts", "a:2,b:1", "-launcher", "ssh", "-launcher-exec", "/x/ssh"]


def test_open_mpi_remote_exec_option_becomes_hydras():
    out, notes = translate_mpi_args(["--mca", "plm_rsh_agent", "/x/ssh", "--mca",
                                     "btl_tcp_if_include", "eth0"], local=False)
    assert out == ["-launcher", "ssh", "-launcher-exec", "/x/ssh"]
    assert notes == ["ignoring Open MPI option --mca btl_tcp_if_include eth0"]
