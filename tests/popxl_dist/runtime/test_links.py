"""The Ray backend's transport without Ray: byte pipes (shared-memory rings, sockets), the
message framing over them, and collectives between endpoints run by threads of this process."""
from __future__ import annotations

import os
import socket
import threading
import uuid

import numpy as np
import pytest

from popxl.engine.comm import Communicator, Layout
from popxl.errors import CollectiveTimeout, RunAborted, WorkerDied, WorkerError
from popxl.runtime.transport.endpoint import Endpoint, EndpointTransport, decode, encode
from popxl.runtime.transport.links import ABORT, CMD, DATA, Link
from popxl.runtime.transport.pipes import ShmRing, SocketPipe, shm_supported, unlink_segments

needs_shm = pytest.mark.skipif(not shm_supported(), reason="no shared-memory rings here")


@pytest.fixture
def prefix():
    name = f"popxl-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    unlink_segments(name)


def ring_pair(prefix: str, capacity: int, tag: str = "r"):
    w = ShmRing(f"{prefix}-{tag}", capacity, create=True)
    r = ShmRing(f"{prefix}-{tag}", capacity, create=False)
    return w, r


def socket_pair():
    """Two ends of a TCP connection on the loopback (the path between nodes)."""
    with socket.create_server(("127.0.0.1", 0)) as lst:
        a = socket.create_connection(lst.getsockname())
        b, _ = lst.accept()
    return SocketPipe(a), SocketPipe(b)


def shm_link_pair(prefix: str, capacity: int = 1 << 12):
    """Two Links joined by two rings (peer indices 0 and 1)."""
    w01, r01 = ring_pair(prefix, capacity, "01")
    w10, r10 = ring_pair(prefix, capacity, "10")
    alloc = lambda kind, n: np.empty(n, np.uint8)  # noqa: E731
    return Link(1, w01, r10, alloc), Link(0, w10, r01, alloc)


def socket_link_pair():
    a, b = socket_pair()
    alloc = lambda kind, n: np.empty(n, np.uint8)  # noqa: E731
    return Link(1, a, a, alloc), Link(0, b, b, alloc)


# --- pipes ---------------------------------------------------------------------------------
@needs_shm
def test_ring_streams_any_length_across_the_wrap(prefix):
    w, r = ring_pair(prefix, 64)
    w.unlink()
    assert not os.path.exists(f"/dev/shm/{prefix}-r")        # the mappings outlive the name
    src = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8)
    dst = np.zeros_like(src)
    sent = got = 0
    while got < len(dst):
        sent += w.write(memoryview(src)[sent:sent + 37])       # odd sizes: every wrap offset
        got += r.readinto(memoryview(dst)[got:got + 23])
        assert sent - got <= 64                               # never more than the capacity
    np.testing.assert_array_equal(src, dst)
    assert w.write(memoryview(src)[:100]) == 64 and w.write(memoryview(src)[:1]) == 0
    assert not r.readinto(memoryview(dst)[:0])
    w.close()
    r.close()


def test_ring_capacity_must_be_a_power_of_two(prefix):
    with pytest.raises(ValueError, match="power of two"):
        ShmRing(prefix, 100, create=True)


def test_socket_pipe_reports_a_closed_peer():
    a, b = socket_pair()
    assert a.write(memoryview(b"abc")) == 3
    buf = bytearray(8)
    assert b.readinto(memoryview(buf)) == 3 and bytes(buf[:3]) == b"abc"
    assert b.readinto(memoryview(buf)) == 0 and not b.dead    # nothing yet: not dead
    a.close()
    assert b.readinto(memoryview(buf)) == 0 and b.dead


# --- messages ------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [pytest.param(shm_link_pair, marks=needs_shm),
                                  socket_link_pair])
