"""`popxl-run --backend ray --instances N [--replicas R] script.py args`: N Ray actors, each
running the whole script as one popdist instance (on a local Ray, or on the cluster at
`POPXL_RAY_ADDRESS`).

Before the script starts, this launcher and the actors build the job's links
(`popxl.runtime.transport.mesh`: shared memory on a node, sockets between nodes, every connection
proven with a per-job token),
passing the addresses and the token as Ray call arguments; the launcher is a member of that mesh.
The instances run their collectives over those links (`popxl.runtime.instances.links`); each
actor's stdout/stderr travel to the launcher on its link and are printed here, each line prefixed
`[instance N] `. Ray supervises the actors: an actor that dies or ends with a failure is told to
the other instances on the links. The exit code is the first failing instance's; a few seconds
after a failure the remaining actors are killed. Ctrl-C kills every actor (and the local Ray this
launcher started). The script must be at the same path on every node.
"""
from __future__ import annotations

import os
import queue
import secrets
import sys
import threading
import time
from typing import Dict, List, Sequence

from .instances import FAIL_GRACE
from .output import POPXL_RUN_PREFIX, LinePrefixer

__all__ = ["run_ray_instances"]

_SETUP_TIMEOUT = 180.0    # seconds for the actors to start and build the links
_BYE_GRACE = 5.0          # seconds the launcher waits for a finished instance's last output
_STDOUT, _STDERR = 1, 2


class _Printer:
    """Writes instances' output chunks here, whole lines, each with the instance prefix."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._lock = threading.Lock()
        self._lines: Dict[tuple, LinePrefixer] = {}

    def write(self, index: int, stream: str, data: bytes) -> None:
        with self._lock:
            pre = self._lines.setdefault((index, stream), LinePrefixer(
                self.prefix.format(i=index, stream=stream)))
            self._out(stream, pre.feed(data))

    def note(self, index: int, text: str) -> None:
        with self._lock:
            self._out("stderr", (self.prefix.format(i=index, stream="stderr") + text
                                 + "\n").encode())

    def flush(self) -> None:
        with self._lock:
            for (_, stream), pre in self._lines.items():
                self._out(stream, pre.flush())

    @staticmethod
    def _out(stream: str, data: bytes) -> None:
        if data:
            f = sys.stdout if stream == "stdout" else sys.stderr
            f.buffer.write(data)
            f.flush()


class _InstanceActor:
    """Runs the script as one instance (wrapped with `ray.remote` on first use): builds its part
    of the links (`hello`, `connect`, `attach`, called by the launcher), then `run`s."""

    def __init__(self, index: int, size: int, job: str, token: bytes, timeout: float,
                 use_shm: bool, spans: bool):
        from popxl.runtime.transport.endpoint import Endpoint
        from popxl.runtime.transport.mesh import MeshMember, listen_address
        from popxl.runtime.transport.pipes import shm_supported
        from popxl.runtime.backends.ray import _node_and_ip

        node, ip = _node_and_ip()
        self.index, self.size = index, size
        self.endpoint = Endpoint(index, timeout)
        self.endpoint.what = "Ray actor"
        use_shm = use_shm and shm_supported()
        self.mesh = MeshMember(self.endpoint, job, token, size + 1, node, ip, use_shm,
                               listen_address(spans, use_shm, ip))

    def hello(self) -> dict:
        return self.mesh.hello()

    def connect(self, table: List[dict]) -> None:
        self.mesh.connect(table)

    def attach(self) -> None:
        self.mesh.attach()

    def run(self, target: str, args: List[str], cwd: str) -> int:
        from popxl.runtime.instances.group import set_current_group
        from popxl.runtime.instances.join import close_instance_group, fail_instance
        from popxl.runtime.instances.links import LinkInstanceGroup, Uplink

        from .scripts import run_script

        from popxl.runtime.process.liveness import Watchdog

        self.mesh.finish()
        host = self.endpoint.procs.get(self.size, ("?", 0))[0]
        uplink = Uplink(self.endpoint.detach_link(self.size))    # the launcher is member N
        set_current_group(LinkInstanceGroup(self.index, self.size, self.endpoint, uplink))
        os.chdir(cwd)
        # A launcher that became unreachable can neither print this instance's output nor stop
        # it (and Ray cannot tell an actor on a host cut off from the cluster that its job
        # ended): the instance ends itself.
        watch = Watchdog(lambda: _launcher_lost(self.index, uplink.link, host),
                         name="popxl-instance-watchdog")
        forward = _ForwardOutput(uplink)
        failures: List[BaseException] = []
        try:
            code = run_script(target, args, on_exception=failures.append)
        finally:
            forward.stop()
            watch.stop()
        if code:
            fail_instance(failures[0] if failures else SystemExit(code))
        close_instance_group()
        _launcher_lost(self.index, uplink.link, host)
        uplink.close()                    # after the output and notices: they go first
        return code


def _launcher_lost(index: int, link, host: str) -> None:
    """End this instance's process if the launcher (on `host`) is unreachable (judged from
    the link's state alone: safe in a watchdog thread)."""
    from popxl.runtime.process.liveness import exit_process

    if link.probe() and link.unreachable:
        exit_process(f"instance {index}: the launcher (popxl-run, on {host}) is unreachable")


