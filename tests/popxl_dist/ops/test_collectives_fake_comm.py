"""The collective kernels on their own, driven by a fake Communicator written here.

Each "world" of R replicas is split over W fake workers (threads with contiguous replica blocks,
as the backends place them); the fake comm exchanges values through shared slots and a barrier.
Expected values are computed directly from the inputs with NumPy, per group.
"""
from __future__ import annotations

import threading

import numpy as np
import popxl
import pytest
from popxl import ops
from popxl.engine.kernels import load_all
from popxl.engine.kernels.registry import KERNELS

C = ops.collectives
F16, F32, I32, U32 = np.float16, np.float32, np.int32, np.uint32


def _block_members(r: int, stride: int, size: int) -> list[int]:
    """Members of r's group: same block of stride*size replicas, same offset modulo stride."""
    block = r // (stride * size)
    return [block * stride * size + r % stride + i * stride for i in range(size)]


@pytest.fixture(autouse=True, scope="module")
def _kernels():
    load_all()


class _World:
    def __init__(self, R: int, W: int):
        self.R = R
        self.slots: list = [None] * R
        self.barrier = threading.Barrier(W, timeout=20)


class FakeComm:
    """Plain NumPy collectives over the replicas of a `_World`."""

    def __init__(self, world: _World, replicas):
        self.world = world
        self.replicas = tuple(replicas)
        self.replication_factor = world.R
        self.calls: list[str] = []

    def _exchange(self, values):
        for r, v in zip(self.replicas, values):
            self.world.slots[r] = np.array(v, copy=True)
        self.world.barrier.wait()
        snapshot = list(self.world.slots)
        self.world.barrier.wait()
        return snapshot

    @staticmethod
    def _reduce(xs, op):
        dt = xs[0].dtype
        calc = np.dtype(F32) if dt == F16 else dt
        xs = [x.astype(calc) for x in xs]
        if op == "square_add":
            xs = [x * x for x in xs]
        acc = xs[0].copy()
        for x in xs[1:]:
            if op in ("add", "mean", "square_add"):
                acc = acc + x
            elif op == "mul":
                acc = acc * x
            elif op == "min":
                acc = np.minimum(acc, x)
            elif op == "max":
                acc = np.maximum(acc, x)
            elif op == "and":
                acc = np.logical_and(acc, x)
            elif op == "or":
                acc = np.logical_or(acc, x)
            else:
                raise ValueError(op)
        if op == "mean":
            acc = acc / calc.type(len(xs)) if calc.kind == "f" else acc // len(xs)
        return acc.astype(dt)

    def all_reduce(self, values, op, stride, group_size, out=None):
        self.calls.append("all_reduce")
        allv = self._exchange(values)
        res = [self._reduce([allv[m] for m in _block_members(r, stride, group_size)], op)
               for r in self.replicas]
        if out is None:
            return res
        for o, r in zip(out, res):
            o[...] = r
        return list(out)

    def all_gather(self, values, stride, group_size):
        self.calls.append("all_gather")
        allv = self._exchange(values)
        return [np.stack([allv[m] for m in _block_members(r, stride, group_size)])
                for r in self.replicas]

    def reduce_scatter(self, values, op, stride, group_size):
        self.calls.append("reduce_scatter")
        for v in values:
            assert v.ndim == 1 and v.size % group_size == 0, v.shape
        allv = self._exchange(values)
        out = []
        for r in self.replicas:
            mem = _block_members(r, stride, group_size)
            red = self._reduce([allv[m] for m in mem], op)
            c = red.size // group_size
            i = mem.index(r)
            out.append(red[i * c:(i + 1) * c].copy())
        return out


