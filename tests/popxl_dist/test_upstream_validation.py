"""Arguments upstream's builders and IR API refuse, refused here with upstream's wording at the
start of the message (programs and their tests match on it; our detail follows). Each case is
a call upstream documents or implements as raising."""
import numpy as np
import pytest

import popart
import popxl
import popxl.ops as ops


@pytest.fixture
def built():
    """(ir, a float32 (2, 3) variable, an int32 (2, 3) variable, a float32 scalar)."""
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 3), np.float32), name="a")
        i = popxl.variable(np.ones((2, 3), np.int32), name="i")
        s = popxl.variable(np.float32(2), name="s")
        yield ir, a, i, s


def init(shape):
    return ops.init(shape, popxl.float32)


OP_CASES = [
    # operands that are not tensors
    (lambda a, i, s: ops.add(a, "x"), TypeError,
     r"The input `rhs` is not a Tensor. Type: <class 'str'>. Value: x\."),
    (lambda a, i, s: ops.matmul(a, np.ones((3, 2))), TypeError,
     r"The input `rhs` is not a Tensor. Type: <class 'numpy.ndarray'>"),
    # invalid add / matmul operands (PopART refuses them when it sets the op up)
    (lambda a, i, s: ops.add(a, init((4, 5))), popart.popart_exception,
     r"add: shapes cannot be broadcast together"),
    (lambda a, i, s: ops.add(a, i), popart.popart_exception,
     r"add: inputs must have the same dtype"),
    (lambda a, i, s: ops.matmul(a, init((4, 5))), popart.popart_exception,
     r"MatMul contracting dimensions unequal: lhs 'a' \[2, 3\], rhs '.*' \[4, 5\]"),
    (lambda a, i, s: ops.matmul(s, s), popart.popart_exception,
     r"MatMul doesn't support scalar tensor 's' as the lhs input"),
    (lambda a, i, s: ops.matmul(i, ops.transpose(i)), TypeError,
     r"matmul: 'i' and .* are int32; the IPU's matmul takes float16 or float32"),
    (lambda a, i, s: ops.matmul(a, init((3, 2)), partials_type=popxl.int32), ValueError,
     r"dtype popxl.dtypes.int32 is not valid, must be float16 or float32"),
    # shapes and axes
    (lambda a, i, s: ops.reshape(a, (-2, 3)), ValueError,
     r"Invalid shape value in reshape. Must be '>0' or '-1'. Provided \(-2, 3\)\."),
    (lambda a, i, s: ops.reshape(a, (2.5, 2)), ValueError, r"Invalid shape value in reshape"),
    (lambda a, i, s: ops.reshape(a, (3.0, 2)), ValueError, r"Invalid shape value in reshape"),
    (lambda a, i, s: ops.reshape(a, np.array([3, 2])), TypeError,
     r"reshape: shape must be a tuple or list of ints, got ndarray"),
    (lambda a, i, s: ops.reshape(a, (-1, -1)), ValueError,
     r"Reshape shape can contain at most one '-1' value. Provided \(-1, -1\)\."),
    (lambda a, i, s: a.reshape_((0, 6)), ValueError, r"Invalid shape value in reshape"),
    (lambda a, i, s: ops.sum(a, axis="10"), TypeError,
     r"sum: axis must be an int or a sequence of ints, got '10'"),
    (lambda a, i, s: ops.max(a, axis=[0.0]), TypeError, r"max: axis must be an int"),
    (lambda a, i, s: ops.transpose(a, (0, 5)), ValueError,
     r"Values in permutation must be less than the tensor's rank 2. Found \(5,\)"),
    (lambda a, i, s: ops.init((2, -1), popxl.float32), ValueError,
     r"init: shape must not have negative sizes"),
    # collectives
    (lambda a, i, s: ops.collectives.replicated_all_gather(a, popxl.gcg().ir.replica_grouping()),
     ValueError, r"Axis should be an int. Type: <class 'popxl.replica_grouping.ReplicaGrouping'>"),
    (lambda a, i, s: ops.collectives.replicated_all_reduce(a, "sum"), ValueError,
     r"Not a valid op: sum. Must choose from: add, mean, mul, min, max, and, or, square_add, "
     r"local"),
    (lambda a, i, s: ops.collectives.replicated_slice(init((3,))), ValueError,
     r"Replicated slice must equally divide axis. Axis size: 3. Replica group size: 2"),
    # other builders
    (lambda a, i, s: ops.cast(a, popxl.float8_143), TypeError,
     r"Data type popxl.dtypes.float8_143 not supported for popxl.ops.cast, please consider "
     r"pow2scale_cast_to_fp8 or pow2scale_cast_from_fp8"),
    (lambda a, i, s: ops.init((2,), popxl.float32, init_type="ones"), ValueError,
     r"Unknown init_type: ones"),
    (lambda a, i, s: ops.interpolate(init((1, 1, 2, 2)), (1, 1, 2, 2), mode="area"), ValueError,
     r"interpolate type area is not valid, must be nearest, linear or cubic\."),
    (lambda a, i, s: ops.nll_loss(a, i, reduction="avg"), ValueError,
     r"Not a valid reduction: avg. Must choose from: mean, sum, none"),
    (lambda a, i, s: ops.conv(init((1, 1, 2, 2)), init((1, 1, 1, 1)), pad_type="full"),
     ValueError, r"pad type full is not valid, must be not_set, same_upper, same_lower or valid"),
    (lambda a, i, s: ops.print_tensor(a, close_bracket=")]"), ValueError,
     r"Parameter close_bracket must be 1 character exactly. Not length 2 and value \)\]\."),
    (lambda a, i, s: ops.var_updates.adam_updater(a, a, weight_decay=0.1), ValueError,
     r"Weight decay requires weight to not be None\."),
    (lambda a, i, s: ops.var_updates.lamb_updater(a, a, time_step=s, beta1=0.9), ValueError,
     r"Bias correction requires both beta1 and beta2 to not be None\."),
    (lambda a, i, s: ops.var_updates.adamax_updater(a, a), ValueError,
     r"AdaMax requires time_step to not be None\."),
    (lambda a, i, s: ops.host_store(popxl.d2h_stream((2, 3), popxl.int32), a), ValueError,
     r"dtype of stream .* `popxl.dtypes.int32` does not match dtype of provided tensor "
     r"`popxl.dtypes.float32`"),
    (lambda a, i, s: ops.random_seed.create_random_seed(a, 1), ValueError,
     r"seed Tensor must be shape=\(2,\) dtype=uint32\."),
    (lambda a, i, s: ops.repeat(popxl.gcg().ir.create_graph(lambda x: x, a), -1, a), ValueError,
     r"Repeat count must be >= 0. Repeat count: -1\."),
    (lambda a, i, s: ops.squeeze(a, [0, -2]), ValueError, r"Axes contains duplicates"),
    (lambda a, i, s: ops.split(a, 2, 1), ValueError,
     r"Split 2 does not equally divide tensor axis 1 of length 3\."),
    (lambda a, i, s: ops.scatter_reduce(a, i, reduction="sum"), ValueError,
     r"One of initial_values and axis_size must be specified"),
    (lambda a, i, s: ops.histogram(a, [1.0, 0.5], False), ValueError,
     r"The input levels `\[1.0, 0.5\]` is not a monotonically increasing list\."),
]


