"""The optional compiled float16 converters (numba, the `fast` extra) give the NumPy converters'
bits, and kernels give the same results with either."""
import numpy as np
import pytest

from popxl.engine.kernels import _util
from popxl.engine.kernels._f16_numba import _check

rng = np.random.default_rng(3)


@pytest.fixture
def numpy_converters():
    _util.use_compiled_converters(False)
    yield
    _util.use_compiled_converters(None)


def test_compiled_converters_match_numpy_on_every_float16_and_edge_float32():
    pytest.importorskip("numba")
    fns = _util._converters()
    assert fns is not None, "numba is installed but the compiled converters were not enabled"
    assert _check(*fns)
    h = np.arange(2 ** 16, dtype=np.uint16)
    got = np.empty(h.size, np.float32)
    fns[1](h, got)
    assert got.view(np.uint32).tobytes() == h.view(np.float16).astype(np.float32).view(
        np.uint32).tobytes()
    u = rng.integers(0, 2 ** 32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    out = np.empty(u.size, np.uint16)
    fns[0](u.view(np.float32), out)
    want = np.empty(u.size, np.uint16)
    _util._f32_bits_to_f16(u, want)
    assert out.tobytes() == want.tobytes()


def test_numpy_converters_alone(numpy_converters):
    assert _util._converters() is None
    x = (rng.normal(size=100_000) * 10.0 ** rng.integers(-9, 5, 100_000)).astype(np.float32)
    with np.errstate(all="ignore"):
        assert _util.to_f16(x).tobytes() == x.astype(np.float16).tobytes()
    h = x.astype(np.float16)
    assert _util.from_f16(h).tobytes() == h.astype(np.float32).tobytes()


def _step_losses():
    """Three float16 training steps of a small layer (matmul, layer norm, GELU, softmax cross
    entropy, their gradients, an SGD update): the losses and the trained weight."""
    import popxl
    import popxl.ops as ops
    from popxl import transforms

    rng = np.random.default_rng(5)
    x0 = (rng.normal(size=(16, 32)) * 2).astype(np.float16)
    w0 = (rng.normal(size=(32, 24)) * 0.2).astype(np.float16)
    g0, b0 = np.ones(24, np.float16), np.zeros(24, np.float16)
    labels = rng.integers(0, 24, 16).astype(np.int32)
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(x0, popxl.float16, "x")
        w = popxl.variable(w0, popxl.float16, "w")
        gamma = popxl.variable(g0, popxl.float16, "gamma")
        beta = popxl.variable(b0, popxl.float16, "beta")
        lab = popxl.constant(labels, popxl.int32, "labels")

        def net(x, w, gamma, beta):
            return ops.gelu(ops.layer_norm(x @ w, gamma, beta))

        g = ir.create_graph(net, x, w, gamma, beta)
        bwd = transforms.autodiff(g, grads_required=g.inputs[1:])
        info = ops.call_with_info(g, x, w, gamma, beta)
        loss, dy = ops.nll_loss_with_softmax_grad(ops.softmax(info.outputs[0], -1), lab)
        grads = ops.call(bwd.graph, dy, inputs_dict=bwd.inputs_dict(info))
        for p, gp in zip((w, gamma, beta), grads):
            ops.scaled_add_(p, gp, b=-0.1)
        loss_s = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(loss_s, ops.cast(loss, popxl.float32))
    with popxl.Session(ir, "ipu_hw") as sess:
        losses = [sess.run()[loss_s] for _ in range(3)]
        trained = sess.get_tensor_data(w)
    assert not np.array_equal(trained, w0)                      # it trained
    return losses + [trained]


def test_kernels_give_the_same_bits_with_either_converter():
    pytest.importorskip("numba")
    _util.use_compiled_converters(None)
    fast = _step_losses()
    _util.use_compiled_converters(False)
    try:
        slow = _step_losses()
    finally:
        _util.use_compiled_converters(None)
    for a, b in zip(fast, slow):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
