"""route_tensor: is_subgraph, called_graph_paths, route_tensor_into_graph through calls and
repeats (every path, reuse of existing connections, by-reference routing)."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.route_tensor import called_graph_paths


def _nested(ir, repeats: int = 3):
    """main --repeat(3)--> outer --call--> inner(acc: by ref); returns (outer, inner)."""
    inner = ir.create_empty_graph("inner")
    with inner:
        popxl.graph_input((2,), popxl.float32, "acc", by_ref=True)
    outer = ir.create_empty_graph("outer")
    with outer:
        acc = popxl.graph_input((2,), popxl.float32, "acc", by_ref=True)
        ops.call(inner, acc)
    return outer, inner


def test_is_subgraph_and_paths():
    ir = popxl.Ir()
    with ir.main_graph:
        acc = popxl.variable(np.zeros(2, np.float32), name="acc")
        outer, inner = _nested(ir)
        ops.repeat(outer, 3, acc)
    main = ir.main_graph
    assert addons.is_subgraph(main, inner) and addons.is_subgraph(main, outer)
    assert addons.is_subgraph(outer, inner)
    assert not addons.is_subgraph(inner, outer) and not addons.is_subgraph(inner, main)
    paths = called_graph_paths(main, inner)
    # main -Loop-> loop wrapper -Call-> outer -Call-> inner
    assert [[op.type for op in p] for p in paths] == [["Loop", "Call", "Call"]]


@pytest.mark.parametrize("modified", [False, True])
def test_route_variable_through_repeat_and_call(modified):
    ir = popxl.Ir()
    with ir.main_graph:
        acc = popxl.variable(np.zeros(2, np.float32), name="acc")
        w = popxl.variable(np.array([1.5, -2.0], np.float32), name="w")
        counter = popxl.variable(np.array([0.0], np.float32), name="counter")
        outer, inner = _nested(ir)
        ops.repeat(outer, 3, acc)
    n_inputs = len(inner.inputs)
    with inner:
        w_in = addons.route_tensor_into_graph(w)
        c_in = addons.route_tensor_into_graph(counter, modified=modified)
        acc_in = inner.inputs[0]
        ops.var_updates.accumulate_(acc_in, w_in * c_in)
        ops.var_updates.accumulate_(c_in, popxl.constant(np.array([1.0], np.float32)))
    assert w_in in inner and len(inner.inputs) == n_inputs + 2
    # Routing again reuses the connections made the first time.
    assert addons.route_tensor_into_graph(w, inner) == w_in
    assert len(inner.inputs) == n_inputs + 2
    assert addons.route_tensor_into_graph(w, ir.main_graph) is w
    with popxl.Session(ir, "ipu_hw") as s:
        s.run()
        data = s.get_tensors_data([acc, counter])
    w0 = np.array([1.5, -2.0], np.float32)
    if modified:   # the counter's updates persist: 0, 1, 2 across the three iterations
        np.testing.assert_array_equal(data[acc], w0 * 0 + w0 * 1 + w0 * 2)
        np.testing.assert_array_equal(data[counter], [3.0])
    else:          # every call sees the original counter and its update is dropped
        np.testing.assert_array_equal(data[acc], w0 * 0 * 3)
        np.testing.assert_array_equal(data[counter], [0.0])


def test_route_reaches_every_call_site():
    """A graph called twice from main: both sites get the routed input."""
    ir = popxl.Ir()
    with ir.main_graph:
        acc = popxl.variable(np.zeros(2, np.float32), name="acc")
        w = popxl.variable(np.array([1.0, 2.0], np.float32), name="w")
        outer, inner = _nested(ir)
        ops.call(outer, acc)
        ops.call(inner, acc)
    with inner:
        ops.var_updates.accumulate_(inner.inputs[0], addons.route_tensor_into_graph(w))
    sites = [op for op in ir.main_graph._data.ops if op.type == "Call"]
    assert all(w.id in op.inputs for op in sites)
    with popxl.Session(ir, "ipu_hw") as s:
        s.run()
        np.testing.assert_array_equal(s.get_tensor_data(acc), [2.0, 4.0])


def test_unreachable_tensor_raises():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros(2, np.float32), name="w")
        outer, inner = _nested(ir)   # never called from main
    with pytest.raises(ValueError, match="is not in the graph .* is not in a known parent graph"):
        addons.route_tensor_into_graph(w, inner)
    with inner:
        local = inner.inputs[0] + 1.0
    with pytest.raises(ValueError, match="is not in the graph"):
        addons.route_tensor_into_graph(local, ir.main_graph)
    with pytest.raises(TypeError, match="popxl.Tensor"):
        addons.route_tensor_into_graph(np.zeros(2), inner)