class _ForwardOutput:
    """This process's fd 1 and 2 redirected into pipes whose contents go to the launcher."""

    def __init__(self, uplink):
        from popxl.runtime.transport.links import OUTPUT

        from .output import pump

        self.saved = [os.dup(1), os.dup(2)]
        self.threads = []
        for fd, stream in ((1, _STDOUT), (2, _STDERR)):
            r, w = os.pipe()
            (sys.stdout if fd == 1 else sys.stderr).flush()
            os.dup2(w, fd)
            os.close(w)
            self.threads.append(pump(r, lambda data, s=stream: uplink.post(OUTPUT, s, data),
                                     None))
        self.buffering = [sys.stdout.line_buffering, sys.stderr.line_buffering]
        for f in (sys.stdout, sys.stderr):
            f.reconfigure(line_buffering=True)      # stream as the script prints

    def stop(self) -> None:
        for f, lb in zip((sys.stdout, sys.stderr), self.buffering):
            try:
                f.flush()
                f.reconfigure(line_buffering=lb)
            except (OSError, ValueError):
                pass
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)           # closes the pipes' write ends: the pumps see EOF
            os.close(saved)
        for t in self.threads:
            t.join(timeout=5.0)


class _Relay:
    """The launcher's end of the links, on a thread of its own: prints the instances' output,
    records their goodbyes and failure notices, sends the launcher's failure notices."""

    def __init__(self, endpoint, printer: _Printer, num_instances: int):
        self.ep = endpoint
        self.printer = printer
        self.n = num_instances
        self.notified: set = set()
        self._queue: "queue.Queue" = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="popxl-relay", daemon=True)
        self._thread.start()

    @property
    def failures(self) -> Dict[int, str]:
        """Failure notices the instances sent (origin -> message), first first."""
        return dict(self.ep.failures)

    def notify(self, origin: int, message: str, died: bool = False) -> None:
        """Tell every other instance that `origin` failed (once per origin). `died`: its actor
        died (the instances raise `WorkerDied`, as when they see its link close first)."""
        if origin not in self.notified:
            self.notified.add(origin)
            self._queue.put((origin, message, died))

    def _loop(self) -> None:
        from popxl.runtime.transport.links import FAILED
        from popxl.runtime.process.polling import Backoff

        ep = self.ep
        backoff = Backoff()
        while not self._stop.is_set():
            moved = False
            while True:
                try:
                    origin, message, died = self._queue.get_nowait()
                except queue.Empty:
                    break
                for i, link in ep.links.items():
                    if i != origin and not link.dead:
                        link.post(FAILED, 0, origin, int(died),
                                  message.encode("utf-8", "replace"))
            moved = ep.progress() or moved
            while ep.outputs:
                m = ep.outputs.popleft()
                self.printer.write(m.src, "stdout" if m.a == _STDOUT else "stderr", m.meta)
                moved = True
            if moved:
                backoff = Backoff()
            else:
                backoff.wait()

    def wait_for_goodbyes(self, instances: Sequence[int], timeout: float) -> None:
        """Wait (bounded) until `instances` said goodbye: their last output has arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not set(instances) <= self.ep.byes:
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.ep.close()


def _instance_env(i: int, n: int, replicas: int) -> Dict[str, str]:
    from popxl.runtime.instances.join import LINKS_ENV
    from popxl.runtime.backends.ray import _actor_env

    local = replicas // n
    env = {k: v for k, v in os.environ.items()
           if k.startswith("POPXL_") and k not in ("POPXL_BACKEND", "POPXL_WORKERS",
                                                   "POPXL_SINGLE_CONTROLLER")}
    env.update(_actor_env())
    env.update({
        "POPDIST_NUM_TOTAL_REPLICAS": str(replicas), "POPDIST_NUM_LOCAL_REPLICAS": str(local),
        "POPDIST_NUM_INSTANCES": str(n), "POPDIST_INSTANCE_INDEX": str(i),
        "POPDIST_REPLICA_INDEX_OFFSET": str(i * local), "POPDIST_LOCAL_INSTANCE_INDEX": str(i),
        "POPDIST_NUM_IPUS_PER_REPLICA": "1", "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE": "1",
        "POPXL_BACKEND": "local", "POPXL_INSTANCE_LAUNCHER": "1", LINKS_ENV: "1",
    })
    return env


def run_ray_instances(num_instances: int, num_replicas: int, target: str, args: Sequence[str],
                      prefix: str = POPXL_RUN_PREFIX) -> int:
    """Run `target` as `num_instances` instances on Ray actors; the first failing instance's
    exit code (0 if all succeeded)."""
    import ray

    from popxl.runtime.transport.endpoint import Endpoint
    from popxl.runtime.env import collective_timeout, ray_transport
    from popxl.runtime.transport.mesh import MeshMember, listen_address, new_token
    from popxl.runtime.transport.pipes import shm_supported, unlink_segments
    from popxl.runtime.backends.ray import _node_and_ip
    from popxl.runtime.process.ray_init import init_ray, spans_nodes

    if num_replicas % num_instances:
        raise ValueError(f"--replicas {num_replicas} is not divisible by --instances "
                         f"{num_instances}")
    n = num_instances
    started = init_ray(max(n, os.cpu_count() or 1), n, prog="popxl-run")
    printer = _Printer(prefix)
    job = f"popxl-rayinst-{os.getpid()}-{secrets.token_hex(12)}"
    token = new_token()
    timeout = collective_timeout()
    use_shm = ray_transport() == "auto" and shm_supported()
    spans = spans_nodes()
    node, ip = _node_and_ip()
    endpoint = Endpoint(n, timeout)
    mesh = MeshMember(endpoint, job, token, n + 1, node, ip, use_shm,
                      listen_address(spans, use_shm, ip))
    cls = ray.remote(num_cpus=1, max_concurrency=1)(_InstanceActor)
    actors = [cls.options(runtime_env={"env_vars": _instance_env(i, n, num_replicas)})
              .remote(i, n, job, token, timeout, use_shm, spans) for i in range(n)]
    relay = None
    try:
        table = ray.get([a.hello.remote() for a in actors], timeout=_SETUP_TIMEOUT) \
            + [mesh.hello()]
        ray.get([a.connect.remote(table) for a in actors], timeout=_SETUP_TIMEOUT)
        mesh.connect(table)
        attached = [a.attach.remote() for a in actors]
        mesh.attach()
        ray.get(attached, timeout=_SETUP_TIMEOUT)
        mesh.finish()
        relay = _Relay(endpoint, printer, n)
        refs = [a.run.remote(target, list(args), os.getcwd()) for a in actors]
        return _supervise(ray, refs, table, relay, printer)
    except KeyboardInterrupt:
        print("popxl-run: interrupted (Ctrl-C); stopping the instances", file=sys.stderr,
              flush=True)
        return 130
    finally:
        if relay is not None:
            relay.stop()
        else:
            mesh.abandon()
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        unlink_segments(job)
        printer.flush()
        if started:
            ray.shutdown()


def _supervise(ray, refs, table, relay: _Relay, printer: _Printer) -> int:
    """Wait for every instance; a few seconds after the first failure, stop waiting (the
    caller kills the rest). Returns the exit code of the instance whose failure came first
    (the origin of the first failure notice), else of the first to fail, else 0."""
    which = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    failed: Dict[int, int] = {}          # instance -> exit code, in the order they ended
    ended: List[int] = []
    stop_at = None
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=0.2)
        for ref in done:
            i = which[ref]
            host, pid = table[i]["host"], table[i]["pid"]
            try:
                code = ray.get(ref)
                ended.append(i)
            except ray.exceptions.RayActorError:
                printer.note(i, f"popxl-run: instance {i} (Ray actor, pid {pid} on {host}) died")
                relay.notify(i, f"its Ray actor (pid {pid} on {host}) died", died=True)
                code = 1
            except ray.exceptions.RayTaskError as e:
                printer.note(i, f"popxl-run: instance {i} failed: {e}")
                relay.notify(i, str(e).splitlines()[-1] if str(e) else "failed")
                code = 1
            if code:
                failed[i] = code
                relay.notify(i, f"its script exited with code {code}")
                if stop_at is None:
                    stop_at = time.monotonic() + FAIL_GRACE
        if pending and stop_at is not None and time.monotonic() > stop_at:
            i = next(iter(failed))
            printer.note(i, f"popxl-run: instance {i} failed (exit code {failed[i]}); stopping "
                            f"the other instances")
            break
    relay.wait_for_goodbyes(ended, _BYE_GRACE)
    notices = relay.failures
    origin = next(iter(notices), None)
    if origin in failed:
        return failed[origin]
    return next(iter(failed.values()), 0)
