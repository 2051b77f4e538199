"""The socket instance group (Ray instances) in one process: instances as threads, a real hub,
real TCP connections. Exchanges of every dtype and of large arrays both ways at once, object
gathers, divergence, failure notices relayed by the hub, a peer that leaves, timeouts."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from popxl.errors import CollectiveTimeout, InstanceFailed
from popxl.runtime.hub import InstanceHub
from popxl.runtime.instance_socket import SocketInstanceGroup


def run_instances(n: int, body, timeout: float = 60.0):
    """Start `n` groups on one hub in threads and run `body(group, hub)` in each; returns
    (results, exceptions) by instance."""
    hub = InstanceHub(n, on_output=lambda *a: None)
    results, errors = {}, {}

    def run(i: int) -> None:
        group = None
        try:
            group = SocketInstanceGroup(i, n, hub.address)
            results[i] = body(group, hub)
        except BaseException as e:  # noqa: BLE001 - inspected by the test
            errors[i] = e
        finally:
            if group is not None:
                group.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "an instance thread hung"
    hub.close()
    return results, errors


DTYPES = [np.float16, np.float32, np.float64, np.int32, np.uint8, np.bool_]


def test_exchanges_every_dtype_and_large_arrays_both_ways():
    n = 3

    def body(g, hub):
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
        g.next_run()
        got = g.transport.exchange({p: np.empty(0, np.float32) for p in g.peers},
                                   {p: (0, np.dtype(np.float32)) for p in g.peers}, 3)
        out["empty"] = {p: got[p].shape for p in got}
        return out

    results, errors = run_instances(n, body)
    assert not errors, errors
    for i in range(n):
        for k, dt in enumerate(DTYPES):
            for p in range(n):
                if p == i:
                    continue
                rng = np.random.default_rng(100 * p + k)
                sent = {q: (rng.random(7 + q) * 100).astype(dt) for q in range(n) if q != p}
                got = results[i][dt][p]
                assert got.dtype == np.dtype(dt) and got.tobytes() == sent[i].tobytes()
            others = [p for p in range(n) if p != i]
        for p in others:
            np.testing.assert_array_equal(results[i]["big"][p],
                                          np.arange(3_000_000, dtype=np.float32) + p)
            assert results[i]["empty"][p] == (0,)


def test_allgather_gives_every_instance_everything_in_order():
    def body(g, hub):
        return g.allgather({"me": g.index, "data": np.full(1000, g.index, np.int64)})

    results, errors = run_instances(4, body)
    assert not errors, errors
    for i in range(4):
        assert [d["me"] for d in results[i]] == [0, 1, 2, 3]
        assert all(np.all(d["data"] == k) for k, d in enumerate(results[i]))


def test_instances_in_different_collectives_are_reported_as_diverged():
    def body(g, hub):
        g.next_run()
        tag = 5 if g.index == 0 else 6
        try:
            g.transport.exchange({1 - g.index: np.ones(3, np.float32)},
                                 {1 - g.index: (3, np.dtype(np.float32))}, tag)
        except InstanceFailed as e:
            with pytest.raises(RuntimeError, match="cannot run collectives after a failed one"):
                g.next_run()                   # the streams may hold the failed exchange's data
            raise e

    _, errors = run_instances(2, body)
    assert set(errors) == {0, 1}
    for i, e in errors.items():
        assert isinstance(e, InstanceFailed), repr(e)
        assert "diverged" in str(e) and "tag 5" in str(e) and "tag 6" in str(e)
        assert e.instance == 1 - i


def test_a_failure_notice_from_the_hub_stops_a_waiting_instance_at_once():
    started = threading.Event()

    def body(g, hub):
        if g.index == 1:
            started.wait(10)
            time.sleep(0.2)
            hub.broadcast_failure(1, "ZeroDivisionError: boom")
            time.sleep(1.0)
            return None
        started.set()
        g.next_run()
        t0 = time.monotonic()
        try:
            g.transport.exchange({1: np.ones(2, np.float32)}, {1: (2, np.dtype(np.float32))}, 1)
        except InstanceFailed as e:
            return e, time.monotonic() - t0
        return None

    results, errors = run_instances(2, body)
    assert not errors, errors
    err, took = results[0]
    assert err.instance == 1 and "instance 1 failed: ZeroDivisionError: boom" in str(err)
    assert took < 5.0


def test_fail_tells_the_others_through_the_hub():
    def body(g, hub):
        if g.index == 1:
            time.sleep(0.2)
            g.fail("RuntimeError: no more", g.index)
            return None
        g.next_run()
        g.transport.exchange({1: np.ones(2, np.float32)}, {1: (2, np.dtype(np.float32))}, 1)

    _, errors = run_instances(2, body)
    assert isinstance(errors.get(0), InstanceFailed), errors
    assert "instance 1 failed: RuntimeError: no more" in str(errors[0])


def test_a_peer_that_leaves_while_others_need_its_data_is_named():
    def body(g, hub):
        if g.index == 1:
            g.close()                       # says goodbye, closes its connections
            return None
        g.next_run()
        g.transport.exchange({1: np.ones(2, np.float32)}, {1: (2, np.dtype(np.float32))}, 1)

    _, errors = run_instances(2, body)
    assert isinstance(errors.get(0), InstanceFailed), errors
    assert "instance 1's connection broke" in str(errors[0]) and "exited or died" in str(errors[0])
    assert errors[0].instance == 1


def test_a_silent_peer_times_out(monkeypatch):
    monkeypatch.setenv("POPXL_COLLECTIVE_TIMEOUT", "0.5")
    release = threading.Event()

    def body(g, hub):
        if g.index == 1:
            release.wait(10)
            return None
        g.next_run()
        try:
            g.transport.exchange({1: np.ones(2, np.float32)}, {1: (2, np.dtype(np.float32))}, 4)
        finally:
            release.set()

    _, errors = run_instances(2, body)
    err = errors.get(0)
    assert isinstance(err, CollectiveTimeout), errors
    assert "instance(s) [1]" in str(err) and "0.5 s" in str(err)


def test_a_missing_instance_at_setup_times_out(monkeypatch):
    monkeypatch.setenv("POPXL_COLLECTIVE_TIMEOUT", "0.5")
    hub = InstanceHub(2, on_output=lambda *a: None)
    try:
        with pytest.raises(CollectiveTimeout, match="did not start their popdist Session"):
            SocketInstanceGroup(0, 2, hub.address)
    finally:
        hub.close()
