"""The instance group of Ray instances (`instance_links.py`) in one process: instances as threads
on a real mesh (shared-memory rings, or loopback sockets), the launcher as the last member.
Exchanges of every dtype and of large arrays both ways at once, object gathers, divergence,
failure notices from a peer and from the launcher, a goodbye that never overtakes the data sent
before it, a peer that leaves, timeouts."""
from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from popxl.errors import CollectiveTimeout, InstanceFailed
from popxl.runtime.transport.endpoint import Endpoint
from popxl.runtime.instances.links import LinkInstanceGroup, Uplink
from popxl.runtime.transport.links import FAILED, OUTPUT
from popxl.runtime.transport.mesh import MeshMember, listen_address, new_token
from popxl.runtime.transport.pipes import shm_supported, unlink_segments
from popxl.runtime.process.polling import Backoff

KINDS = [pytest.param("shm", marks=pytest.mark.skipif(not shm_supported(),
                                                      reason="no shared-memory rings")),
         "socket"]


class Launch:
    """`n` instances and a launcher (member n) joined by a mesh built by threads."""

    def __init__(self, n: int, kind: str):
        self.n = n
        self.job = f"popxl-test-il-{uuid.uuid4().hex[:10]}"
        token = new_token()
        shm = kind == "shm"
        self.eps = [Endpoint(i, 30.0) for i in range(n + 1)]
        ms = [MeshMember(ep, self.job, token, n + 1, "node", "127.0.0.1", shm,
                         listen_address(False, shm, "127.0.0.1")) for ep in self.eps]
        table = [m.hello() for m in ms]
        for m in ms:
            m.connect(table)
        threads = [threading.Thread(target=m.attach) for m in ms]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for m in ms:
            m.finish()
        unlink_segments(self.job)
        self.launcher = self.eps[n]

    def run(self, body, timeout: float = 60.0):
        """Run `body(group, launch)` in one thread per instance; (results, exceptions)."""
        results, errors = {}, {}

        def run(i: int) -> None:
            ep = self.eps[i]
            group = LinkInstanceGroup(i, self.n, ep, Uplink(ep.detach_link(self.n)))
            try:
                results[i] = body(group, self)
            except BaseException as e:  # noqa: BLE001 - inspected by the test
                errors[i] = e
            finally:
                group.close()
                group.uplink.close()

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
            assert not t.is_alive(), "an instance thread hung"
        return results, errors

    def pump_launcher(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        backoff = Backoff()
        while time.monotonic() < end:
            if not self.launcher.progress():
                backoff.wait()


DTYPES = [np.float16, np.float32, np.float64, np.int32, np.uint8, np.bool_]


@pytest.mark.parametrize("kind", KINDS)
def test_exchanges_every_dtype_and_large_arrays_both_ways(kind):
    n = 3

    def body(g, launch):
        out = {}
        for k, dt in enumerate(DTYPES):
            g.next_run()
            rng = np.random.default_rng(100 * g.index + k)
            mine = {p: (rng.random(7 + p) * 100).astype(dt) for p in g.peers}
            got = g.transport.exchange(mine, {p: (7 + g.index, np.dtype(dt)) for p in g.peers},
                                       k)
            out[dt] = {p: got[p].copy() for p in got}
        g.next_run()
        big = np.arange(3_000_000, dtype=np.float32) + g.index      # 12 MB each way
        got = g.transport.exchange({p: big for p in g.peers},
                                   {p: (big.size, np.dtype(np.float32)) for p in g.peers}, 9)
        out["big"] = {p: got[p].copy() for p in got}
        return out

    results, errors = Launch(n, kind).run(body)
    assert not errors, errors
    for i in range(n):
        for k, dt in enumerate(DTYPES):
            for p in [q for q in range(n) if q != i]:
                rng = np.random.default_rng(100 * p + k)
                sent = {q: (rng.random(7 + q) * 100).astype(dt) for q in range(n) if q != p}
                got = results[i][dt][p]
                assert got.dtype == np.dtype(dt) and got.tobytes() == sent[i].tobytes()
        for p in [q for q in range(n) if q != i]:
            np.testing.assert_array_equal(results[i]["big"][p],
                                          np.arange(3_000_000, dtype=np.float32) + p)


def test_allgather_gives_every_instance_everything_in_order():
    results, errors = Launch(4, "socket").run(
        lambda g, launch: g.allgather({"me": g.index, "data": np.full(1000, g.index, np.int64)}))
    assert not errors, errors
    for i in range(4):
        assert [d["me"] for d in results[i]] == [0, 1, 2, 3]
        assert all(np.all(d["data"] == k) for k, d in enumerate(results[i]))


@pytest.mark.parametrize("kind", KINDS)
def test_instances_in_different_collectives_are_reported_as_diverged(kind):
    def body(g, launch):
        g.next_run()
        tag = 5 if g.index == 0 else 6
        try:
            g.transport.exchange({1 - g.index: np.ones(3, np.float32)},
                                 {1 - g.index: (3, np.dtype(np.float32))}, tag)
        except InstanceFailed as e:
            with pytest.raises(RuntimeError, match="cannot run collectives after a failed one"):
                g.next_run()                   # the links may hold the failed exchange's data
            raise e

    _, errors = Launch(2, kind).run(body)
    assert set(errors) == {0, 1}
    for i, e in errors.items():
        assert isinstance(e, InstanceFailed), repr(e)
        assert "diverged" in str(e) and "tag 5" in str(e) and "tag 6" in str(e)
        assert e.instance == 1 - i


def test_a_failure_notice_from_the_launcher_stops_a_waiting_instance():
    launch = Launch(2, "shm" if shm_supported() else "socket")
    started = threading.Event()

    def body(g, launch):
        if g.index == 1:
            started.wait(10)
            time.sleep(0.2)
            # The launcher saw instance 1's actor die (Ray's supervision) and tells instance 0.
            launch.launcher.links[0].post(FAILED, 0, 1, 0, b"its Ray actor died")
            launch.pump_launcher(1.0)
            return None
        started.set()
        g.next_run()
        try:
            g.transport.exchange({1: np.ones(2, np.float32)}, {1: (2, np.dtype(np.float32))}, 1)
        except InstanceFailed as e:
            return e
        return None

    results, errors = launch.run(body)
    assert not errors, errors
    err = results[0]
    assert err.instance == 1 and "instance 1 failed: its Ray actor died" in str(err)


def test_fail_tells_the_others_and_the_launcher():
    launch = Launch(2, "socket")

    def body(g, launch):
        if g.index == 1:
            time.sleep(0.2)
            g.fail("RuntimeError: no more", g.index)
            return None
        g.next_run()
        g.transport.exchange({1: np.ones(2, np.float32)}, {1: (2, np.dtype(np.float32))}, 1)

    _, errors = launch.run(body)
    assert isinstance(errors.get(0), InstanceFailed), errors
    assert "instance 1 failed: RuntimeError: no more" in str(errors[0])
    launch.pump_launcher(0.5)
    assert launch.launcher.failures == {1: "RuntimeError: no more"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_goodbye_never_overtakes_the_data_sent_before_it(kind):
    """Instance 1 sends its part and leaves at once; instance 0 reads only later, when the
    goodbye has long arrived: it must still get the data (and no 'ended its script')."""
    def body(g, launch):
        g.next_run()
        if g.index == 1:
            g.transport.exchange({0: np.arange(50_000, dtype=np.float32)}, {}, 3)
            g.close()
            return None
        time.sleep(0.5)
        got = g.transport.exchange({}, {1: (50_000, np.dtype(np.float32))}, 3)
        return got[1].copy()

    results, errors = Launch(2, kind).run(body)
    assert not errors, errors
    np.testing.assert_array_equal(results[0], np.arange(50_000, dtype=np.float32))


def test_a_peer_that_leaves_while_others_need_its_data_is_named():
    def body(g, launch):
        if g.index == 1:
            g.close()                       # says goodbye, closes its links
            return None
        g.next_run()
        g.transport.exchange({1: np.ones(2, np.float32)}, {1: (2, np.dtype(np.float32))}, 1)

    _, errors = Launch(2, "socket").run(body)
    assert isinstance(errors.get(0), InstanceFailed), errors
    assert "instance 1 ended its script without joining this collective" in str(errors[0])
    assert errors[0].instance == 1


def test_a_silent_peer_times_out(monkeypatch):
    monkeypatch.setenv("POPXL_COLLECTIVE_TIMEOUT", "0.5")
    release = threading.Event()

    def body(g, launch):
        if g.index == 1:
            release.wait(10)
            return None
        g.next_run()
        try:
            g.transport.exchange({1: np.ones(2, np.float32)}, {1: (2, np.dtype(np.float32))}, 4)
        finally:
            release.set()

    _, errors = Launch(2, "socket").run(body)
    err = errors.get(0)
    assert isinstance(err, CollectiveTimeout), errors
    assert "instance(s) [1]" in str(err) and "0.5 s" in str(err)


def test_output_and_goodbye_reach_the_launcher_in_order():
    launch = Launch(1, "socket")

    def body(g, launch):
        for k in range(3):
            g.uplink.post(OUTPUT, 1, f"line {k}\n".encode())
        return None

    launch.run(body)
    launch.pump_launcher(0.5)
    got = b"".join(bytes(m.meta) for m in launch.launcher.outputs)
    assert got == b"line 0\nline 1\nline 2\n" and launch.launcher.byes == {0}