@pytest.mark.parametrize("build,err,match", OP_CASES)
def test_builders_refuse_as_upstream(built, build, err, match):
    ir, a, i, s = built
    with pytest.raises(err, match="^" + match):
        build(a, i, s)


def test_ir_graph_and_tensor_api_refuse_as_upstream():
    ir = popxl.Ir()
    other = popxl.Ir()
    with pytest.raises(TypeError, match=r"^Value must be of type popxl.Ir\. Type: <class 'int'>"):
        ir == 5
    with pytest.raises(TypeError, match=r"^Value must be of type popxl.Graph\."):
        ir.main_graph == "main"
    with pytest.raises(TypeError, match=r"^Value must be of type popxl.Tensor\."):
        5 in ir.main_graph
    assert ir != other and ir.main_graph != other.main_graph
    with pytest.raises(TypeError, match=r"^Cannot create popxl.graph.Graph instances using the "
                                        r"constructor\."):
        popxl.Graph()
    with pytest.raises(RuntimeError, match=r"^popxl.Tensor cannot be constructed directly\."):
        popxl.Tensor()
    with pytest.raises(NotImplementedError, match=r"^Cannot construct a popxl.Stream directly\."):
        popxl.streams.Stream()
    with pytest.raises(ValueError, match=r"^Entries must be a non-zero, positive integer\. Got 0"):
        popxl.RemoteBuffer((2,), popxl.float32, 0)          # checked before the graph is needed
    with pytest.raises(TypeError, match=r"^Callable `fn` must be either a function or a class "
                                        r"that extends popxl.Module"):
        ir.create_graph(5)
    with pytest.raises(ValueError, match=r"^The arguments, `args` and `kwargs`, do not match the "
                                         r"signature of the function `fn`\."):
        ir.create_graph(lambda x: x, popxl.TensorSpec((1,), popxl.float32), 2)
    with pytest.raises(ValueError, match=r"^Output of subgraph must be None, a Tensor or an "
                                         r"iterable of Tensors\."):
        ir.create_graph(lambda: 5)
    with pytest.raises(TypeError, match=r"^A <class 'list'> argument can't contain a mixture of "
                                        r"Tensors and other types\."):
        ir.create_graph(lambda xs: xs[0], [popxl.TensorSpec((1,), popxl.float32), 1])
    with pytest.raises(RuntimeError, match=r"^Trying to a create a context manager nested in "
                                           r"another context, when the previous context's Ir is "
                                           r"different\."):
        with ir.main_graph, other.main_graph:
            pass
    with ir.main_graph:
        with pytest.raises(ValueError, match=r"^Unknown op created hook 42"):
            ir.main_graph.remove_op_created_hook(42)
        s = popxl.variable(np.float32(1), name="s")
        with pytest.raises(ValueError, match=r"^Tensor is a scalar and doesn't have a length\."):
            len(s)
        with pytest.raises(ValueError, match=r"^Diag expected a 2d tensor\."):
            ops.init((2, 2, 2), popxl.float32).diag()


