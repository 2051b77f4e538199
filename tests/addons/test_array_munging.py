"""array_munging helpers, InputStreams/OutputStreams, Embedding, testing_utils.run_module."""
import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl_addons.layers import Embedding
from popxl_addons.testing_utils import TensorInput, run_module


def test_shard_unshard_repeat():
    x = np.arange(24).reshape(4, 6)
    s = addons.shard(x, 3, axis=1)
    assert s.shape == (3, 4, 2) and (addons.unshard(s, axis=1) == x).all()
    assert (addons.unshard(s, axis=-1) == x).all()
    assert (addons.shard(x, 3, -1) == s).all()
    assert addons.repeat(x, 2).shape == (2, 4, 6) and addons.repeat_axis(x, 2, 0).shape == (8, 6)
    s2 = addons.shard2D(x, 2, 3, 0, 1)
    assert s2.shape == (6, 2, 2) and (addons.unshard2D(s2, 2, 3, 0, 1) == x).all()
    assert addons.pad_axis(x, 6, 0).shape == (6, 6)
    assert addons.squeeze_safe(np.zeros((1, 3, 1)), [0, 1]).shape == (3, 1)
    assert addons.squeeze_safe(np.zeros((1, 3, 1)), [-1, 2, 0]).shape == (3,)
    tp = addons.tensor_parallel_input(np.arange(8).reshape(4, 2), tp=2, rf=4)
    assert tp.shape == (2, 4, 2) and (tp[0, 0] == tp[0, 1]).all()


def test_shard_layouts_against_slices():
    x = np.arange(4 * 2).reshape(4, 2)
    np.testing.assert_array_equal(addons.shard(x, 2, 0), [x[:2], x[2:]])
    np.testing.assert_array_equal(addons.shard(x, 2, 1), [x[:, :1], x[:, 1:]])
    # shard2D: piece (i, j) of axis_1 x axis_2 at i * n_2 + j (axis_1 outermost).
    np.testing.assert_array_equal(addons.shard2D(x, 2, 2, 0, 1),
                                  [x[:2, :1], x[:2, 1:], x[2:, :1], x[2:, 1:]])
    np.testing.assert_array_equal(addons.shard2D(x, 2, 2, 1, 0),
                                  [x[:2, :1], x[2:, :1], x[:2, 1:], x[2:, 1:]])
    rows = addons.split2D(x, 2, 2, 0, 1)
    assert len(rows) == 2 and all(len(r) == 2 for r in rows)
    np.testing.assert_array_equal(rows[1][0], x[2:, :1])
    data = np.random.default_rng(0).random((10, 3, 4))
    np.testing.assert_array_equal(addons.unshard2D(addons.shard2D(data, 2, 4, 0, 2), 2, 4, -3, -1),
                                  data)
    # unshard_arrays takes pieces that keep their leading axis of 1 (np.split of a shard).
    pieces = np.split(addons.shard(data, 2, 2), 2, axis=0)
    np.testing.assert_array_equal(addons.unshard_arrays(pieces, 2), data)
    with pytest.raises(ValueError, match=r"^All arrays must be of the same rank\. Ranks: "):
        addons.unshard_arrays([np.zeros((1, 2)), np.zeros((1, 2, 1))], 0)
    with pytest.raises(ValueError, match="n_1 \\* n_2"):
        addons.unshard2D(np.zeros((3, 2)), 2, 2, 0, 1)


