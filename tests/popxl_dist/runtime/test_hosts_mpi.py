"""MPI across simulated hosts (tests/hosts/simhosts.py): h1 and h2 run the job under hydra,
whose remote-exec command is the hosts' ssh stand-in; h3 is an outsider.

* `poprun --host h1,h2` (the remote-exec command given as Open MPI's `--mca plm_rsh_agent`),
  `popxl-run --backend mpi --workers 2 --hosts h1,h2` and `--instances 2 --hostfile FILE`:
  bitwise equal to one process, and quiet (no transport warning); an outsider on h3 connecting
  to every listener of the job with junk, forged and wrong-token hellos gets nothing and
  changes nothing;
* the main job (configs/mnist.yaml), bitwise, and again with 20 ms delay and 1% loss on every
  link (the slowdown printed);
* faults, each bounded: a rank killed (named with its host; MPICH aborts the ranks that had
  messages in flight to it, else the script gets WorkerDied naming it),
  a rank stopped (CollectiveTimeout at POPXL_COLLECTIVE_TIMEOUT), a host cut off mid-training
  (HostUnreachable naming the host and rank within POPXL_PEER_TIMEOUT + 2 s, no process of the
  job left on any host; the last checkpoint resumes bitwise).

Timings are printed (`-s`), never asserted."""
from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from hostjobs import (POPXL_RUN, PY, Job, Outsider, at_first_checkpoint, clean_env,
                      cut_until_the_end, digest, got_nothing, main_job, nothing_left,
                      processes_running, reference_digest, reference_in_background,
                      require_hosts, resume_here, step_ms, stop_until_the_end)
from simhosts import SimHosts
from test_backends import (HAVE_MPI, SUITE, assert_bitwise_equal, assert_suite_ok,
                           load_weights, local_weights)  # noqa: F401
from test_instances import DP, DP_ARGS, assert_dp_bitwise, dp_reference  # noqa: F401

pytestmark = pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpich not installed")
require_hosts()

STEPS = 30                   # the main job's steps here (a checkpoint every 5)
PEER_TIMEOUT = 3.0           # POPXL_PEER_TIMEOUT of the fault tests (default 10 s)
QUIET = ("WARN", "UCX", "Traceback", "[mpiexec@", "[proxy:")   # none in a successful run


class Hosts:
    def __init__(self, sim: SimHosts):
        self.sim = sim
        self.hosts = ["--hosts", "h1,h2", "--remote-exec", sim.ssh]

    def job(self, *args: str, **extra: str) -> Job:
        """A launcher on h1 (this project's Python: `python -m popxl_launch` unless `args`
        starts with a module of its own)."""
        return Job(self.sim[0], [*POPXL_RUN[:2], *args], clean_env(**extra))


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reference = reference_in_background(STEPS)
    with SimHosts(3, str(tmp_path_factory.mktemp("mpihosts"))) as sim:
        reference.join()
        yield Hosts(sim)


def _quiet(output: str) -> None:
    noise = [line for line in output.splitlines() if any(w in line for w in QUIET)]
    assert not noise, noise


def test_poprun_across_hosts_bitwise_and_quiet(hosts, dp_reference):
    out = f"{hosts.sim.shared}/poprun"
    os.makedirs(out)
    job = hosts.job("popxl_launch.poprun", "--host", "h1,h2", "--num-instances", "2",
                    "--num-replicas", "4", f"--mpi-global-args=--mca plm_rsh_agent "
                    f"{hosts.sim.ssh}", PY, DP, *DP_ARGS, "--save-losses", out,
                    "--save-weights", f"{out}/weights.npz").finish()
    assert job.code == 0, job.output[-3000:]
    assert "[1,0]<stdout>: Accuracy on test set:" in job.output
    _quiet(job.output)
    assert_dp_bitwise(out, dp_reference)
    nothing_left(hosts.sim)


def test_workers_across_hosts_bitwise_quiet_and_an_outsider_gets_nothing(hosts, local_weights):
    sim = hosts.sim
    weights = f"{sim.shared}/dp.npz"
    outsider = Outsider(sim[2], sim.hosts[:2])
    job = hosts.job("popxl_launch", "--backend", "mpi", "--workers", "2", *hosts.hosts, SUITE,
                    "--no-cases", "--dp-weights", weights).finish()
    answers = outsider.stop()
    assert_suite_ok(SimpleNamespace(stdout=job.output, stderr="", returncode=job.code))
    _quiet(job.output)
    assert_bitwise_equal(load_weights(weights), local_weights)
    # hydra's control port and MPICH's transports listen on the hosts' addresses
    assert answers, "no listener of the job was seen"
    bad = [a for a in answers for k in ("junk", "forged", "wrong_token")
           if not got_nothing(a.get(k, {"error": "not probed"}))]
    assert not bad, bad
    print(f"\noutsider: {len(answers)} listeners probed, each got nothing")
    nothing_left(hosts.sim)


