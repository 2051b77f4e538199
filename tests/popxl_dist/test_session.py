"""Session: host I/O layout, attach semantics, weights, and the errors upstream users expect."""
import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops


def _double_program(shape=(2, 3), n_transfers=1):
    ir = popxl.Ir()
    ir.num_host_transfers = n_transfers
    with ir.main_graph:
        x_s = popxl.h2d_stream(shape, popxl.float32, "x")
        w = popxl.variable(np.ones(shape, np.float32), name="w")
        x = ops.host_load(x_s, "x")
        y = x * 2.0 + w
        y_s = popxl.d2h_stream(shape, popxl.float32, "y")
        ops.host_store(y_s, y)
    return ir, x_s, y_s, w


def test_run_returns_outputs_and_requires_attach():
    ir, x_s, y_s, w = _double_program()
    sess = popxl.Session(ir, "ipu_model")
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(ValueError, match="Must be attached"):
        sess.run({x_s: data})
    assert not sess.is_attached
    with sess:
        assert sess.is_attached
        out = sess.run({x_s: data})
    assert not sess.is_attached
    np.testing.assert_array_equal(out[y_s], data * 2 + 1)


@pytest.mark.parametrize("bad,err,match", [
    (np.zeros((3, 3), np.float32), ValueError, r"'x' expects an array of shape \(2, 3\).*got shape \(3, 3\)"),
    (np.zeros((2, 3), np.int32), TypeError, r"'x' expects dtype float32, got int32"),
])
def test_stream_shape_and_dtype_errors_name_the_stream(bad, err, match):
    ir, x_s, y_s, _ = _double_program()
    with popxl.Session(ir, "cpu") as sess:
        with pytest.raises(err, match=match):
            sess.run({x_s: bad})


def test_float64_input_is_downcast_like_upstream():
    ir, x_s, y_s, _ = _double_program()
    with popxl.Session(ir, "cpu") as sess:
        out = sess.run({x_s: np.ones((2, 3))})
    assert out[y_s].dtype == np.float32
    np.testing.assert_array_equal(out[y_s], 3)


def test_missing_and_unknown_streams():
    ir, x_s, y_s, _ = _double_program()
    other = popxl.Ir()
    with other.main_graph:
        z_s = popxl.h2d_stream((1,), popxl.float32, "z")
    with popxl.Session(ir, "cpu") as sess:
        with pytest.raises(ValueError, match=r"Missing: \['x'\]"):
            sess.run({})
        with pytest.raises(ValueError, match=r"Unexpected: \['z'\]"):
            sess.run({x_s: np.zeros((2, 3), np.float32), z_s: np.zeros(1, np.float32)})


def test_num_host_transfers_with_repeat_reads_each_transfer():
    ir = popxl.Ir()
    ir.num_host_transfers = 3
    with ir.main_graph:
        x_s = popxl.h2d_stream((2,), popxl.float32, "x")
        y_s = popxl.d2h_stream((2,), popxl.float32, "y")
        acc = popxl.variable(np.zeros(2, np.float32), name="acc")

        def body(a: popxl.TensorByRef):
            x = ops.host_load(x_s, "x")
            ops.add_(a, x)
            ops.host_store(y_s, a + 0.0)

        g = ir.create_graph(body, acc)
        ops.repeat(g, 3, acc)
    data = np.arange(6, dtype=np.float32).reshape(3, 2)
    with popxl.Session(ir, "cpu") as sess:
        assert sess._full_input_shape((2,)) == (3, 2)
        out = sess.run({x_s: data})
        np.testing.assert_array_equal(out[y_s], np.cumsum(data, axis=0))
        np.testing.assert_array_equal(sess.get_tensor_data(acc), data.sum(0))