def _op_of(R: int, build, shape, dtype, meta_shape=()):
    """(KernelSpec, op, input infos, output infos) of the single op `build(x)` creates."""
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        g = ir.create_graph(build, popxl.TensorSpec(shape, popxl.dtype.as_dtype(dtype),
                                                      meta_shape))
    gd = g._data
    assert len(gd.ops) == 1, [o.type for o in gd.ops]
    op = gd.ops[0]
    spec = KERNELS[op.type]
    assert spec.collective
    return spec, op, [gd.tensors[t] for t in op.inputs], [gd.tensors[t] for t in op.outputs]


def _run(R: int, W: int, build, xs: np.ndarray, meta_shape=()):
    """Run the kernel of `build`'s op on inputs xs[r] over W fake workers; (outputs, inputs
    as passed, results as returned, comms)."""
    spec, op, ins, outs = _op_of(R, build, xs.shape[1:], xs.dtype, meta_shape)
    fn = spec.factory(op.attrs, ins, outs)
    world = _World(R, W)
    per = R // W
    passed = [xs[r].copy() for r in range(R)]
    results: list = [None] * W
    errors: list = []
    comms = [FakeComm(world, range(w * per, (w + 1) * per)) for w in range(W)]

    def work(w):
        try:
            results[w] = fn(comms[w], [(passed[r],) for r in comms[w].replicas])
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            world.barrier.abort()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    returned = [a for res in results for a in res]
    assert len(returned) == R
    for o, info in zip(returned, [outs[0]] * R):
        assert o.shape == info.shape and o.dtype == info.dtype.as_numpy()
    return returned, passed, comms


GROUPINGS = [(2, 1, 2), (4, 1, 4), (4, 1, 2), (4, 2, 2), (8, 2, 2), (8, 2, 4), (8, 4, 2),
             (8, 1, 1), (4, 1, 1)]
GIDS = [f"R{R}-s{s}-k{k}" for R, s, k in GROUPINGS]


def _data(R: int, shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random((R, *shape)) < 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0 if dtype == U32 else -3, 4, size=(R, *shape)).astype(dtype)
    return rng.normal(size=(R, *shape)).astype(dtype)


def _ref_reduce(group_vals: np.ndarray, op: str, dtype) -> np.ndarray:
    """Reduction over axis 0 of the members' values (float16 sums in float32)."""
    calc = np.dtype(np.float32 if dtype == F16 else dtype)
    v = group_vals.astype(calc)
    if op == "add":
        r = np.add.reduce(v, axis=0)
    elif op == "mean":
        r = np.add.reduce(v, axis=0) / calc.type(len(v)) if calc.kind == "f" else \
            np.add.reduce(v, axis=0) // len(v)
    elif op == "square_add":
        r = np.add.reduce(v * v, axis=0)
    elif op == "mul":
        r = np.multiply.reduce(v, axis=0)
    elif op == "min":
        r = v.min(axis=0)
    elif op == "max":
        r = v.max(axis=0)
    elif op == "and":
        r = np.logical_and.reduce(v, axis=0)
    else:
        r = np.logical_or.reduce(v, axis=0)
    return np.asarray(r).astype(dtype)


def _group_vals(xs, r, s, k):
    return xs[_block_members(r, s, k)]


def _grouping(s, k):
    return lambda ir: ir.replica_grouping(s, k)


def _check(got, want, dtype):
    if np.dtype(dtype).kind == "f":
        tol = 1e-3 if dtype == F16 else 1e-6
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


def _build(fn, s, k):
    """A graph builder calling `fn(x, group)` with the grouping (s, k) of the current Ir."""
    return lambda x: fn(x, popxl.gcg().ir.replica_grouping(s, k))


@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
@pytest.mark.parametrize("op,dtype", [("add", F32), ("add", F16), ("add", I32), ("add", U32),
                                      ("mean", F32), ("mean", F16), ("min", F32), ("max", I32),
                                      ("mul", F32), ("square_add", F16), ("and", np.bool_),
                                      ("or", np.bool_)])
