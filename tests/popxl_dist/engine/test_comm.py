"""The Communicator over several in-process workers: results against NumPy references, and
bitwise identical for every worker count."""
import threading

import numpy as np
import pytest

import popxl.engine.comm as comm_module
from popxl.engine.comm import Communicator, Layout, cover
from popxl.runtime.transport.mailbox import Mailbox, MailboxTransport

GROUPINGS = {  # R -> [(stride, group_size)]
    2: [(1, 2), (1, 1)],
    4: [(1, 4), (1, 2), (2, 2)],
    8: [(1, 8), (1, 2), (2, 2), (2, 4), (4, 2), (1, 4)],
}


def ref_members(r, stride, k, R):
    """Members of replica r's group, written independently of the code under test."""
    groups = {}
    for g0 in range(R):
        key = (g0 % stride, g0 // (stride * k))
        groups.setdefault(key, []).append(g0)
    for mem in groups.values():
        if r in mem:
            return sorted(mem)
    raise AssertionError


def run_workers(R, W, fn):
    """Run fn(comm, local_replicas) on W in-process workers; returns {replica: result}."""
    layout = Layout(R, W)
    boxes = [Mailbox() for _ in range(layout.num_workers)]

    def deliver(peer, src, run_id, tag, arr):
        boxes[peer].put(src, run_id, tag, arr.copy())

    results, errors = {}, []

    def work(w):
        try:
            comm = Communicator(layout, w, MailboxTransport(w, boxes[w], deliver, 10.0))
            for r, v in zip(comm.replicas, fn(comm, list(comm.replicas))):
                results[r] = v
        except Exception as e:  # noqa: BLE001
            errors.append(e)
            for b in boxes:
                b.abort(0, str(e))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(layout.num_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def data(R, shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(shape).astype(dtype) for _ in range(R)]
    return [rng.integers(-50, 50, shape).astype(dtype) for _ in range(R)]


REF = {"add": lambda xs: np.sum(xs, axis=0), "max": lambda xs: np.max(xs, axis=0),
       "min": lambda xs: np.min(xs, axis=0), "mul": lambda xs: np.prod(xs, axis=0),
       "mean": lambda xs: np.mean(xs, axis=0), "square_add": lambda xs: np.sum(np.square(xs), 0)}


@pytest.fixture(params=["one_round", "split"])
def split_mode(request, monkeypatch):
    """Run each all-reduce test with both cross-worker algorithms (one exchange of partials,
    and reduce-scatter + all-gather between workers, normally used for large arrays)."""
    if request.param == "split":
        monkeypatch.setattr(comm_module, "_SPLIT_MIN", 1)
    return request.param


@pytest.mark.parametrize("R", [2, 4, 8])
@pytest.mark.parametrize("op", ["add", "mean", "max", "min", "mul", "square_add"])
def test_all_reduce_matches_numpy_and_is_bitwise_stable(R, op, split_mode):
    xs = data(R, (3, 5), np.float32)
    for stride, k in GROUPINGS[R]:
        outs = {}
        for W in (1, 2, R // 2 or 1, R, 3):
            res = run_workers(R, W, lambda c, reps: c.all_reduce(
                [xs[r] for r in reps], op, stride, k))
            outs[W] = res
            for r in range(R):
                mem = ref_members(r, stride, k, R)
                want = REF[op](np.stack([xs[m].astype(np.float64) for m in mem]))
                np.testing.assert_allclose(res[r], want, rtol=1e-5, atol=1e-5)
                assert res[r].dtype == np.float32
        for W, res in outs.items():
            for r in range(R):
                assert res[r].tobytes() == outs[1][r].tobytes(), (W, r)


@pytest.mark.parametrize("R", [4, 8])
@pytest.mark.parametrize("op", ["add", "mean", "max"])
def test_all_reduce_of_scalars(R, op):
    """0-d values (a loss, a norm) combine into 0-d arrays, not NumPy scalars."""
    xs = [np.asarray(np.float32(r + 0.5)) for r in range(R)]
    for W in (1, 2):
        res = run_workers(R, W, lambda c, reps: c.all_reduce([xs[r] for r in reps], op, 1, R))
        for r in range(R):
            assert isinstance(res[r], np.ndarray) and res[r].shape == ()
            np.testing.assert_allclose(res[r], REF[op](np.stack(xs)), rtol=1e-6)


def test_all_reduce_float16_accumulates_in_float32(split_mode):
    R = 8
    xs = [np.full((4,), 1000.0, np.float16)] + [np.full((4,), 0.3, np.float16)] * 7
    res = run_workers(R, 2, lambda c, reps: c.all_reduce([xs[r] for r in reps], "add", 1, 8))
    want = np.float16(np.sum([x.astype(np.float32) for x in xs], axis=0))
    assert res[5].dtype == np.float16
    np.testing.assert_array_equal(res[5], want)


@pytest.mark.parametrize("R,W", [(4, 2), (8, 4), (8, 3), (2, 2)])
def test_int_and_bool_reductions(R, W, split_mode):
    xs = data(R, (6,), np.int32, seed=3)
    res = run_workers(R, W, lambda c, reps: c.all_reduce([xs[r] for r in reps], "add", 1, R))
    np.testing.assert_array_equal(res[R - 1], np.sum(xs, axis=0))
    bs = [x > 0 for x in xs]
    res = run_workers(R, W, lambda c, reps: c.all_reduce([bs[r] for r in reps], "and", 1, R))
    np.testing.assert_array_equal(res[0], np.logical_and.reduce(bs))
    res = run_workers(R, W, lambda c, reps: c.all_reduce([bs[r] for r in reps], "or", 1, R))
    np.testing.assert_array_equal(res[0], np.logical_or.reduce(bs))


@pytest.mark.parametrize("R", [2, 4, 8])
def test_reduce_scatter_and_all_gather(R):
    for stride, k in GROUPINGS[R]:
        xs = data(R, (k * 3,), np.float32, seed=stride * 10 + k)
        for W in (1, 2, 3):
            rs = run_workers(R, W, lambda c, reps: c.reduce_scatter(
                [xs[r] for r in reps], "add", stride, k))
            ag = run_workers(R, W, lambda c, reps: c.all_gather([xs[r] for r in reps], stride, k))
            for r in range(R):
                mem = ref_members(r, stride, k, R)
                i = mem.index(r)
                full = np.sum([xs[m].astype(np.float64) for m in mem], axis=0)
                np.testing.assert_allclose(rs[r], full[i * 3:(i + 1) * 3], rtol=1e-5, atol=1e-6)
                np.testing.assert_array_equal(ag[r], np.stack([xs[m] for m in mem]))
            if W == 1:
                base = rs
            for r in range(R):
                assert rs[r].tobytes() == base[r].tobytes()


def test_results_do_not_alias_inputs_or_each_other():
    xs = data(4, (5,), np.float32)
    res = run_workers(4, 1, lambda c, reps: c.all_reduce([xs[r] for r in reps], "add", 1, 1))
    for r in range(4):
        assert not np.shares_memory(res[r], xs[r])
        np.testing.assert_array_equal(res[r], xs[r])
    res = run_workers(4, 2, lambda c, reps: c.all_reduce([xs[r] for r in reps], "max", 1, 4))
    assert not np.shares_memory(res[0], res[1])


def test_tree_cover_is_maximal_and_disjoint():
    assert cover(8, 0, 8) == ((0, 8),)
    assert cover(8, 0, 4) == ((0, 4),)
    assert cover(8, 2, 6) == ((2, 4), (4, 6))
    assert cover(6, 0, 3) == ((0, 2), (2, 3))
    assert cover(5, 1, 5) == ((1, 2), (2, 4), (4, 5))


def test_layout_blocks():
    assert Layout(8, 3).blocks == [(0, 3), (3, 6), (6, 8)]
    assert Layout(2, 4).num_workers == 2
    assert Layout(4, 2).worker_of(3) == 1


@pytest.mark.parametrize("R,W", [(2, 2), (4, 2), (8, 3), (4, 4)])
def test_large_in_place_all_reduce_is_bitwise_the_single_worker_result(R, W):
    """Arrays above the split threshold, reduced in place into the inputs."""
    n = comm_module._SPLIT_MIN + 7
    base = data(R, (n,), np.float32, seed=5)
    want = run_workers(R, 1, lambda c, reps: c.all_reduce([base[r].copy() for r in reps],
                                                          "mean", 1, R))
    xs = [x.copy() for x in base]
    got = run_workers(R, W, lambda c, reps: c.all_reduce([xs[r] for r in reps], "mean", 1, R,
                                                         out=[xs[r] for r in reps]))
    for r in range(R):
        assert got[r] is xs[r]
        assert got[r].tobytes() == want[r].tobytes()
    np.testing.assert_allclose(xs[0], np.mean(base, axis=0), rtol=1e-5, atol=1e-6)


def test_a_silent_peer_times_out_instead_of_hanging():
    from popxl.errors import CollectiveTimeout

    transport = MailboxTransport(0, Mailbox(), lambda *a: None, timeout=0.3)
    comm = Communicator(Layout(2, 2), 0, transport)
    with pytest.raises(CollectiveTimeout, match=r"no data from worker\(s\) \[1\]"):
        comm.all_reduce([np.ones(3, np.float32)], "add", 1, 2)


def test_inputs_are_not_modified_by_out_of_place_collectives():
    xs = data(4, (8,), np.float32, seed=9)
    before = [x.copy() for x in xs]
    run_workers(4, 2, lambda c, reps: c.all_reduce([xs[r] for r in reps], "add", 1, 4))
    run_workers(4, 2, lambda c, reps: c.reduce_scatter([xs[r] for r in reps], "add", 1, 4))
    run_workers(4, 2, lambda c, reps: c.all_gather([xs[r] for r in reps], 2, 2))
    for x, b in zip(xs, before):
        np.testing.assert_array_equal(x, b)


def test_out_of_order_delivery_cannot_mix_up_exchange_rounds():
    """Ray may run one caller's deliveries out of order (threaded actors): the split all-reduce
    exchanges twice with the same peer and tag, so messages must be matched by sequence."""
    R, n = 2, comm_module._SPLIT_MIN      # large enough for reduce-scatter + all-gather
    xs = data(R, (n,), np.float32, seed=11)
    want = np.sum(xs, axis=0)
    layout = Layout(R, 2)
    rng = np.random.default_rng(0)
    for trial in range(5):
        boxes = [Mailbox() for _ in range(2)]
        delays = rng.uniform(0, 0.02, size=16).tolist()

        def deliver(peer, src, run_id, tag, arr):
            # Random delays reorder the two rounds' messages.
            t = threading.Timer(delays.pop(), boxes[peer].put, (src, run_id, tag, arr.copy()))
            t.start()

        results = {}

        def work(w):
            comm = Communicator(layout, w, MailboxTransport(w, boxes[w], deliver, 10.0))
            results[w] = comm.all_reduce([xs[w]], "add", 1, R)[0]

        threads = [threading.Thread(target=work, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for w in range(2):
            np.testing.assert_allclose(results[w], want, rtol=1e-6, atol=1e-6)