@pytest.mark.parametrize("shape,err", [((-1,), ValueError), ((2.5,), TypeError), (5, TypeError),
                                       (None, TypeError), ([2, "3"], TypeError)])
def test_stream_and_spec_shapes_must_be_int_sequences(shape, err):
    ir = popxl.Ir()
    with ir.main_graph:
        for make in (lambda: popxl.h2d_stream(shape, popxl.float32),
                     lambda: popxl.d2h_stream(shape, popxl.float32),
                     lambda: popxl.TensorSpec(shape, popxl.float32)):
            with pytest.raises(err, match="shape must"):
                make()
        assert popxl.h2d_stream((2, np.int64(3)), popxl.float32).shape == (2, 3)
        assert popxl.h2d_stream([], popxl.float32).shape == ()


def test_call_site_inputs_refuse_as_upstream():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32), name="x")
        g = ir.create_graph(lambda a: a + 1.0, x)
        with pytest.raises(ValueError, match=r"^Too many inputs have been provided to the called "
                                             r"graph\. The number of positional inputs exceeds "
                                             r"the number of inputs of the graph\. 2 > 1\."):
            ops.call(g, x, x)
        with pytest.raises(ValueError, match=r"^Not enough inputs have been provided for the "
                                             r"called graph .*\n\nMissing inputs:\n"):
            ops.call(g)
        with pytest.raises(TypeError, match=r'^Input at position "0" could not be coerced into a '
                                            r'tensor for the called graph'):
            ops.call(g, "two")
        with pytest.raises(ValueError, match=r"^Graph input tensor is specified twice for the "
                                             r"called graph"):
            ops.call(g, x, inputs_dict={g.inputs[0]: x})
        info = ops.call_with_info(g, x)
        with pytest.raises(ValueError, match=r"^Tensor x is not an input or output of the called "
                                             r"graph\(s\)\."):
            info.graph_to_parent(x)
        with pytest.raises(ValueError, match=r"^Tensor t is not a parent graph input of the call "
                                             r"site\."):
            info.parent_to_graph(popxl.constant(1.0))


def test_io_tile_exchange_verifies_one_op_remains():
    """As upstream: the exchanges made inside merge into one op; any other op left would keep
    the IO tiles from overlapping with compute."""
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32, 2)
        x = popxl.variable(np.ones(2, np.float32), name="x")
        s = popxl.h2d_stream((2,), popxl.float32, "s")
        with popxl.transforms.io_tile_exchange():
            loaded = ops.remote_load(buf, 0)
            ops.remote_store(buf, 1, x)
            streamed = ops.host_load(s)
        with pytest.raises(RuntimeError, match=r"^More than one Op remained after "
                                               r"`io_tile_exchange`\. This will prevent overlap "
                                               r"with following compute\. Remaining Ops:\n   "
                                               r"Op\(.*Add"):
            with popxl.transforms.io_tile_exchange():
                ops.remote_store(buf, 0, x + 1.0)
        with popxl.transforms.io_tile_exchange(verify_overlap=False):
            ops.remote_store(buf, 0, x + 1.0)
        out = popxl.d2h_stream((2,), popxl.float32)
        ops.host_store(out, loaded + streamed)
    with popxl.Session(ir, "ipu_hw") as sess:
        np.testing.assert_array_equal(sess.run({s: np.full(2, 3.0, np.float32)})[out], [3.0, 3.0])
