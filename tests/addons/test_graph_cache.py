"""GraphCache / Module(cache=True): the same graph for equal specs and arguments."""
from functools import partial

import numpy as np
import pytest

import popxl
import popxl_addons as addons


class Scale(addons.Module):
    def build(self, x: popxl.Tensor, factor: float = 2.0):
        w = self.add_variable_input("w", partial(np.ones, x.shape), x.dtype)
        return x * w * factor


def test_module_cache_reuses_graph_and_factories():
    ir = popxl.Ir()
    with ir.main_graph:
        m = Scale(cache=True)
        f1, g1 = m.create_graph(popxl.TensorSpec((2,), popxl.float32))
        f2, g2 = m.create_graph(popxl.TensorSpec((2,), popxl.float32))
        f3, g3 = m.create_graph(popxl.TensorSpec((3,), popxl.float32))
        f4, g4 = m.create_graph(popxl.TensorSpec((2,), popxl.float32), factor=3.0)
        f5, g5 = m.create_graph(popxl.variable(np.zeros(2, np.float32)))
        assert g1.graph is g2.graph and g1.graph is g5.graph
        assert g3.graph is not g1.graph and g4.graph is not g1.graph
        assert list(f2.to_dict()) == ["w"] and f2.w is f1.w
        assert g2.args.w == g1.args.w
        assert len(ir._pb_ir.getAllGraphs()) == 4   # main + 3 distinct graphs
        # without caching every create_graph builds a new graph
        m2 = Scale()
        assert m2.create_graph(popxl.TensorSpec((2,), popxl.float32))[1].graph is not \
            m2.create_graph(popxl.TensorSpec((2,), popxl.float32))[1].graph


def test_graph_cache_and_function_decorator():
    ir = popxl.Ir()
    cache = addons.GraphCache()

    def fn(x, y):
        return x + y

    with ir.main_graph:
        a = popxl.variable(np.ones(3, np.float32))
        g1 = cache.create_graph(fn, a.spec, a.spec)
        g2 = cache.create_graph(fn, a, a)
        assert g1 is g2
        other_ir = popxl.Ir()
    with other_ir.main_graph:
        b = popxl.variable(np.ones(3, np.float32))
        assert cache.create_graph(fn, b.spec, b.spec).ir is other_ir

    @addons.function
    def double(x):
        return x + x

    ir3 = popxl.Ir()
    with ir3.main_graph:
        x = popxl.variable(np.arange(3, dtype=np.float32))
        y = double(x)
        z = double(y)
        st = addons.host_store(z)
        calls = [op for op in ir3.main_graph._pb_graph.getOps() if op.opType() == "Call"]
        assert len(calls) == 2 and calls[0].getCalledGraph() == calls[1].getCalledGraph()
    with popxl.Session(ir3, "ipu_hw") as s:
        np.testing.assert_allclose(s.run()[st], 4 * np.arange(3))


def test_cache_rejects_build_grad_and_unhashable():
    class WithGrad(addons.Module):
        def build(self, x):
            return x

        def build_grad(self, dy):
            return dy

    with pytest.raises(ValueError, match="graph caching"):
        WithGrad(cache=True)
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(TypeError, match="not hashable"):
        Scale(cache=True).create_graph(popxl.TensorSpec((2,), popxl.float32), factor=[np.ones(2)])


def test_modules_that_hash_alike_share_a_graph_as_upstream():
    """The cache identifies the function by its hash (upstream's get_function_hash): two
    instances of a Module whose __hash__ is its configuration share one graph."""
    class Layer(addons.Module):
        def __init__(self, config: int):
            super().__init__()
            self.config = config

        def build(self, x, y):
            return x + y

        def __hash__(self):
            return hash(self.config)

    ir = popxl.Ir()
    cache = addons.GraphCache()
    with ir.main_graph:
        x = popxl.variable(1, name="x")
        y = popxl.variable(2, name="y")
        g0 = cache.create_graph(Layer(0), x, y)
        assert cache.create_graph(Layer(0), x, y) is g0
        assert cache.create_graph(Layer(1), x, y) is not g0