def test_messages_of_any_size_arrive_whole_and_in_order(make, prefix):
    a, b = make(prefix) if make is shm_link_pair else make()
    rng = np.random.default_rng(1)
    sent = [(DATA, 7, 3, 0, b"<f4", [rng.normal(size=n).astype(np.float32)])
            for n in (0, 1, 1000, 100_000)]                  # 400 kB through a 4 kB ring
    sent.append((CMD, 8, 0, 0, b"meta only", []))
    sent.append((ABORT, 9, -1, 2 ** 40, b"", [np.arange(3), np.zeros(0), np.ones(5, bool)]))
    for kind, run, x, y, meta, bufs in sent:
        a.post(kind, run, x, y, meta, bufs)
    got = []
    while len(got) < len(sent):
        a.flush()
        b.pump(got.append)
    for (kind, run, x, y, meta, bufs), m in zip(sent, got):
        assert (m.kind, m.src, m.run_id, m.a, m.b, m.meta) == (kind, 0, run, x, y, meta)
        assert [bytes(g) for g in m.bufs] == [np.ascontiguousarray(q).tobytes() for q in bufs]
    assert a.idle
    a.close()
    b.close()


class _CountingPipe:
    """A socket pipe that counts its writes."""

    def __init__(self, pipe):
        self.pipe, self.writes = pipe, 0
        self.kind, self.readinto = pipe.kind, pipe.readinto

    @property
    def dead(self):
        return self.pipe.dead

    def write(self, view):
        self.writes += 1
        return self.pipe.write(view)

    def close(self):
        self.pipe.close()


def test_a_message_is_received_into_one_body_with_aligned_buffers_and_small_ones_leave_in_one_write():
    a_pipe, b_pipe = socket_pair()
    out = _CountingPipe(a_pipe)
    alloc = lambda kind, n: np.empty(n, np.uint8)  # noqa: E731
    a, b = Link(1, out, a_pipe, alloc), Link(0, b_pipe, b_pipe, alloc)
    bufs = [np.arange(3, dtype=np.int8), np.ones(5, np.float64), np.zeros(0, np.uint8)]
    a.post(CMD, 1, 0, 0, b"meta", bufs)
    assert out.writes == 1                                   # header, body and buffers joined
    got = []
    while not got:
        a.flush()
        b.pump(got.append)
    m = got[0]
    for g, q in zip(m.bufs, bufs):
        assert bytes(g) == q.tobytes()
        assert np.shares_memory(g, m.body) or g.size == 0    # views of the one received array
        offset = g.__array_interface__["data"][0] - m.body.__array_interface__["data"][0]
        assert offset % 64 == 0                              # any dtype can view them
    assert m.meta == b"meta"


def test_encode_sends_arrays_out_of_band_and_decodes_them():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    obj = ("run", 3, ([x, x[:, 1]], [((3,), np.dtype(np.int16))]))
    meta, bufs = encode(obj)
    assert len(bufs) >= 1 and x.tobytes() not in meta          # the big array went out of band
    a, b = socket_link_pair()
    a.post(CMD, 1, 0, 0, meta, bufs)
    got = []
    while not got:
        a.flush()
        b.pump(got.append)
    cmd, sid, (ins, specs) = decode(got[0])
    assert (cmd, sid, specs) == ("run", 3, [((3,), np.dtype(np.int16))])
    np.testing.assert_array_equal(ins[0], x)
    np.testing.assert_array_equal(ins[1], x[:, 1])


# --- collectives between endpoints (threads of this process) -------------------------------
def _mesh(prefix, size: int, kind: str, timeout: float = 20.0):
    """`size` endpoints fully linked by rings or socket pairs."""
    eps = [Endpoint(i, timeout) for i in range(size)]
    for i in range(size):
        for j in range(i + 1, size):
            if kind == "shm":
                wij, rij = ring_pair(prefix, 1 << 14, f"{i}-{j}")
                wji, rji = ring_pair(prefix, 1 << 14, f"{j}-{i}")
                eps[i].add_link(Link(j, wij, rji, eps[i].alloc))
                eps[j].add_link(Link(i, wji, rij, eps[j].alloc))
            else:
                a, b = socket_pair()
                eps[i].add_link(Link(j, a, a, eps[i].alloc))
                eps[j].add_link(Link(i, b, b, eps[j].alloc))
    unlink_segments(prefix)
    return eps