@pytest.mark.parametrize("n_repeats,n_shards", [(2, 2), (3, 2), (2, 4), (1, 3)])
def test_repeat_shard_modes(n_repeats, n_shards):
    """"contiguous": shards over consecutive replicas, repeated (replica r gets shard
    r % n_shards); "strided": each shard on n_repeats consecutive replicas (r // n_repeats)."""
    x = np.arange(4 * n_shards).reshape(2 * n_shards, 2)
    pieces = np.split(x, n_shards, axis=0)
    contiguous = addons.repeat_shard(x, n_repeats, n_shards, 0, "contiguous")
    strided = addons.repeat_shard(x, n_repeats, n_shards, 0, sharded_tensor="strided")
    R = n_repeats * n_shards
    np.testing.assert_array_equal(contiguous, [pieces[r % n_shards] for r in range(R)])
    np.testing.assert_array_equal(strided, [pieces[r // n_repeats] for r in range(R)])
    np.testing.assert_array_equal(addons.repeat_shard(np.arange(4), 2, 2, 0),
                                  [[0, 1], [2, 3], [0, 1], [2, 3]])
    with pytest.raises(ValueError, match="contiguous' or 'strided"):
        addons.repeat_shard(x, n_repeats, n_shards, 0, "interleaved")


def test_tensor_parallel_input_and_output():
    a = np.arange(4)
    np.testing.assert_array_equal(addons.tensor_parallel_input(a, 1, 2), [[0, 1], [2, 3]])
    np.testing.assert_array_equal(addons.tensor_parallel_input(a, 2, 2),
                                  [[0, 0], [1, 1], [2, 2], [3, 3]])
    np.testing.assert_array_equal(addons.tensor_parallel_input(a, 2, 4),
                                  [[0, 0, 1, 1], [2, 2, 3, 3]])
    # repeat_fn is called once per tensor-parallel replica with (a copy, its index).
    seen = []

    def shift(x, i):
        seen.append(x.shape)
        return x + 100 * i

    out = addons.tensor_parallel_input(a, 2, 4, shift)
    assert seen == [(4, 1), (4, 1)]
    np.testing.assert_array_equal(out, [[0, 100, 1, 101], [2, 102, 3, 103]])
    with pytest.raises(ValueError, match=r"^tensor parallel factor `tp` is not less than replication factor `rf`: \d+ > \d+$"):
        addons.tensor_parallel_input(a, 4, 2)
    with pytest.raises(ValueError, match=r"^tensor parallel factor `tp` does not equally divide replication factor `rf`: rf/tp="):
        addons.tensor_parallel_input(a, 3, 4)
    from popxl_addons.array_munging import tensor_parallel_output

    host = np.arange(3 * 4 * 2).reshape(3, 4, 2)          # 3 transfers, rf 4 (tp 2, dp 2)
    ident = tensor_parallel_output(host, 3, 2, 4, (2,))
    np.testing.assert_array_equal(ident, host[:, ::2].reshape(-1, 2))
    every = tensor_parallel_output(host, 3, 2, 4, (2,), tp_identical=False)
    np.testing.assert_array_equal(every, host.reshape(6, 2, 2))
    np.testing.assert_array_equal(
        tensor_parallel_output(host, 3, 2, 4, (2,), true_num_host_transfers=1), host[0, ::2])


def test_axis_helpers_refuse_out_of_range():
    x = np.zeros((1, 2, 3, 4))
    assert addons.handle_negative_axis(x, -1) == 3 and addons.handle_negative_axis(x, 3) == 3
    # upstream's wording
    for bad in (4, -5):
        with pytest.raises(IndexError, match=rf"^Axis is out of range\. Axis: {bad}\. Array Rank: 4$"):
            addons.handle_negative_axis(x, bad)
    with pytest.raises(IndexError, match="^Array is 0-dimensional$"):
        addons.handle_negative_axis(np.array(0), 0)
    with pytest.raises(ValueError, match="already has length"):
        addons.pad_axis(np.zeros((3, 5)), 4, 1)
    np.testing.assert_array_equal(addons.pad_axis(np.arange(6).reshape(3, 2), 5, 1, -1),
                                  [[0, 1, -1, -1, -1], [2, 3, -1, -1, -1], [4, 5, -1, -1, -1]])


def test_streams_collections():
    ir = popxl.Ir()
    with ir.main_graph:
        ins = addons.InputStreams(x=((2,), popxl.float32), y=((3,), popxl.int32))
        outs = addons.OutputStreams(z=((2,), popxl.float32))
        assert ins.x.shape == (2,) and ins[1] is ins["y"] and list(ins) == [ins.x, ins.y]
        assert isinstance(outs.z, popxl.DeviceToHostStream)
        again = addons.InputStreams.from_streams(list(ins))
        assert list(again.keys()) == [ins.x.tensor_id, ins.y.tensor_id]


def test_embedding_and_run_module():
    np.random.seed(0)
    emb = Embedding(popxl.float32, vocab_size=20, hidden_size=3)
    assert emb.vocab_shard_size == 32 and list(Embedding.get_offsets(40, 2)) == [0, 32]
    idx = np.array([1, 5, 19], np.int32)
    table = np.random.normal(size=(32, 3)).astype(np.float32)
    (out,) = run_module(emb, TensorInput(idx), weights={"weight": table})
    np.testing.assert_allclose(out, table[idx])
