"""popxl_addons names programs reach for: graph_cache hashes, graph_common normalisation,
WeightsDict, create_grad_graph_info, add_recompute_inputs, Module members, DotTree.len, streams
and utils helpers."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl.transforms import ExpectedConnectionType
from popxl_addons import graph_common
from popxl_addons.graph_cache import argument_hash, bound_arguments, get_function_hash, tensor_hash
from popxl_addons.utils import WeightsDict, overrides


def test_graph_cache_hashes():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 3), np.float32))
        b = popxl.variable(np.zeros((2, 3), np.float32))
        c = popxl.variable(np.zeros((3, 2), np.float32))

        def fn(x, scale=2.0):
            return x * scale

        assert tensor_hash(a) == tensor_hash(b) == tensor_hash(a.spec) != tensor_hash(c)
        assert argument_hash(a) == argument_hash(b) and argument_hash(3) == argument_hash(3)
        assert get_function_hash(fn, a) == get_function_hash(fn, b, 2.0)
        assert get_function_hash(fn, a) != get_function_hash(fn, a, 3.0)
        assert get_function_hash(fn, a) != get_function_hash(fn, c)
        on_ipu0 = get_function_hash(fn, a)
        with popxl.ipu(1):
            assert get_function_hash(fn, b) != on_ipu0
        assert dict(bound_arguments(fn, a).arguments) == {"x": a, "scale": 2.0}
        with pytest.raises(TypeError, match="not hashable"):
            argument_hash([{1}])


def test_graph_common_normalises_graph_likes():
    from popxl_addons.layers import Linear

    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 4), np.float32))
        facts, graph = Linear(3).create_graph(x)
        grad = addons.autodiff(graph)
        bound = graph.bind(facts.init())
    g, info = graph_common._normalise_called_graphs_grad_info(graph, grad)
    assert g is graph.graph and info is grad.grad_graph_info
    d = graph_common._normalise_called_graphs_grad_info_dict({bound: grad})
    assert d == {graph.graph: grad.grad_graph_info}
    assert graph_common._normalise_called_graphs_grad_info_dict() == {}
    with pytest.raises(TypeError, match="GradGraphInfo or GraphWithNamedArgs"):
        graph_common._normalise_called_graphs_grad_info(graph, 3)


def test_weights_dict_checks_also_at_construction():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros((2, 2), np.float32), name="w")
    wd = WeightsDict({w: np.ones((2, 2), np.float32)})
    assert list(wd) == [w] and wd.dict[w].sum() == 4 and len(wd) == 1
    with pytest.raises(ValueError, match="dtype float32, the data has dtype float64"):
        WeightsDict({w: np.ones((2, 2))})
    with pytest.raises(ValueError, match="host shape"):
        WeightsDict(((w, np.ones(3, np.float32)),))
    del wd[w]
    assert len(wd) == 0


def test_create_grad_graph_info_and_add_recompute_inputs():
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((2,), popxl.float32)
        fwd = ir.create_graph(lambda x: ops.gelu(x), spec)
        grad = ir.create_graph(lambda dy, x: dy * x, spec, spec)
    dy, xin = grad.inputs
    info = addons.create_grad_graph_info(ir, fwd, grad, {dy: fwd.outputs[0]},
                                         {grad.outputs[0]: fwd.inputs[0]}, {xin: fwd.inputs[0]})
    assert [e.connection_type for e in info.expected_inputs] == [
        ExpectedConnectionType.FwdGrad, ExpectedConnectionType.Fwd]
    assert info.expected_outputs[0].fwd_tensor is fwd.inputs[0]
    with ir.create_empty_graph("recomp") as recomp:
        fwd_map, grad_map, conns = addons.add_recompute_inputs(info)
    assert [(e.fwd_tensor, e.connection_type) for e in conns] == [
        (fwd.outputs[0], ExpectedConnectionType.FwdGrad),
        (fwd.inputs[0], ExpectedConnectionType.Fwd)]
    assert list(grad_map) == [dy] and list(fwd_map) == [fwd.inputs[0]]
    assert list(recomp.inputs) == [grad_map[dy], fwd_map[fwd.inputs[0]]]
    with pytest.raises(ValueError, match="in neither"):
        addons.create_grad_graph_info(ir, fwd, grad, {dy: fwd.outputs[0]},
                                      {grad.outputs[0]: fwd.inputs[0]}, {})


def test_module_members():
    class Plain(addons.Module):
        def build(self, x):
            return x

    class WithGrad(addons.Module):
        def build(self, x):
            return x

        def build_grad(self, dy):
            return dy

    assert not Plain().implements_grad_graph and WithGrad().implements_grad_graph
    m = Plain()
    assert m.grad_inlining_error == "error" and m.var_grad is not None
    assert m.called_graphs_grad_info == {} and m._graph_cache is None
    assert "_Aux({})" == repr(m.aux)
    m.set_name_scope("blk")
    ir = popxl.Ir()
    with ir.main_graph:
        class Scaled(addons.Module):
            def build(self, x):
                return x * 2.0
        s = Scaled()
        s.set_name_scope("scaled")
        x = popxl.variable(np.ones(2, np.float32), name="x")
        y = s(x)
    assert y.name.startswith("scaled/")
    assert overrides(WithGrad, addons.Module, "build_grad")
    assert not overrides(Plain, addons.Module, "build_grad")


def test_dot_tree_len_and_mapping_names():
    t = addons.NamedTensors.from_dict({"a.b": 1, "a.c": 2, "d": 3})
    assert t.len() == 2 and t.len_flat() == 3
    u = addons.NamedTensors.from_dict({"a.b": "x", "d": "y"})
    assert addons.to_mapping(key=t, value=u) == {1: "x", 3: "y"}
    assert t.to_mapping(values=u) == {1: "x", 3: "y"}
    t.update(values=addons.NamedTensors.from_dict({"e": 4}))
    assert t.e == 4


def test_streams_and_host_load():
    ir = popxl.Ir()
    with ir.main_graph:
        ins = addons.InputStreams(x=((2,), popxl.float32))
        assert addons.InputStreams.stream_init is popxl.h2d_stream
        assert addons.OutputStreams.stream_init is popxl.d2h_stream
        assert isinstance(ins.x, popxl.HostToDeviceStream)
        arr, stream, t = addons.host_load(np.zeros((3,), np.float64), popxl.float32, "v")
        assert arr.dtype == np.float32 and stream.tensor_id == "v_stream" and t.shape == (3,)
        with pytest.raises(TypeError):
            addons.host_load(np.zeros(3))                  # dtype and name are required
