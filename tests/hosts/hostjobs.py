"""What the tests of jobs across simulated hosts share: the fixture's availability, the main job
(`popxl-run configs/mnist.yaml`) in the short form they run and its one-process reference, a
Ray cluster on the hosts, the outsider, and the processes a job leaves behind."""
from __future__ import annotations

import functools
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

import pytest

from simhosts import Host, SimHosts

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PY = sys.executable
POPXL_RUN = [PY, "-m", "popxl_launch"]
RAY = os.path.join(os.path.dirname(PY), "ray")

# The main job as the host tests run it: 6 replicas (on 2 or 3 workers) of 16 images a step, a
# checkpoint every 5 steps, the test set's first 1200 images at the end.
JOB_SETTINGS = ["train.replicas=6", "train.global_batch=96", "train.checkpoint_every=5",
                "test.batch_size=600", "test.limit=1200"]

# Command lines of a job's processes (Ray's daemons, started before, are the cluster's).
JOB_PROCESS = re.compile(r"popxl_launch|_ActorWorker|_InstanceActor|mpi_main|hydra_pmi_proxy|"
                         r"mpiexec|instance_wrapper|mnist_|backend_suite|ssh-remote")


def require_hosts() -> None:
    """Skip the module when this machine cannot run simulated hosts (says why)."""
    why = SimHosts.unavailable()
    if why:
        pytest.skip(why, allow_module_level=True)


def clean_env(**extra: str) -> Dict[str, str]:
    """This process's environment without popxl's or Ray's settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("POPXL_", "RAY_")) and k != "PYTHONPATH"}
    env.update(extra)
    return env


def main_job(run_dir: str, steps: int, *settings: str) -> List[str]:
    """The main job's arguments (after `popxl-run [options]`)."""
    sets = [a for s in [*JOB_SETTINGS, f"train.steps={steps}", *settings] for a in ("--set", s)]
    return ["configs/mnist.yaml", "--run-dir", run_dir, *sets]


def digest(output: str) -> str:
    found = re.findall(r"weights digest: ([0-9a-f]{64})", output)
    assert found, f"no weights digest in the output:\n{output[-3000:]}"
    return found[-1]


def step_ms(output: str) -> float:
    found = re.findall(r"one training step: median ([0-9.]+) ms", output)
    return float(found[-1]) if found else float("nan")


