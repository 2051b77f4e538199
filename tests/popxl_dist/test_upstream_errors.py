"""Error cases whose upstream messages the references quote: our messages start with upstream's
wording (programs and their tests match on it) and keep our detail after it."""
import numpy as np
import pytest

import popart
import popxl
import popxl.ops as ops
import popxl_addons as addons


def test_detached_session():
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(1.0)
    with pytest.raises(ValueError, match=r"^Must be attached to device before calling a "
                                         r"runtime function"):
        popxl.Session(ir, "ipu_hw").run()


def test_tensor_not_in_current_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones(2, np.float32), name="w")
        with pytest.raises(ValueError, match=r"^The input tensor `w` is not in the current "
                                             r"Graph .* \(add\)"):
            ir.create_graph(lambda x: x + w, w.spec)


def test_autodiff_modifying_op_quotes_the_op_debug_name():
    ir = popxl.Ir()
    with ir.main_graph:
        def fn(x):
            return ops.relu_(x)
        g = ir.create_graph(fn, popxl.TensorSpec((2,), popxl.float32))
    op = g._pb_graph.getOps()[0]
    with pytest.raises(popart.popart_exception) as info:
        popxl.transforms.autodiff(g)
    assert str(info.value).startswith(
        f"The graph {g.id} contains a modifying op: {op.debugName()}. Autodiff cannot be used on "
        f"graphs with inplace modifying ops.")


def test_incompatible_meta_shapes():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        a, sa = popxl.replica_sharded_variable(np.ones((2, 2), np.float32))
        b, sb = popxl.replica_sharded_variable(np.ones((4,), np.float32))
        with pytest.raises(ValueError, match="^Incompatible meta shapes"):
            sa + sb


def test_addons_module_and_dot_tree_messages():
    class G(addons.Module):
        def build(self, x):
            return x

        def build_grad(self, dy):
            return dy

    with pytest.raises(ValueError, match=r"^You cannot use graph caching if you have "
                                         r"implemented `build_grad`\."):
        G(cache=True)
    with pytest.raises(ValueError, match=r"^grad_inlining_error should be one of 'error', "
                                         r"'warning', 'none'\. Not: loud"):
        G(grad_inlining_error="loud")
    with pytest.raises(Exception, match=r"^You can only get items within the `build_graph` "
                                        r"method which must be called via `create_grad_graph` "
                                        r"or `autodiff`\."):
        G().aux["k"]
    t = addons.NamedTensors()
    with pytest.raises(ValueError, match="^Numerical key cannot be negative"):
        t.insert(-1, 1)
    t.insert("a", 1)
    with pytest.raises(KeyError, match="Key does not exist: b. Available keys: "):
        t.get("b")
    with pytest.raises(AttributeError, match="^No attribute 'b'. Available Keys:\na"):
        t.b


def test_addons_variable_factory_and_graph_messages():
    ir = popxl.Ir()
    with ir.main_graph:
        def broken():
            raise RuntimeError("no data")

        with pytest.raises(ValueError, match=r"^Passed callable via `data_iter` throws error\."):
            addons.VariableFactory(broken)
        with pytest.raises(ValueError, match=r"^`data_iter` must be an iterable or callable\."):
            addons.VariableFactory(object())
        g = addons.GraphWithNamedArgs(ir.create_graph(lambda x: x * 2.0,
                                                      popxl.TensorSpec((2,), popxl.float32)))
        with pytest.raises(AttributeError, match=r"^`grad_graph_info` attribute does not exist\. "
                                                 r"Not a gradient graph\."):
            g.grad_graph_info
        g.autodiff()
        with pytest.raises(Exception, match=r"^Autodiff has already been applied to the graph, "
                                            r"as autodiff modifies the forward graph in-place"):
            g.autodiff()
        spec = popxl.TensorSpec((3,), popxl.float32)
        with pytest.raises(ValueError, match=r"^Can't shard tensor with 3 elements over 2 "
                                             r"replicas"):
            addons.create_remote_buffer(spec, shard_over=2)
