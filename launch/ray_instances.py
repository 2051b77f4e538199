"""`popxl-run --backend ray --instances N [--replicas R] script.py args`: N Ray actors, each
running the whole script as one popdist instance (on a local Ray, or on the cluster at
`POPXL_RAY_ADDRESS`).

Each actor gets the popdist environment of its instance and the address of this launcher's hub
(`popxl.runtime.hub`): the instances meet there and then connect directly (the socket instance
group), failure notices go through it, and the actors' stdout/stderr stream to it and are printed
here, each line prefixed `[instance N] `. The exit code is the first failing instance's; a few
seconds after a failure the remaining actors are killed. Ctrl-C kills every actor (and the local
Ray this launcher started). The script must be at the same path on every node.
"""
from __future__ import annotations

import codecs
import logging
import os
import sys
import threading
import time
from typing import Dict, List, Sequence

from .instances import FAIL_GRACE
from .output import POPXL_RUN_PREFIX, LinePrefixer

__all__ = ["run_ray_instances"]


class _Printer:
    """Writes instances' output chunks here, whole lines, each with the instance prefix."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._lock = threading.Lock()
        self._lines: Dict[tuple, LinePrefixer] = {}

    def write(self, index: int, stream: str, text: str) -> None:
        with self._lock:
            pre = self._lines.setdefault((index, stream), LinePrefixer(
                self.prefix.format(i=index, stream=stream)))
            self._out(stream, pre.feed(text.encode()))

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
    """Runs the script as one instance (wrapped with `ray.remote` on first use)."""

    def __init__(self, index: int):
        self.index = index

    def where(self) -> tuple:
        import socket

        return socket.gethostname(), os.getpid()

    def run(self, target: str, args: List[str], cwd: str, hub: str) -> int:
        from popxl.runtime.instance_group import close_instance_group, fail_instance

        from .scripts import run_script

        os.chdir(cwd)
        forward = _HubOutput(hub, self.index)
        failures: List[BaseException] = []
        try:
            code = run_script(target, args, on_exception=failures.append)
        finally:
            forward.stop()
        if code:
            fail_instance(failures[0] if failures else SystemExit(code))
        close_instance_group()
        return code


class _HubOutput:
    """This process's fd 1 and 2 redirected into pipes whose contents go to the hub."""

    def __init__(self, hub: str, index: int):
        import socket

        from popxl.runtime.hub import send_message

        from .output import pump

        host, _, port = hub.rpartition(":")
        self.sock = socket.create_connection((host, int(port)))
        lock = threading.Lock()
        self.saved = [os.dup(1), os.dup(2)]
        self.threads = []
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            r, w = os.pipe()
            getattr(sys, stream).flush()
            os.dup2(w, fd)
            os.close(w)

            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

            def send(data: bytes, stream=stream, decoder=decoder) -> None:
                text = decoder.decode(data)       # (a chunk may end inside a character)
                try:
                    send_message(self.sock, {"kind": "output", "index": index, "stream": stream,
                                             "data": text}, lock)
                except OSError:
                    pass
            self.threads.append(pump(r, send, None))
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
        self.sock.close()


def _instance_env(i: int, n: int, replicas: int, hub: str) -> Dict[str, str]:
    from popxl.runtime.ray_backend import _actor_env

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
        "POPXL_BACKEND": "local", "POPXL_INSTANCE_HUB": hub, "POPXL_INSTANCE_LAUNCHER": "1",
    })
    return env


def run_ray_instances(num_instances: int, num_replicas: int, target: str, args: Sequence[str],
                      prefix: str = POPXL_RUN_PREFIX) -> int:
    """Run `target` as `num_instances` instances on Ray actors; the first failing instance's
    exit code (0 if all succeeded)."""
    import ray

    from popxl.runtime.env import ray_address
    from popxl.runtime.hub import InstanceHub
    from popxl.runtime.ray_quiet import quiet_ray_start

    if num_replicas % num_instances:
        raise ValueError(f"--replicas {num_replicas} is not divisible by --instances "
                         f"{num_instances}")
    started = False
    if not ray.is_initialized():
        address = ray_address()
        quiet_ray_start(starting_local=not address, actors=num_instances, prog="popxl-run")
        common = dict(logging_level=logging.WARNING, configure_logging=False, log_to_driver=False)
        if address:
            ray.init(address=address, **common)
        else:        # a new local Ray, never another job's cluster found on this machine
            ray.init(address="local", num_cpus=max(num_instances, os.cpu_count() or 1),
                     include_dashboard=False, **common)
            started = True
    printer = _Printer(prefix)
    hub = InstanceHub(num_instances, printer.write, host=ray.util.get_node_ip_address())
    cls = ray.remote(num_cpus=1, max_concurrency=1)(_InstanceActor)
    actors = [cls.options(runtime_env={"env_vars": _instance_env(
        i, num_instances, num_replicas, hub.address)}).remote(i) for i in range(num_instances)]
    try:
        where = ray.get([a.where.remote() for a in actors])
        refs = [a.run.remote(target, list(args), os.getcwd(), hub.address) for a in actors]
        return _supervise(ray, refs, where, hub, printer)
    except KeyboardInterrupt:
        return 130
    finally:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        hub.close()
        printer.flush()
        if started:
            ray.shutdown()


def _supervise(ray, refs, where, hub, printer) -> int:
    """Wait for every instance; a few seconds after the first failure, stop waiting (the
    caller kills the rest). Returns the exit code of the instance whose failure came first
    (the origin named by the hub's first notice), else of the first to fail, else 0."""
    which = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    failed: Dict[int, int] = {}          # instance -> exit code, in the order they ended
    stop_at = None
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=0.2)
        for ref in done:
            i = which[ref]
            try:
                code = ray.get(ref)
            except ray.exceptions.RayActorError:
                host, pid = where[i]
                printer.note(i, f"popxl-run: instance {i} (Ray actor, pid {pid} on {host}) died")
                hub.broadcast_failure(i, f"its Ray actor (pid {pid} on {host}) died")
                code = 1
            except ray.exceptions.RayTaskError as e:
                printer.note(i, f"popxl-run: instance {i} failed: {e}")
                hub.broadcast_failure(i, str(e).splitlines()[-1] if str(e) else "failed")
                code = 1
            if code:
                failed[i] = code
                hub.broadcast_failure(i, f"its script exited with code {code}")
                if stop_at is None:
                    stop_at = time.monotonic() + FAIL_GRACE
        if pending and stop_at is not None and time.monotonic() > stop_at:
            i = next(iter(failed))
            printer.note(i, f"popxl-run: instance {i} failed (exit code {failed[i]}); stopping "
                            f"the other instances")
            break
    origin = hub.failures[0][0] if hub.failures else None
    if origin in failed:
        return failed[origin]
    return next(iter(failed.values()), 0)