@functools.lru_cache(maxsize=None)
def reference_digest(steps: int) -> str:
    """The main job's weights digest after `steps` steps, every replica in one process."""
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([*POPXL_RUN, *main_job(os.path.join(tmp, "run"), steps)],
                             cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
        return digest(res.stdout)


def reference_in_background(steps: int) -> threading.Thread:
    """Start computing `reference_digest(steps)` (while the hosts start)."""
    t = threading.Thread(target=reference_digest, args=(steps,), daemon=True)
    t.start()
    return t


def resume_here(run_dir: str, steps: int) -> subprocess.CompletedProcess:
    """Continue an interrupted run of the main job (`main_job(run_dir, steps)`) in one process
    on this machine."""
    args = main_job(run_dir, steps)
    args[1] = "--resume"
    return subprocess.run([*POPXL_RUN, *args], cwd=ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=300)


def wait_for(condition, timeout: float, what: str) -> float:
    """Poll `condition` (bounded); seconds it took. Fails the test with `what` on timeout."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout, f"{what} within {timeout:g} s"
        time.sleep(0.05)
    return time.monotonic() - t0


def checkpoints(run_dir: str) -> List[str]:
    path = os.path.join(run_dir, "checkpoints")
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


# --- processes ---------------------------------------------------------------------------
def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def job_processes(sim: SimHosts) -> Dict[str, List[str]]:
    """The job processes left on each host (see JOB_PROCESS), as `pid cmdline`."""
    out = {}
    for h in sim.hosts:
        found = [f"{p} {c[:120]}" for p in h.job_processes() for c in [_cmdline(p)]
                 if JOB_PROCESS.search(c)]
        if found:
            out[h.name] = found
    return out


# --- a Ray cluster ------------------------------------------------------------------------
def start_ray_cluster(hosts: Sequence[Host], env: Dict[str, str], cpus: int = 1,
                      head_cpus: int = 0) -> str:
    """`ray start --head` on hosts[0] (`head_cpus` CPUs: by default it runs no actor, only the
    driver), `ray start --address` on the others (at once), `cpus` CPUs each, all with `env`
    (the token); the head's address."""
    head = hosts[0]
    common = ["--disable-usage-stats", "--object-store-memory", str(100 << 20)]
    res = head.run([RAY, "start", "--head", "--port", "6379", "--include-dashboard", "false",
                    "--num-cpus", str(head_cpus), *common], env=env, timeout=180)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    address = f"{head.address}:6379"
    starts = [h.popen([RAY, "start", "--address", address, "--num-cpus", str(cpus), *common],
                      env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for h in hosts[1:]]
    for p in starts:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out[-3000:]
    return address


def ray_token_env() -> Dict[str, str]:
    """Token authentication on (one token for the whole cluster) where this Ray has it."""
    from popxl.runtime.process.ray_init import has_token_auth

    if not has_token_auth():
        return {}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


GCS_PROBE = """
import sys
from ray._raylet import GcsClient
try:
    print("NODES", len(GcsClient(address=sys.argv[1]).get_all_node_info(timeout=20)))
except Exception as e:
    print("REFUSED", type(e).__name__)
"""


def gcs_probe(host: Host, address: str, token: Optional[str]) -> str:
    """From `host`: NODES if the GCS at `address` answers a client holding `token` (None: no
    token), else REFUSED."""
    env = clean_env(**({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token
                       else {"RAY_AUTH_MODE": "disabled"}))
    res = host.run([PY, "-c", GCS_PROBE, address], env=env, timeout=120)
    return (res.stdout.split() or [res.stderr[-300:]])[0]


# --- the outsider ---------------------------------------------------------------------------
def _listeners(host: Host) -> List[str]:
    """The TCP listeners of `host` on its network address (its /proc/net/tcp, as `ss -ltn`)."""
    from procs import _tcp_address

    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{host.pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] != "0A":
                continue
            ip, port = _tcp_address(fields[1]).rsplit(":", 1)
            if ip in ("0.0.0.0", "[::]"):
                ip = host.address
            if ip == host.address:
                found.append(f"{ip}:{port}")
    return found


class Outsider:
    """From `host` (not in the job), connects to every listener on the `targets`' addresses,
    those there when it starts and every one that appears until `stop()`, with junk, a forged
    hello and a wrong-token hello (`prober.py`). `results` holds what each got back."""

    def __init__(self, host: Host, targets: Sequence[Host]):
        self.targets = list(targets)
        self.proc = host.popen([PY, os.path.join(HERE, "prober.py")], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.results: List[dict] = []
        self.sent: List[str] = []
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.results.append(json.loads(line))

    def _watch(self) -> None:
        deadline = time.monotonic() + 900
        while not self._stop.is_set() and time.monotonic() < deadline:
            for h in self.targets:
                for address in _listeners(h):
                    if address not in self.sent:
                        self.sent.append(address)
                        self.proc.stdin.write(address + "\n")
                        self.proc.stdin.flush()
            time.sleep(0.01)

    def stop(self) -> List[dict]:
        self._stop.set()
        self._watcher.join(10)
        self.proc.stdin.close()
        self._reader.join(60)
        self.proc.wait(30)
        return self.results


_HTTP2_CONTROL = {4, 6, 7, 8}      # SETTINGS, PING, GOAWAY, WINDOW_UPDATE


def got_nothing(answer: dict) -> bool:
    """Whether a listener's answer to a probe held nothing: no byte, only HTTP/2 control
    frames (a gRPC server's preface and its refusal), or an HTTP client error (a web server
    refusing a request it cannot parse: 4xx)."""
    if "error" in answer or answer["received"] == 0:
        return True
    data = bytes.fromhex(answer["first"])
    if re.match(rb"HTTP/1\.[01] 4\d\d ", data):
        return True
    if len(data) < answer["received"]:
        return False
    while data:
        if len(data) < 9:
            return False
        length, kind = int.from_bytes(data[:3], "big"), data[3]
        if kind not in _HTTP2_CONTROL:
            return False
        data = data[9 + length:]
    return True


# --- a job on the hosts -----------------------------------------------------------------------
class Job:
    """A launcher started on `host` (output read as it comes, each line with the time it
    arrived) until `finish()`."""

    def __init__(self, host: Host, argv: Sequence[str], env: Dict[str, str]):
        self.t0 = time.monotonic()
        self.proc = host.popen(list(argv), env=env, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        self.lines: List[tuple] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.code: Optional[int] = None
        self.ended = float("nan")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    @property
    def output(self) -> str:
        return "".join(line for _, line in self.lines)

    def first(self, text: str) -> float:
        """When a line containing `text` arrived (monotonic time), or nan."""
        return next((t for t, line in self.lines if text in line), float("nan"))

    def finish(self, timeout: float = 300) -> "Job":
        try:
            self.code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.code = self.proc.wait()
            raise AssertionError(f"the launcher did not end within {timeout:g} s:\n"
                                 f"{self.output[-3000:]}")
        self.ended = time.monotonic()
        self._reader.join(30)
        return self


# --- faults -----------------------------------------------------------------------------------
def nothing_left(sim: SimHosts) -> None:
    """No process of the job on any host (bounded wait: teardown takes a moment)."""
    try:
        wait_for(lambda: not job_processes(sim), 30, "every job process to end")
    except AssertionError:
        raise AssertionError(f"left on the hosts: {job_processes(sim)}") from None


def at_first_checkpoint(sim: SimHosts, run_dir: str, start) -> Job:
    """`start()` (a Job of the main job in `run_dir`) with 20 ms of delay on every link (slow
    enough to be hit mid-training), once it has written its first checkpoint. The caller
    removes the delay (`sim.shape()`)."""
    sim.shape(delay=0.02)
    job = start()
    wait_for(lambda: checkpoints(run_dir) or job.proc.poll() is not None, 300,
             "a first checkpoint")
    assert job.proc.poll() is None, job.output[-3000:]
    return job


def stop_until_the_end(sim: SimHosts, job: Job, pids: Sequence[int]) -> float:
    """SIGSTOP `pids`, wait for the launcher to end (then SIGCONT them); when it was stopped
    (monotonic time)."""
    assert pids
    try:
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        t0 = time.monotonic()
        job.finish()
    finally:
        sim.shape()
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
            except OSError:
                pass
    return t0


def cut_until_the_end(sim: SimHosts, host: Host, job: Job) -> tuple:
    """Take `host`'s link down, wait for the launcher and then every job process on every host
    to end; (when it was cut, when the last process ended), monotonic times."""
    try:
        host.cut()
        cut = time.monotonic()
        job.finish()
        wait_for(lambda: not job_processes(sim), 60, "every job process to end")
        return cut, time.monotonic()
    finally:
        sim.shape()
        host.restore()


def processes_running(host: Host, text: str) -> List[int]:
    """The processes of `host` whose command line contains `text`."""
    return [p for p in host.job_processes() if text in _cmdline(p)]