def test_instances_from_a_hostfile_bitwise(hosts, dp_reference):
    sim = hosts.sim
    out = f"{sim.shared}/instances"
    os.makedirs(out)
    hostfile = f"{sim.shared}/hostfile"
    with open(hostfile, "w") as f:
        f.write("# the job's hosts\nh1:1\n\nh2:1   # one slot each\n")
    job = hosts.job("popxl_launch", "--backend", "mpi", "--instances", "2", "--replicas", "4",
                    "--hostfile", hostfile, "--remote-exec", sim.ssh, DP, *DP_ARGS,
                    "--save-losses", out, "--save-weights", f"{out}/weights.npz").finish()
    assert job.code == 0, job.output[-3000:]
    assert "[instance 0] Accuracy on test set:" in job.output
    _quiet(job.output)
    assert_dp_bitwise(out, dp_reference)
    nothing_left(hosts.sim)


def test_main_job_bitwise_with_and_without_delay_and_loss(hosts):
    sim = hosts.sim
    plain = hosts.job("popxl_launch", "--backend", "mpi", "--workers", "2", *hosts.hosts,
                      *main_job(f"{sim.shared}/plain", STEPS)).finish()
    assert plain.code == 0, plain.output[-3000:]
    _quiet(plain.output)
    sim.shape(delay=0.02, loss=0.01)
    try:
        slow = hosts.job("popxl_launch", "--backend", "mpi", "--workers", "2", *hosts.hosts,
                         *main_job(f"{sim.shared}/slow", STEPS)).finish()
    finally:
        sim.shape()
    assert slow.code == 0, slow.output[-3000:]
    assert digest(plain.output) == digest(slow.output) == reference_digest(STEPS)
    print(f"\nMPI, 2 hosts: one training step {step_ms(plain.output):.1f} ms; with 20 ms delay "
          f"and 1% loss {step_ms(slow.output):.1f} ms "
          f"({step_ms(slow.output) / step_ms(plain.output):.1f}x)")
    nothing_left(hosts.sim)


def _faulty_job(hosts, name: str, **extra: str) -> tuple:
    """The main job on h1 and h2, up to its first checkpoint (20 ms delay on every link)."""
    run_dir = f"{hosts.sim.shared}/{name}"
    job = at_first_checkpoint(hosts.sim, run_dir, lambda: hosts.job(
        "popxl_launch", "--backend", "mpi", "--workers", "2", *hosts.hosts,
        *main_job(run_dir, STEPS), **extra))
    return job, run_dir


def test_a_rank_killed_is_named(hosts):
    job, _ = _faulty_job(hosts, "killed")
    try:
        # the job's rank on h2 (hydra's proxy, the process manager, lives: hydra does not
        # survive the loss of a proxy, see docs/cluster.md)
        ranks = processes_running(hosts.sim[1], "popxl_launch.mpi_main")
        assert ranks
        for p in ranks:
            os.kill(p, signal.SIGKILL)
        job.finish()
    finally:
        hosts.sim.shape()
    assert job.code != 0
    text = job.output
    # MPICH aborts a rank that had a message in flight to the dead one (then its wrapper names
    # the dead rank and host, when hydra forwards that line before it ends the job); else the
    # script gets WorkerDied naming them
    assert ("WorkerDied" in text and " on h2) died" in text
            or "aborted by MPI after another rank died" in text), text[-3000:]
    print(f"\nMPI: a rank killed on h2: {'WorkerDied' if 'WorkerDied' in text else 'MPI abort'}; "
          f"named by its wrapper: {'worker 1 (MPI rank 1) on h2 was killed' in text}")
    nothing_left(hosts.sim)


def test_a_stopped_rank_times_out(hosts):
    job, _ = _faulty_job(hosts, "stopped", POPXL_COLLECTIVE_TIMEOUT="5")
    t0 = stop_until_the_end(hosts.sim, job,
                            processes_running(hosts.sim[1], "popxl_launch.mpi_main"))
    assert job.code != 0
    assert "CollectiveTimeout" in job.output and "5 s" in job.output, job.output[-3000:]
    print(f"\nMPI: a rank stopped: the error {job.first('CollectiveTimeout') - t0:.1f} s later, "
          f"the launcher ended {job.ended - t0:.1f} s (POPXL_COLLECTIVE_TIMEOUT=5)")
    nothing_left(hosts.sim)


def test_a_host_cut_off_is_named_nothing_is_left_and_the_run_resumes(hosts):
    job, run_dir = _faulty_job(hosts, "cut", POPXL_PEER_TIMEOUT=str(PEER_TIMEOUT))
    cut, gone = cut_until_the_end(hosts.sim, hosts.sim[1], job)
    text = job.output
    assert job.code != 0
    assert "HostUnreachable: host h2 is unreachable" in text, text[-3000:]
    assert "worker 1 (MPI rank 1, pid" in text, text[-3000:]
    assert text.count("Traceback") == 1, text[-5000:]
    print(f"\nMPI: h2 cut off: the error {job.first('HostUnreachable') - cut:.1f} s later, the "
          f"launcher gone {job.ended - cut:.1f} s, the last process of the job {gone - cut:.1f} s "
          f"(POPXL_PEER_TIMEOUT={PEER_TIMEOUT:g})")
    resumed = resume_here(run_dir, STEPS)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert digest(resumed.stdout) == reference_digest(STEPS)
