"""The Ray backends across simulated hosts (tests/hosts/simhosts.py): a Ray cluster with token
authentication on (one token), the head on h1 (no CPU: it runs the driver only) and a worker
node with one CPU on each of h2 and h3; h4 is an outsider. Through POPXL_RAY_ADDRESS:

* workers on every host, links between hosts over sockets (proven with the job's token),
  bitwise equal to one process; an outsider on h4 connecting to every listener on the
  cluster's addresses with junk, forged and wrong-token hellos gets nothing and changes
  nothing, and the cluster refuses a client without the token;
* instances on h2 and h3, bitwise;
* the main job (configs/mnist.yaml), bitwise, and again with 20 ms delay and 1% loss on every
  link (the slowdown printed);
* faults, each bounded: a host's job processes killed (WorkerDied naming the host and worker),
  a worker stopped (CollectiveTimeout at POPXL_COLLECTIVE_TIMEOUT), a host cut off
  mid-training (HostUnreachable naming the host and worker within POPXL_PEER_TIMEOUT + 2 s,
  no process of the job left on any host; the last checkpoint resumes bitwise).

Timings are printed (`-s`), never asserted."""
from __future__ import annotations

import json
import os
import signal
from types import SimpleNamespace

import pytest

from hostjobs import (POPXL_RUN, Job, Outsider, at_first_checkpoint, clean_env,
                      cut_until_the_end, digest, gcs_probe, got_nothing, job_processes,
                      main_job, nothing_left, processes_running, ray_token_env,
                      reference_digest, reference_in_background, require_hosts, resume_here,
                      start_ray_cluster, step_ms, stop_until_the_end, wait_for)
from simhosts import SimHosts
from test_backends import (HAVE_RAY, SUITE, assert_bitwise_equal, assert_suite_ok,
                           load_weights, local_weights)  # noqa: F401
from test_instances import DP, DP_ARGS, assert_dp_bitwise, dp_reference  # noqa: F401

pytestmark = pytest.mark.skipif(not HAVE_RAY, reason="ray not installed")
require_hosts()

STEPS = 30                   # the main job's steps here (a checkpoint every 5)
PEER_TIMEOUT = 3.0           # POPXL_PEER_TIMEOUT of the fault tests (default 10 s)


class Cluster:
    def __init__(self, sim: SimHosts, address: str, env: dict):
        self.sim, self.address, self.env = sim, address, env
        self.token = env.get("RAY_AUTH_TOKEN")

    def job(self, *args: str, **extra: str) -> Job:
        """popxl-run on h1 (the head), on the cluster."""
        env = {**self.env, "POPXL_RAY_ADDRESS": self.address, **extra}
        return Job(self.sim[0], [*POPXL_RUN, *args], env)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reference = reference_in_background(STEPS)
    with SimHosts(4, str(tmp_path_factory.mktemp("rayhosts"))) as sim:
        env = clean_env(**ray_token_env())
        address = start_ray_cluster(sim.hosts[:3], env)
        reference.join()
        yield Cluster(sim, address, env)


def test_workers_on_every_host_bitwise_and_an_outsider_gets_nothing(cluster, local_weights):
    sim = cluster.sim
    stats, weights = f"{sim.shared}/stats.json", f"{sim.shared}/dp.npz"
    outsider = Outsider(sim[3], sim.hosts[:3])
    job = cluster.job("--backend", "ray", "--workers", "3", SUITE, "--no-cases",
                      "--dp-weights", weights, "--transport-stats", stats).finish()
    answers = outsider.stop()
    assert_suite_ok(SimpleNamespace(stdout=job.output, stderr="", returncode=job.code))
    assert_bitwise_equal(load_weights(weights), local_weights)
    with open(stats) as f:
        table = json.load(f)
    assert len({s["node"] for s in table}) == 3, table           # a worker on every host
    assert all(kind == "socket" for s in table for kind in s["links"].values()), table
    assert sum(s["data_bytes_sent"]["socket"] for s in table) > 0, table

    # the outsider: every listener on the cluster's addresses, before and during the job
    assert len(answers) >= 6, answers                      # Ray's servers on 3 hosts at least
    bad = [a for a in answers for k in ("junk", "forged", "wrong_token")
           if not got_nothing(a.get(k, {"error": "not probed"}))]
    assert not bad, bad
    assert gcs_probe(sim[3], cluster.address, "0" * 64) == "REFUSED"   # a wrong token
    assert gcs_probe(sim[3], cluster.address, None) == "REFUSED"       # none
    if cluster.token:
        assert gcs_probe(sim[3], cluster.address, cluster.token) == "NODES"   # the control
    print(f"\noutsider: {len(answers)} listeners probed, each got nothing")
    nothing_left(cluster.sim)


