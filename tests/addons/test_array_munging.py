"""array_munging helpers, InputStreams/OutputStreams, Embedding, testing_utils.run_module."""
import numpy as np

import popxl
import popxl_addons as addons
from popxl_addons.layers import Embedding
from popxl_addons.testing_utils import TensorInput, run_module


def test_shard_unshard_repeat():
    x = np.arange(24).reshape(4, 6)
    s = addons.shard(x, 3, axis=1)
    assert s.shape == (3, 4, 2) and (addons.unshard(s, axis=1) == x).all()
    assert addons.repeat(x, 2).shape == (2, 4, 6) and addons.repeat_axis(x, 2, 0).shape == (8, 6)
    s2 = addons.shard2D(x, 2, 3, 0, 1)
    assert s2.shape == (6, 2, 2) and (addons.unshard2D(s2, 2, 3, 0, 1) == x).all()
    rs = addons.repeat_shard(x, 2, 2, shard_axis=0, sharded_tensor="strided")
    assert (rs[0] == rs[2]).all() and rs.shape == (4, 2, 6)
    assert addons.pad_axis(x, 6, 0).shape == (6, 6)
    assert addons.squeeze_safe(np.zeros((1, 3, 1)), [0, 1]).shape == (3, 1)
    tp = addons.tensor_parallel_input(np.arange(8).reshape(4, 2), tp=2, rf=4)
    assert tp.shape == (2, 4, 2) and (tp[0, 0] == tp[0, 1]).all()


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