def test_all_reduce_kernel(R, s, k, op, dtype):
    xs = _data(R, (3, 5), dtype)
    for W in sorted({1, 2, R}):
        got, passed, _ = _run(R, W, _build(lambda x, g: C.replicated_all_reduce(x, op, g), s, k),
                              xs)
        for r in range(R):
            _check(got[r], _ref_reduce(_group_vals(xs, r, s, k), op, dtype), dtype)
            np.testing.assert_array_equal(passed[r], xs[r])     # input untouched


@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
def test_all_reduce_inplace_kernel_writes_its_input(R, s, k):
    xs = _data(R, (2, 3), F32)
    assert KERNELS["ReplicatedAllReduceInplace"].modifies == (0,)
    got, passed, _ = _run(R, 2 if R > 1 else 1,
                          _build(lambda x, g: C.replicated_all_reduce_(x, "max", g), s, k), xs)
    for r in range(R):
        assert got[r] is passed[r]
        _check(passed[r], _ref_reduce(_group_vals(xs, r, s, k), "max", F32), F32)


@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
@pytest.mark.parametrize("op,dtype", [("add", F32), ("add", F16), ("mean", F32), ("max", I32),
                                      ("square_add", F32), ("or", np.bool_)])
@pytest.mark.parametrize("rts", [False, True])
def test_reduce_scatter_kernel(R, s, k, op, dtype, rts):
    shape = (3, 5)                    # 15 elements: padded for k = 2, 4, 8
    xs = _data(R, shape, dtype, seed=1)
    c = -(-15 // k)
    got, _, _ = _run(R, 2 if R > 1 else 1, _build(
        lambda x, g: C.replicated_reduce_scatter(x, op, g, rts), s, k), xs)
    for r in range(R):
        full = _ref_reduce(_group_vals(xs, r, s, k), op, dtype).reshape(-1)
        padded = np.concatenate([full, np.zeros(c * k - 15, dtype)])
        i = _block_members(r, s, k).index(r)
        _check(got[r], padded[i * c:(i + 1) * c], dtype)


@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
def test_local_reduce_scatter_takes_own_chunk_without_communication(R, s, k):
    xs = _data(R, (7,), F32, seed=2)
    c = -(-7 // k)
    for W in sorted({1, 2, R}):
        got, _, comms = _run(R, W, _build(lambda x, g: C.replica_sharded_slice(x, g), s, k), xs)
        assert all(cm.calls == [] for cm in comms)
        for r in range(R):
            i = _block_members(r, s, k).index(r)
            padded = np.concatenate([xs[r], np.zeros(c * k - 7, F32)])
            np.testing.assert_array_equal(got[r], padded[i * c:(i + 1) * c])


@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
@pytest.mark.parametrize("mode,axis", [("new_axis", 0), ("concat", 0), ("concat", 1),
                                       ("concat", -1)])
def test_all_gather_kernel(R, s, k, mode, axis):
    xs = _data(R, (2, 3), I32, seed=3)
    got, _, _ = _run(R, 2 if R > 1 else 1, _build(
        lambda x, g: C.replicated_all_gather(x, axis, g, mode), s, k), xs)
    for r in range(R):
        mem = _group_vals(xs, r, s, k)
        want = mem if mode == "new_axis" else np.concatenate(list(mem), axis=axis)
        np.testing.assert_array_equal(got[r], want)
    # local replicas never share a buffer
    for a in range(R):
        for b in range(a + 1, R):
            assert not np.shares_memory(got[a], got[b])


@pytest.mark.parametrize("R,s,k", GROUPINGS, ids=GIDS)
def test_all_gather_meta_shape_kernel_rebuilds_and_truncates(R, s, k):
    meta = (3, 5)
    c = -(-15 // k)
    xs = _data(R, (c,), F16, seed=4)
    got, _, _ = _run(R, 2 if R > 1 else 1, _build(
        lambda x, g: C.replicated_all_gather(x, 0, g), s, k), xs, meta_shape=meta)
    for r in range(R):
        want = _group_vals(xs, r, s, k).reshape(-1)[:15].reshape(meta)
        np.testing.assert_array_equal(got[r], want)
