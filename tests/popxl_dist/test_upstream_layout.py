"""Upstream's module paths and helper names behave as upstream's: per-op modules, the
collectives/var_updates sub-modules, popxl.tensorlocation/testing/typing_, and the helpers
programs import (random_seed, utils, ops.utils, collectives, slice, reshape, histogram...)."""
import importlib

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from harness import run_ops


def test_per_op_modules_keep_the_function_at_popxl_ops():
    from popxl.ops.add import add_
    from popxl.ops.gather import tied_gather
    from popxl.ops.collectives.collectives import CommGroup
    from popxl.ops.var_updates.accumulate import accumulate_

    assert tied_gather is ops.tied_gather and add_ is ops.add_
    assert CommGroup is ops.collectives.CommGroup and accumulate_ is ops.var_updates.accumulate_
    mod = importlib.import_module("popxl.ops.add")
    assert mod.add is ops.add and callable(ops.add) and not isinstance(ops.add, type(mod))
    assert importlib.import_module("popxl.ops.call").call_with_info is ops.call_with_info
    assert importlib.import_module("popxl.ops.random_seed").split_random_seed is \
        ops.split_random_seed
    assert "tied_gather" in importlib.import_module("popxl.ops.gather").__all__


def test_top_level_modules():
    import popxl.tensorlocation as tl
    import popxl.testing
    import popxl.typing_

    assert tl.TensorStorage is popxl.TensorStorage and tl.TileSet is popxl.TileSet
    assert popxl.tensor.remote_variable is popxl.remote_variable
    assert popxl.tensor.TILE_SET_MAP[popxl.TileSet.IO] == "io"
    assert popxl.testing.get_all_int_dtypes(include_signed=False) == [
        popxl.uint8, popxl.uint16, popxl.uint32, popxl.uint64]
    alias = popxl.typing_.NewAliasAnnotation("MyRef", popxl.Tensor)
    assert alias.__name__ == "MyRef" and alias.__supertype__ is popxl.Tensor
    with pytest.raises(NotImplementedError, match="annotation only"):
        alias()


def test_random_seed_helpers():
    from popxl.random_seed import MAX_UINT64, two_uint32_to_uint64, uint64_to_two_uint32

    n = 0x0123456789ABCDEF
    pair = uint64_to_two_uint32(n)
    assert pair.dtype == np.uint32 and list(pair) == [0x01234567, 0x89ABCDEF]
    assert two_uint32_to_uint64(*pair) == n
    assert uint64_to_two_uint32(MAX_UINT64).tolist() == [2 ** 32 - 1] * 2
    with pytest.raises(ValueError):
        uint64_to_two_uint32(-1)
    seeds = popxl.create_seeds(7, replicas=3)
    assert [two_uint32_to_uint64(*s) for s in seeds] == list(
        np.random.default_rng(7).integers(0, 2 ** 64, size=3, dtype=np.uint64))


def test_utils_helpers():
    from popxl import utils

    assert utils.downcast_np_dtypes[np.dtype(np.int64)] == np.dtype(np.int32)
    assert utils.to_numpy([1.0, 2.0]).dtype == np.float32
    with pytest.raises(RuntimeError, match="only for float8"):
        utils.to_numpy([1.0], popxl.float32, log2_scale=2)
    text = utils.table_to_string([["idx", "name"], [0, "x"], [10, "weights"]])
    assert text.splitlines() == ["idx | name", "-------------", "0   | x", "10  | weights"]
    assert utils.table_to_string([[1, 2]], delimiter=",", header=False) == "1,2"
    assert utils._to_device_info("ipu_hw", 4).numIpus == 4
    assert utils._acquire_hw_device_with_timeout(2).isAttached
    ir = popxl.Ir()
    with ir.main_graph:
        c = popxl.constant(np.arange(3, dtype=np.float32))
        np.testing.assert_array_equal(utils._popxl_to_numpy(c), np.arange(3))
        with pytest.raises(TypeError, match="Constants and Variables"):
            utils._popxl_to_numpy(c + 1.0)


def test_ops_utils():
    from popxl.ops import utils as U

    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 3), np.float32), name="x")
        assert U.cast_if_needed(x, popxl.float32) is x
        assert U.cast_if_needed(x, popxl.float16).dtype == popxl.float16
        assert U.handle_negative_axis(x, -1) == 1
        with pytest.raises(ValueError, match="out of range"):
            U.handle_negative_axis(x, 2)
        U.check_in_graph(ir.main_graph, x, y=[x, x])
        g = ir.create_graph(lambda t: t + 1.0, x.spec)
        with pytest.raises(ValueError, match="^The input tensor `t` is not in the current Graph"):
            U.check_in_graph(g, t=x)
        U.check_tensor_ipu_and_tile_set(a=x, b=x)
        x0 = x + 0.0
        with popxl.ipu(1):
            y = x + 1.0
        U.check_tensor_ipu_and_tile_set(a=x, b=y)      # a variable matches any IPU
        with pytest.raises(ValueError, match=r"^The input tensors `a` and `b` are located on "
                                             r"different IPUs: 0 != 1\.$"):
            U.check_tensor_ipu_and_tile_set(a=x0, b=y)
        with popxl.io_tiles():
            z = x + 2.0
        with pytest.raises(ValueError, match=r"^The input tensors `a` and `b` are located on "
                                             r"different tile sets: compute != io\.$"):
            U.check_tensor_ipu_and_tile_set(a=x0, b=z)
    assert U.convert_optional_float(None) is None and U.convert_optional_float(2) == 2.0
    assert U.convert_optional_int64_list((1.0, 2)) == [1, 2]
    assert U.convert_optional_dtype(np.float16) == popxl.float16