def test_weights_read_write_and_sync():
    ir, x_s, y_s, w = _double_program()
    sess = popxl.Session(ir, "cpu")
    np.testing.assert_array_equal(sess.get_tensor_data(w), np.ones((2, 3)))
    sess.write_variable_data(w, np.full((2, 3), 5, np.float32))
    with sess:
        out = sess.run({x_s: np.zeros((2, 3), np.float32)})
        np.testing.assert_array_equal(out[y_s], 5)
        sess.write_variable_data(w, np.full((2, 3), 7, np.float32))
        out = sess.run({x_s: np.zeros((2, 3), np.float32)})
        np.testing.assert_array_equal(out[y_s], 7)
    with pytest.raises(ValueError, match=r"^The shape of the input array \(3,\) must match the "
                                         r"shape of the tensor w : \(2, 3\)$"):
        sess.write_variable_data(w, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="^The dtype of the input array float64 must match the "
                                        "equivalent type of the tensor w : popxl.dtypes.float32"):
        sess.write_variable_data(w, np.zeros((2, 3), np.float64))


def test_get_tensor_data_rejects_non_variables():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32))
        y = v + 1.0
    sess = popxl.Session(ir, "cpu")
    with pytest.raises(TypeError, match=r"^Tensor\[.*\] is not of type Constant or Variable\. "
                                        r"get_tensor_data is not supported for this type\."):
        sess.get_tensor_data(y)
    with pytest.raises(TypeError, match=r"^Tensor .* is not of type Variable\. "
                                        r"write_variable_data is not supported for this type\."):
        sess.write_variable_data(y, np.ones(2, np.float32))


@pytest.mark.parametrize("dtype,value", [(np.int32, 3.7), (np.float32, 1e300), (np.uint8, -1),
                                         (np.int32, float("nan")), (np.uint8, 256),
                                         (np.bool_, 2), (np.float16, 2**70),
                                         (np.float32, 10**400), (np.int32, 2**70)])
def test_write_variable_data_refuses_numbers_it_would_change(dtype, value):
    """A Python number written to a variable must be representable in its dtype (a fraction
    into an integer variable, a value out of range, NaN into an integer, a finite overflow to
    inf are refused); the variable keeps its value."""
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(3, dtype), name="v")
    with popxl.Session(ir, "cpu") as sess:
        with pytest.raises(ValueError, match=rf"^write_variable_data: the value "
                                             rf"{re.escape(repr(value))} for variable v .* in "
                                             rf"its dtype"):
            sess.write_variable_data(v, value)
        np.testing.assert_array_equal(sess.get_tensor_data(v), np.zeros(3, dtype))


@pytest.mark.parametrize("dtype,value,want", [(np.int32, 3.0, 3), (np.int32, np.int64(-5), -5),
                                              (np.float32, 0.1, np.float32(0.1)),
                                              (np.float16, 1e4, np.float16(1e4)),
                                              (np.uint8, 255, 255), (np.bool_, True, True),
                                              (np.float32, float("inf"), np.inf),
                                              (np.float32, 2**70, np.float32(2.0**70))])
def test_write_variable_data_takes_representable_numbers(dtype, value, want):
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(2, dtype), name="v")
    with popxl.Session(ir, "cpu") as sess:
        sess.write_variable_data(v, value)
        got = sess.get_tensor_data(v)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, np.full(2, want, dtype))


@pytest.mark.parametrize("data,why", [([[1.0, 2.0, 3.0], [4.0]], "inhomogeneous"),
                                      ([np.zeros(2), np.zeros(3)], "inhomogeneous")])
