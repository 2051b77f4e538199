"""Tensor placement as upstream derives it (`ipu`, `tile_set`: from the producer, the call
site, the first consumer; UndefinedValue when nothing places a tensor), Graph.tensors with the
host streams' tensors."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.errors import UndefinedValue


def test_a_tensor_nothing_places_has_no_ipu_or_tile_set():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32), name="v")
        with pytest.raises(UndefinedValue, match="^Tensor's IPU is undefined.$"):
            v.ipu
        with pytest.raises(UndefinedValue, match="^Tensor's tile set is undefined.$"):
            v.tile_set
        assert v._get_ipu_and_tile_set(False, False) == (-1, "undefined")


def test_placement_comes_from_producer_consumer_and_call_site():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32), name="a")
        b = popxl.variable(np.ones(2, np.float32), name="b")
        c = popxl.variable(np.ones(2, np.float32), name="c")
        assert (a + 0.0).ipu == 0 and (a + 0.0).tile_set == "compute"
        assert a.ipu == 0                                  # its first consumer's
        with popxl.ipu(1):
            y = b * 2.0
            with popxl.io_tiles():
                z = c - 1.0
        assert (y.ipu, b.ipu) == (1, 1) and (z.tile_set, c.tile_set) == ("io", "io")
        moved = y.copy_to_ipu(3)
        assert moved.ipu == 3 and y.ipu == 1               # an IPU copy: destination, source
        d = popxl.variable(np.ones(2, np.float32), name="d")
        ops.ipu_copy(d, 2, source=5)
        assert d.ipu == 5                                  # consumed by a copy: its source
        g = ir.create_graph(lambda t: t + 1.0, a.spec)
        assert g.inputs[0].ipu == 0                        # no call site yet: its consumer's
        with popxl.ipu(2):
            ops.call(g, a)
        assert g.inputs[0].ipu == 2                        # from its call site


def test_binary_builders_refuse_inputs_on_different_ipus_or_tile_sets():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(2, np.float32), name="v")
        a = v + 0.0
        with popxl.ipu(1):
            b = v + 0.0
        with popxl.io_tiles():
            c = v + 0.0
        with pytest.raises(ValueError, match=r"^The input tensors `lhs` and `rhs` are located on "
                                             r"different IPUs: 0 != 1\.$"):
            a + b
        with pytest.raises(ValueError, match=r"^The input tensors `lhs` and `rhs` are located on "
                                             r"different tile sets: compute != io\.$"):
            ops.add_(a, c)
        v * b                                              # a variable matches any IPU


def test_graph_tensors_include_the_host_streams():
    ir = popxl.Ir()
    g = ir.main_graph
    with g:
        s = popxl.h2d_stream((2,), popxl.float32, "x")
        x = ops.host_load(s, "x")
        out = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(out, x)
    ids = {t.id for t in g.tensors}
    assert {s.tensor_id, out.tensor_id, x.id} <= ids
    assert len(g.tensors) == 4                             # x, y streams; init; host_load out