def test_instances_on_two_hosts_bitwise(cluster, dp_reference):
    out = f"{cluster.sim.shared}/instances"
    os.makedirs(out)
    seen = {}

    def placed() -> bool:
        for h in cluster.sim.hosts[:3]:
            if any("_InstanceActor" in line for line in job_processes(cluster.sim).get(h.name, [])):
                seen[h.name] = True
        return job.proc.poll() is not None

    job = cluster.job("--backend", "ray", "--instances", "2", "--replicas", "4", DP, *DP_ARGS,
                      "--save-losses", out, "--save-weights", f"{out}/weights.npz")
    wait_for(placed, 300, "the instances to end")
    job.finish()
    assert job.code == 0, job.output[-3000:]
    assert "[instance 0] Accuracy on test set:" in job.output
    assert sorted(seen) == ["h2", "h3"], seen
    assert_dp_bitwise(out, dp_reference)
    nothing_left(cluster.sim)


def test_main_job_bitwise_with_and_without_delay_and_loss(cluster):
    sim = cluster.sim
    plain = cluster.job("--backend", "ray", "--workers", "3",
                        *main_job(f"{sim.shared}/plain", STEPS)).finish()
    assert plain.code == 0, plain.output[-3000:]
    sim.shape(delay=0.02, loss=0.01)
    try:
        slow = cluster.job("--backend", "ray", "--workers", "3",
                           *main_job(f"{sim.shared}/slow", STEPS)).finish()
    finally:
        sim.shape()
    assert slow.code == 0, slow.output[-3000:]
    assert digest(plain.output) == digest(slow.output) == reference_digest(STEPS)
    print(f"\nRay, 3 hosts: one training step {step_ms(plain.output):.1f} ms; with 20 ms delay "
          f"and 1% loss {step_ms(slow.output):.1f} ms "
          f"({step_ms(slow.output) / step_ms(plain.output):.1f}x)")
    nothing_left(cluster.sim)


def _faulty_job(cluster, name: str, **extra: str) -> tuple:
    """The main job on the cluster, up to its first checkpoint (20 ms delay on every link)."""
    run_dir = f"{cluster.sim.shared}/{name}"
    job = at_first_checkpoint(cluster.sim, run_dir, lambda: cluster.job(
        "--backend", "ray", "--workers", "3", *main_job(run_dir, STEPS), **extra))
    return job, run_dir


def test_a_hosts_processes_killed_is_named(cluster):
    job, _ = _faulty_job(cluster, "killed")
    try:
        victims = processes_running(cluster.sim[2], "_ActorWorker")
        assert victims
        for p in victims:
            os.kill(p, signal.SIGKILL)
        job.finish()
    finally:
        cluster.sim.shape()
    assert job.code != 0
    assert "WorkerDied" in job.output and "on h3) died" in job.output, job.output[-3000:]
    nothing_left(cluster.sim)


def test_a_stopped_worker_times_out(cluster):
    job, _ = _faulty_job(cluster, "stopped", POPXL_COLLECTIVE_TIMEOUT="5")
    t0 = stop_until_the_end(cluster.sim, job, processes_running(cluster.sim[1], "_ActorWorker"))
    assert job.code != 0
    assert "CollectiveTimeout" in job.output and "5 s" in job.output, job.output[-3000:]
    print(f"\nRay: a worker stopped: the error {job.first('CollectiveTimeout') - t0:.1f} s "
          f"later, the launcher ended {job.ended - t0:.1f} s (POPXL_COLLECTIVE_TIMEOUT=5)")
    nothing_left(cluster.sim)


def test_a_host_cut_off_is_named_nothing_is_left_and_the_run_resumes(cluster):
    """Last in the module: the cluster loses h3."""
    job, run_dir = _faulty_job(cluster, "cut", POPXL_PEER_TIMEOUT=str(PEER_TIMEOUT))
    cut, gone = cut_until_the_end(cluster.sim, cluster.sim[2], job)
    text = job.output
    assert job.code != 0
    assert "HostUnreachable: host h3 (" in text and "is unreachable" in text, text[-3000:]
    assert "on h3) on it is lost" in text, text[-3000:]
    assert text.count("Traceback") == 1, text[-5000:]
    print(f"\nRay: h3 cut off: the error {job.first('HostUnreachable') - cut:.1f} s later, the "
          f"launcher gone {job.ended - cut:.1f} s, the last process of the job {gone - cut:.1f} s "
          f"(POPXL_PEER_TIMEOUT={PEER_TIMEOUT:g})")
    resumed = resume_here(run_dir, STEPS)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert digest(resumed.stdout) == reference_digest(STEPS)