def test_write_variable_data_names_the_variable_for_data_that_is_no_array(data, why):
    """Data NumPy cannot turn into one array (a ragged list) is refused naming the variable
    and the shape and dtype it expects, not with NumPy's message alone; the variable keeps
    its value."""
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((2, 3), np.float32), name="weight")
    with popxl.Session(ir, "cpu") as sess:
        with pytest.raises(TypeError, match=rf"^write_variable_data: the data for variable "
                                            rf"weight is not an array \(list: ValueError: .*"
                                            rf"{why}.*\); expected a NumPy array of shape "
                                            rf"\(2, 3\) and dtype float32$"):
            sess.write_variable_data(v, data)
        np.testing.assert_array_equal(sess.get_tensor_data(v), np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("build,op,operand,kind", [
    (lambda f, i: ops.exp(i), "Exp", "'t' 'i'", "a floating point"),
    (lambda f, i: ops.swish_(i), "SwishInplace", "'t' 'i'", "a floating point"),
    (lambda f, i: ops.dropout(i, popxl.variable(np.array([1, 2]), popxl.uint32), 0.5),
     "Dropout", "'t' 'i'", "a floating point"),
    (lambda f, i: ops.lamb_square(i), "LambSquare", "'t' 'i'", "a floating point"),
    (lambda f, i: ops.var_updates.adam_updater(i, i), "AdamUpdater", "'acc_first_order' 'i'",
     "a floating point"),
    (lambda f, i: ops.var_updates.lamb_updater(f, f, weight=i, weight_decay=0.1),
     "LambUpdater", "'weight' 'i'", "a floating point"),
    (lambda f, i: ops.var_updates.adam_updater(f, f, time_step=i[0, 0], beta1=0.9, beta2=0.9),
     "AdamUpdater", "'time_step'", "a floating point"),
    (lambda f, i: ops.var_updates.adam_var_update(i, f, f[0, 0], f[0, 0]), "AdamVarUpdate",
     "'t' 'i'", "a floating point"),
    (lambda f, i: ops.nll_loss_with_softmax_grad(f, f[:, 0]), "NlllWithSoftmaxGradDirect",
     "'labels'", "an integer"),
])
def test_operand_dtypes_no_ipu_program_takes_are_refused_by_the_session(build, op, operand,
                                                                        kind):
    """As upstream, these ops build with such operands (an integer input to exp, dropout or an
    Adam updater; float labels); the Session refuses them, naming the op, the operand and
    where the op was built, before anything runs."""
    ir = popxl.Ir()
    with ir.main_graph:
        f = popxl.variable(np.ones((2, 2), np.float32), name="f")
        i = popxl.variable(np.ones((2, 2), np.int32), name="i")
        build(f, i)                                       # builds, as upstream
    with pytest.raises(TypeError, match=rf"^Session: {op}\.\d+ .* \(built at .*test_session.py:"
                                        rf"\d+\): {operand}.* must have {kind} dtype, got "
                                        rf"\w+ \(the op builds, as upstream, but cannot "
                                        rf"compile\)$"):
        popxl.Session(ir, "cpu")


def test_weights_come_to_the_host_once_per_run_and_say_so_on_popart_s_log(capfd):
    """get_tensor_data after a run copies the weights from the device once (PopART's debug
    lines "Writing weights to host" / "... complete.", as upstream's Devicex logs them), not
    again while the host copy is in sync, nor after write_variables_data."""
    import popart

    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.float32(2), name="w")
        ops.var_updates.accumulate_(w, popxl.constant(np.float32(1)))
    sess = popxl.Session(ir, "cpu")
    popart.getLogger().setLevel("DEBUG")
    try:
        capfd.readouterr()
        with sess:
            log = capfd.readouterr().err          # entering uploads the weights once
            assert log.count("D: Writing weights from host, \n") == 1 and "D: done." in log
            sess.get_tensor_data(w)
            assert "Writing weights" not in capfd.readouterr().err   # in sync since made
            sess.run()
            assert sess.get_tensor_data(w) == 3.0 and sess.get_tensor_data(w) == 3.0
            log = capfd.readouterr().err
            assert log.count("D: Writing weights to host complete.") == 1, log
            assert log.count("D: Writing weights to host\n") == 1, log
            sess.write_variables_data({w: np.float32(7)})
            sess.get_tensors_data([w])
            assert "Writing weights to host" not in capfd.readouterr().err
    finally:
        popart.getLogger().setLevel("WARN")


def test_variables_updated_in_place_persist_across_runs():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros(3, np.float32), name="counter")
        ops.add_(v, popxl.constant(np.ones(3, np.float32)))
    with popxl.Session(ir, "cpu") as sess:
        for _ in range(4):
            sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(v), 4)


def test_bad_device_name():
    ir, *_ = _double_program()
    with pytest.raises(ValueError, match="device_desc must be one of"):
        popxl.Session(ir, "gpu")


def test_session_options_shim_is_settable():
    ir, *_ = _double_program()
    ir._pb_ir.getSessionOptions().numIOTiles = 32
    assert ir._pb_ir.getSessionOptions().numIOTiles == 32
    popxl.Session(ir, "ipu_hw")