def test_collective_op_names():
    from popart import CollectiveOperator
    from popxl.ops.collectives.collectives import OP_MAP, to_collective_op

    assert to_collective_op("add") == CollectiveOperator.Add
    assert OP_MAP["mul"] == CollectiveOperator.Mul        # upstream maps "mul" to Mean: a bug
    with pytest.raises(ValueError, match="^Not a valid op: 'sum'"):
        to_collective_op("sum")


def test_slice_reshape_histogram_helpers():
    from popxl.ops.histogram import check_increment
    from popxl.ops.remote_load import multiply_tuple
    from popxl.ops.reshape import reshape_handle_negative_axis
    from popxl.ops.slice import INT_MAX, INT_MIN, process_args

    assert (INT_MIN, INT_MAX) == (-2 ** 31, 2 ** 31 - 1)
    assert process_args(1, None, -1) == ([1], [INT_MIN], [-1], [0])
    assert process_args([0, 1], [2, 3], axis=[1, 0]) == ([0, 1], [2, 3], [1, 1], [1, 0])
    with pytest.raises(ValueError, match="same length"):
        process_args([0, 1], [2])
    assert multiply_tuple((2, 3, 4)) == 24
    check_increment([0.0, 1.0])
    with pytest.raises(ValueError, match="is not a monotonically increasing list"):
        check_increment([1.0, 1.0])
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 6), np.float32))
        assert reshape_handle_negative_axis(x, (3, -1)) == (3, 4)


def test_nll_scatter_conv_pool_constants():
    import popart
    from popart._internal._types import ScatterReduction
    from popxl.ops.conv import multi_conv_options
    from popxl.ops.negative_log_likelihood import REDUCTION_MAP
    from popxl.ops.pool import receptive_attributes
    from popxl.ops.print_tensor import FLOAT_FORMAT_MAP
    from popxl.ops.scatter_reduce import reduction_dict

    assert REDUCTION_MAP["none"] == popart.ReductionType.NoReduction
    assert reduction_dict["none"] == ScatterReduction.None_
    assert FLOAT_FORMAT_MAP["fixed"].name == "Fixed"
    opts = multi_conv_options(popart.SessionOptions(), {"x": 1}, 0.5, "half", True)
    assert opts["availableMemoryProportions"] == [0.5] and opts["partialsTypes"] == ["half"]
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        multi_conv_options(popart.SessionOptions(), None, 1.5, None, None)
    ra = receptive_attributes([2, 2], None, None, [1, 1], None, "not_set", True)
    assert ra.strides == (2, 2) and ra.pads == () and ra.ceil_mode == 1


def test_conv_checks_its_tuning_options():
    x = np.ones((1, 1, 3, 3), np.float32)
    w = np.ones((1, 1, 2, 2), np.float32)
    out, = run_ops(lambda a, b: ops.conv(a, b, available_memory_proportions=[0.3],
                                         partials_types=["float"]), x, w)
    np.testing.assert_array_equal(out, np.full((1, 1, 2, 2), 4.0))
    with pytest.raises(ValueError, match="partials_types"):
        run_ops(lambda a, b: ops.conv(a, b, partials_types=["double"]), x, w)


def test_var_updates_helpers():
    import popart
    from popxl.ops.var_updates.adam_updater import create_adamupdater, weight_decay_is_required
    from popxl.ops.var_updates.utils import handle_optimizer_value

    assert not weight_decay_is_required(None) and not weight_decay_is_required(0.0)
    assert weight_decay_is_required(0.1)
    ins = {}
    assert handle_optimizer_value(0.5, ins, 3) == popart.OptimizerValue(0.5, True) and ins == {}
    m = np.full(3, 0.1, np.float32)
    v = np.full(3, 0.04, np.float32)
    out, = run_ops(lambda a, b: create_adamupdater(a, b, {1: a.id, 2: b.id}, "AdamNoBias",
                                                   epsilon=0.0), m, v)
    np.testing.assert_allclose(out, m / np.sqrt(v), rtol=1e-6)
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(m)
        b = popxl.variable(v)
        step = popxl.variable(np.float32(0))
        assert handle_optimizer_value(step, ins, 4) == popart.OptimizerValue(0.0, False)
        assert ins == {4: step.id}
        with pytest.raises(ValueError, match="no bias correction"):
            create_adamupdater(a, b, {}, "LambNoBias", time_step=step, beta1=0.9, beta2=0.9)
        with pytest.raises(ValueError, match=r"ins\[1\]"):
            create_adamupdater(a, b, {1: b.id}, "Adam")
        with pytest.raises(ValueError, match="unknown mode"):
            create_adamupdater(a, b, {}, "SGD")


