"""remote_code_load (a no-op that checks its arguments) and code_copy (always raises). The remote
buffer ops are tested with the buffers in tests/popxl_dist/test_remote_buffer.py."""
import re

import numpy as np
import pytest

import popxl
import popxl.ops as ops
from popxl.ops import remote


def test_remote_code_load_is_a_no_op_and_checks_args():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda t: t + 1.0, popxl.TensorSpec((2,), popxl.float32))
        ops.remote_code_load(g, "executable")
        assert ir.main_graph._data.ops[-1].type == "RemoteCodeLoad"
        x = popxl.variable(np.zeros(2), popxl.float32, "x")
        y, = ops.call(g, x)
        with pytest.raises(NotImplementedError, match="destination"):
            ops.remote_code_load(g, "io_buffer")
        with pytest.raises(ValueError, match="^Not a valid location: "):
            ops.remote_code_load(g, "buffer")
        with pytest.raises(TypeError, match="popxl.Graph"):
            ops.remote_code_load("g", "executable")
    with g:
        with pytest.raises(ValueError, match="cannot load the code for the graph it resides in"):
            ops.remote_code_load(g, "executable")
    with pytest.raises(NotImplementedError):
        remote.code_copy(g, "executable", "io_buffer")
    assert "code_copy" not in ops.__all__
    with popxl.Session(ir, "ipu_hw") as s:
        s.run()


def test_remote_code_load_refuses_its_own_graph_with_upstreams_wording():
    ir = popxl.Ir()
    g = ir.create_graph(lambda x: x + 1.0, popxl.TensorSpec((2,), popxl.float32))
    with g, pytest.raises(ValueError, match=rf"^The remote_code_load op cannot load the code for "
                                            rf"the graph it resides in \({re.escape(g.id)}\)\.$"):
        ops.remote_code_load(g, "executable")
    with ir.main_graph, pytest.raises(ValueError, match=r"resides in \(the main graph\)\.$"):
        ops.remote_code_load(ir.main_graph, "executable")
