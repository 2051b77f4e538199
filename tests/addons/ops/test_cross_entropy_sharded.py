"""`cross_entropy_sharded_loss` (classes sharded over replicas) and `cross_entropy_sharded_wr_loss`
(over the IPUs of one replica) against the cross entropy of the unsplit logits (PyTorch's
`cross_entropy`, in NumPy: tests/references.py), forward and gradient. More groupings and every
backend: tests/popxl_dist/runtime/tp_cases.py."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import references as ref
from harness import grads, replicated_grads
from popxl_addons.ops.cross_entropy_sharded_loss import cross_entropy_sharded_loss
from popxl_addons.ops.cross_entropy_sharded_wr_loss import cross_entropy_sharded_wr_loss

N, C = 7, 6


@pytest.mark.parametrize("R", [1, 2, 4])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_replicated_against_reference(R, reduction):
    rng = np.random.default_rng(R)
    full = (rng.normal(size=(N, C * R)) * 3).astype(np.float32)
    labels = rng.integers(0, C * R, size=N)
    labels[2] = 5                                        # ignored below
    shards = np.stack(np.split(full, R, axis=1))
    idx = np.stack([labels - r * C for r in range(R)]).astype(np.int32)
    ign = np.array([5 - r * C for r in range(R)], np.int32)
    dl = rng.normal(size=(N,) if reduction == "none" else ()).astype(np.float32)

    def fn(logits, indices, ignore):
        return cross_entropy_sharded_loss(logits, indices, ignore, reduction=reduction)

    (loss,), (dlogits,) = replicated_grads(fn, R, [shards, idx, ign], [np.stack([dl] * R)])
    want, dwant = ref.cross_entropy(full, labels, reduction, ignore_index=5, dloss=dl)
    for r in range(R):
        np.testing.assert_allclose(loss[r], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dlogits[r], dwant[:, r * C:(r + 1) * C],
                                   rtol=1e-4, atol=1e-6)


def test_float16_logits():
    rng = np.random.default_rng(3)
    full = rng.normal(size=(N, 2 * C)).astype(np.float16)
    labels = rng.integers(0, 2 * C, size=N)
    shards = np.stack(np.split(full, 2, axis=1))
    idx = np.stack([labels - r * C for r in range(2)]).astype(np.int32)
    (loss,), (dl,) = replicated_grads(lambda lg, ix: cross_entropy_sharded_loss(lg, ix), 2,
                                      [shards, idx], [np.ones((2,), np.float16)])
    assert loss.dtype == np.float16 and dl.dtype == np.float16
    want, dwant = ref.cross_entropy(full.astype(np.float32), labels, "mean", dloss=1.0)
    for r in range(2):
        np.testing.assert_allclose(loss[r], want, rtol=2e-3)
        np.testing.assert_allclose(dl[r], dwant[:, r * C:(r + 1) * C], atol=2e-3)


def test_python_int_ignore_index_on_one_shard():
    """An int ignore_index is compared with the (offset) indices: with one shard it is the
    label itself."""
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(1, N, C)).astype(np.float32)
    labels = rng.integers(0, C, size=N)
    labels[:2] = 4
    (loss,), (dl,) = replicated_grads(
        lambda lg, ix: cross_entropy_sharded_loss(lg, ix, ignore_index=4), 1,
        [logits, labels[np.newaxis].astype(np.int32)], [np.ones((1,), np.float32)])
    want, dwant = ref.cross_entropy(logits[0], labels, "mean", ignore_index=4, dloss=1.0)
    np.testing.assert_allclose(loss[0], want, rtol=1e-5)
    np.testing.assert_allclose(dl[0], dwant, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("k", [2, 3])
def test_within_replica_against_reference(k):
    rng = np.random.default_rng(10 + k)
    full = (rng.normal(size=(N, C * k)) * 2).astype(np.float32)
    labels = rng.integers(0, C * k, size=N)
    shards = np.split(full, k, axis=1)
    idx = [(labels - i * C).astype(np.int32) for i in range(k)]
    dls = [np.float32(1.0)] * k

    def fn(*ts):
        logits, indices = [], []
        for i in range(k):
            with popxl.ipu(i):
                logits.append(ts[i] * 1.0)
                indices.append(ts[k + i] + 0)
        return tuple(cross_entropy_sharded_wr_loss(logits, indices))

    outs, gs = grads(fn, shards + idx, [np.array(d) for d in dls])
    want, dwant = ref.cross_entropy(full, labels, "mean", dloss=1.0)
    for i in range(k):
        np.testing.assert_allclose(outs[i], want, rtol=1e-5)
        np.testing.assert_allclose(gs[i], dwant[:, i * C:(i + 1) * C], rtol=1e-4, atol=1e-7)


def test_within_replica_gives_the_bits_of_the_replicated_version():
    rng = np.random.default_rng(5)
    shards = (rng.normal(size=(2, N, C)) * 4).astype(np.float32)
    labels = rng.integers(0, 2 * C, size=N)
    idx = np.stack([labels - r * C for r in range(2)]).astype(np.int32)
    (rep,), _ = replicated_grads(lambda lg, ix: cross_entropy_sharded_loss(lg, ix), 2,
                                 [shards, idx], [np.ones((2,), np.float32)])

    def fn(a, b, i0, i1):
        with popxl.ipu(1):
            b = b * 1.0
        return tuple(cross_entropy_sharded_wr_loss([a, b], [i0, i1], ipus=[0, 1]))

    outs, _ = grads(fn, [shards[0], shards[1], idx[0], idx[1]],
                    [np.float32(1.0), np.float32(1.0)])
    assert outs[0].tobytes() == rep[0].tobytes() == outs[1].tobytes()


def test_errors():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        lg = popxl.variable(np.zeros((N, C), np.float32), name="lg")
        ix = popxl.variable(np.zeros((N,), np.int32), name="ix")
        with pytest.raises(ValueError, match="must be 2-D"):
            cross_entropy_sharded_loss(ops.reshape(lg, (N * C,)), ix)
        with pytest.raises(ValueError, match=r"must have shape \(7,\)"):
            cross_entropy_sharded_loss(lg, ops.reshape(ix, (1, N)))
        with pytest.raises(TypeError, match="integer tensor"):
            cross_entropy_sharded_loss(lg, ops.cast(ix, popxl.float32))
        with pytest.raises(TypeError, match="float32 or float16"):
            cross_entropy_sharded_loss(ops.cast(lg, popxl.int32), ix)
        with pytest.raises(ValueError, match="reduction must be one of"):
            cross_entropy_sharded_loss(lg, ix, reduction="avg")
        with pytest.raises(ValueError, match="available_memory_proportion"):
            cross_entropy_sharded_loss(lg, ix, available_memory_proportion=1.5)
        with pytest.raises(ValueError, match="integer scalar"):
            cross_entropy_sharded_loss(lg, ix, ignore_index=ix)
        with pytest.raises(TypeError, match="ignore_index"):
            cross_entropy_sharded_loss(lg, ix, ignore_index=1.5)
        with pytest.raises(ValueError, match="2 logits but 1 indices"):
            cross_entropy_sharded_wr_loss([lg, lg], [ix], ipus=[0, 1])
        with pytest.raises(ValueError, match="distinct IPU"):
            cross_entropy_sharded_wr_loss([lg, lg], [ix, ix])
        with pytest.raises(TypeError, match="non-empty list"):
            cross_entropy_sharded_wr_loss(lg, ix)