def test_conditional_site_info_maps_both_branches():
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((2,), popxl.float32)
        then_g = ir.create_graph(lambda a, b: a + b, spec, spec)
        else_g = ir.create_graph(lambda c: c * 2.0, spec)
        x = popxl.variable(np.ones(2, np.float32), name="x")
        y = popxl.variable(np.full(2, 3.0, np.float32), name="y")
        cond = popxl.constant(True)
        info = ops.conditional_with_info(cond, then_g, else_g, [x, y], [y])
        with pytest.raises(ValueError, match="^`then_branch` graph and `else_branch` graph must "
                                             "have the same number of outputs: 1 != 2"):
            ops.conditional(cond, then_g, ir.create_graph(lambda c: (c, c), spec), [x, y], [y])
        result, = ops.conditional(cond, then_g, else_g, [x, y], [y])
    assert info.called_graph == (then_g, else_g)
    # as upstream: the condition, then the then-branch inputs, then the else-branch inputs
    # (y feeds both branches and is connected twice)
    assert [t.id for t in info.inputs] == [cond.id, "x", "y", "y"]
    assert info.graph_to_parent_input_index(1, then_branch=True) == 2
    assert info.graph_to_parent_input_index(0, then_branch=False) == 3
    assert info.parent_to_graph_input_index(1) == 0 and info.parent_to_graph_input_index(3) == 0
    assert info.is_parent_index_in_then_branch(1)
    assert not info.is_parent_index_in_then_branch(3)
    assert info.graph_to_parent(else_g.inputs[0]) is y
    assert info.parent_to_graph(y) is then_g.inputs[1]
    assert info.graph_to_parent_output_index(0) == info.parent_to_graph_output_index(0) == 0
    assert info.graph_to_parent(then_g.outputs[0]) is info.outputs[0]
    with pytest.raises(NotImplementedError):
        info.set_parent_input_modified(x)
    with pytest.raises(IndexError, match="^Invalid parent graph input index"):
        info.parent_to_graph_input_index(0)
    with pytest.raises(IndexError, match="^Invalid parent graph input index"):
        info.is_parent_index_in_then_branch(4)
    with pytest.raises(IndexError, match="^Invalid graph input index"):
        info.graph_to_parent_input_index(1, then_branch=False)
    with pytest.raises(IndexError, match="^Invalid graph input index"):
        info.graph_to_parent_output_index(1)
    with pytest.raises(ValueError, match="^Tensor x is not an input or output of the called "
                                         "graph"):
        info.graph_to_parent(x)
    with pytest.raises(ValueError, match="^Tensor t is not a parent graph input of the call "
                                         "site"):
        info.parent_to_graph(cond)
    with ir.main_graph:
        out = popxl.d2h_stream(result.shape, result.dtype)
        ops.host_store(out, result)
    with popxl.Session(ir, "ipu_hw") as sess:
        np.testing.assert_array_equal(sess.run()[out], [4.0, 4.0])     # x + y


def test_context_members():
    ctx = popxl.context.get_current_context()
    ir = popxl.Ir()
    with ir.main_graph:
        assert ctx.ir is ir and ctx.main_graph is ir.main_graph and not ctx.io_tile_set
        with popxl.io_tiles():
            assert ctx.io_tile_set
        ctx.push_name_scope("a")
        x = popxl.variable(np.ones(2, np.float32), name="x")
        ctx.pop_name_scope()
        assert x.name == "a/x"
        with popxl.in_sequence():
            assert ctx.in_sequence is True
            with popxl.in_sequence("pass"):
                assert ctx.in_sequence is True
        assert ctx.in_sequence is None
        loc = popxl.context.get_source_location(0)
        assert loc.function_name == "test_context_members" and loc.file_name == __file__
        assert ir.main_graph._create_tensor_id("x") != x.id
    with pytest.raises(TypeError, match="^`None` cannot be passed to `in_sequence`. Try `False` "
                                        "instead."):
        with popxl.in_sequence(None):
            pass
    with pytest.raises(ValueError, match="^`in_sequence` mode not understood: yes"):
        with popxl.in_sequence("yes"):
            pass


def test_read_only_memmap_variable_is_flagged(tmp_path):
    path = tmp_path / "w.npy"
    np.save(path, np.arange(4, dtype=np.float32))
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(np.load(path, mmap_mode="r+"))
        assert not ir._has_read_only_memmap
        popxl.variable(np.load(path, mmap_mode="r"))
        assert ir._has_read_only_memmap
    assert not popxl.Session(ir, "ipu_hw").weights_to_host_on_exit