def _run_workers(fns):
    """Run fns[i]() in one thread each; their results (or exceptions)."""
    out = [None] * len(fns)

    def run(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 - returned to the test
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    return out


@pytest.mark.parametrize("kind", [pytest.param("shm", marks=needs_shm), "socket"])
@pytest.mark.parametrize("R,W", [(4, 2), (6, 3)])
def test_all_reduce_between_endpoints_matches_numpy_bitwise_any_size(prefix, kind, R, W):
    eps = _mesh(prefix, W, kind)
    layout = Layout(R, W)
    rng = np.random.default_rng(2)
    sizes = (5, 70_000)                                 # one round, and the split all-reduce
    values = {n: [rng.normal(size=n).astype(np.float32) for _ in range(R)] for n in sizes}

    def worker(w):
        tr = EndpointTransport(eps[w], lambda run_id, waiting: False)
        tr.start_run(1)
        comm = Communicator(layout, w, tr)
        res = []
        for n in sizes:
            mine = [values[n][r].copy() for r in layout.replicas_of(w)]
            for _ in range(3):                           # repeated: buffers are reused
                comm.tag += 1
                res.append(comm.all_reduce(mine, "add", 1, R))
        return res

    results = _run_workers([lambda w=w: worker(w) for w in range(W)])
    for n_i, n in enumerate(sizes):
        single = Communicator(Layout(R, 1), 0).all_reduce([v.copy() for v in values[n]],
                                                         "add", 1, R)[0]
        np.testing.assert_allclose(single, np.sum(values[n], axis=0), rtol=1e-5, atol=1e-5)
        for w in range(W):
            assert not isinstance(results[w], BaseException), results[w]
            for rep in range(3):
                for out in results[w][3 * n_i + rep]:
                    assert out.tobytes() == single.tobytes()
    for ep in eps:
        ep.close()


def test_exchange_raises_abort_timeout_divergence_and_death(prefix):
    eps = _mesh(prefix, 2, "socket", timeout=0.5)
    tr = EndpointTransport(eps[0], lambda run_id, waiting: False)
    tr.start_run(1)
    with pytest.raises(CollectiveTimeout, match=r"worker\(s\) \[1\] within 0.5 s") as info:
        tr.exchange({1: np.ones(3, np.float32)}, {1: (3, np.float32)}, tag=5)
    assert info.value.workers == (1,)                  # the silent worker, for the executor

    eps[0].aborted[2] = "worker 1 failed: boom"
    tr.start_run(2)
    with pytest.raises(RunAborted, match="boom"):
        tr.exchange({}, {1: (3, np.float32)}, tag=5)

    eps[0].timeout = 30
    finished = EndpointTransport(eps[0], lambda run_id, waiting: True)
    finished.start_run(3)
    with pytest.raises(WorkerError, match="diverged"):
        finished.exchange({}, {1: (3, np.float32)}, tag=6)

    other = EndpointTransport(eps[1], lambda run_id, waiting: False)
    other.start_run(4)
    tr.start_run(4)
    other.ep.links[0].post(DATA, 4, 7, 0, b"<i4", [np.ones(2, np.int32)])
    with pytest.raises(WorkerError, match=r"expected 3 float32 values from worker 1, got 2"):
        tr.exchange({}, {1: (3, np.float32)}, tag=7)

    tr.start_run(5)
    eps[1].close()                                      # the peer's process is gone
    with pytest.raises(WorkerDied) as info:
        tr.exchange({}, {1: (3, np.float32)}, tag=8)
    assert info.value.workers == [1]
    eps[0].close()


def test_late_data_of_an_aborted_run_is_dropped(prefix):
    eps = _mesh(prefix, 2, "socket")
    a = EndpointTransport(eps[0], lambda run_id, waiting: False)
    b = EndpointTransport(eps[1], lambda run_id, waiting: False)
    b.start_run(1)
    eps[1].links[0].post(DATA, 1, 9, 0, b"<f4", [np.full(2, 1.0, np.float32)])  # run 1, stale
    a.start_run(2)
    b.start_run(2)
    out = _run_workers([lambda: a.exchange({1: np.full(2, 5.0, np.float32)},
                                           {1: (2, np.float32)}, 9),
                        lambda: b.exchange({0: np.full(2, 7.0, np.float32)},
                                           {0: (2, np.float32)}, 9)])
    np.testing.assert_array_equal(out[0][1], [7.0, 7.0])
    np.testing.assert_array_equal(out[1][0], [5.0, 5.0])
    for ep in eps:
        ep.close()
