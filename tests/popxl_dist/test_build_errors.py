"""Builders catch bad programs at build time, with messages naming tensors, shapes and dtypes."""
import numpy as np
import popart
import pytest

import popxl
import popxl.ops as ops


def test_ops_outside_any_graph():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32))
    with pytest.raises(RuntimeError, match="no graph has been selected"):
        ops.add(a, a)


def test_tensor_from_another_graph_must_be_passed_in():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((2, 2), np.float32), name="w")

        def fn(x):
            return x @ w

        with pytest.raises(ValueError, match=r"The input tensor `w` is not in the current Graph "
                                             r"'.*fn_subgraph\(0\)' \(matmul\)"):
            ir.create_graph(fn, popxl.TensorSpec((2, 2), popxl.float32))


def test_matmul_shape_mismatch_at_build_time():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 3), np.float32), name="a")
        b = popxl.variable(np.ones((4, 5), np.float32), name="b")
        with pytest.raises(popart.popart_exception,
                           match=r"^MatMul contracting dimensions unequal: lhs 'a' \[2, 3\], "
                                 r"rhs 'b' \[4, 5\]"):
            a @ b


def test_broadcast_and_dtype_mismatch():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 3), np.float32), name="a")
        b = popxl.variable(np.ones((4,), np.float32), name="b")
        c = popxl.variable(np.ones((2, 3), np.int32), name="c")
        with pytest.raises(ValueError, match=r"add: shapes cannot be broadcast together: 'a' \(2, 3\), 'b' \(4,\)"):
            a + b
        with pytest.raises(TypeError, match="same dtype, got 'a' float32, 'c' int32"):
            ops.add(a, c)


def test_variable_only_in_main_graph():
    ir = popxl.Ir()
    g = ir.create_empty_graph("sub")
    with g:
        with pytest.raises(ValueError, match="only be created in the main graph"):
            popxl.variable(np.ones(2))


def test_graph_and_tensor_naming_and_reprs():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 4), np.float32), name="x")
        with popxl.name_scope("layer"):
            y = x + 1.0
        v2 = popxl.variable(np.ones(3, np.float32), name="x")
    assert repr(x) == "Tensor[x popxl.dtypes.float32 (2, 4)]"
    assert y.name == "layer/add_out"
    assert v2.name.startswith("x__t")

    class Lin(popxl.Module):
        def build(self, x):
            return x * 2.0

    g = ir.create_graph(Lin(), x)
    g2 = ir.create_graph(Lin(), x)
    prefix = "test_graph_and_tensor_naming_and_reprs.Lin"  # qualname without ".<locals>"
    assert (g.id, g2.id) == (f"{prefix}_subgraph(0)", f"{prefix}_subgraph(1)")
    assert g.inputs[0].id == f"{prefix}_subgraph(0)/x"
    assert g.inputs[0].name == "x"
    assert repr(popxl.float16) == "popxl.dtypes.float16"
    assert popxl.dtype.as_dtype(np.int32) is popxl.int32


def test_float8_inputs_are_refused_by_computing_ops():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2), popxl.float8_143, "x")
        with pytest.raises(TypeError, match="add: float8 inputs are not supported"):
            ops.add(x, x)
        with pytest.raises(TypeError, match="matmul_pow2scaled"):
            ops.matmul(x, x)
        assert ops.reshape(x, (1, 2)).dtype == popxl.float8_143


def test_create_graph_keyword_after_a_defaulted_parameter():
    """`gelu=True` given while `bias` keeps its default must reach `gelu`, not `bias`."""
    seen = {}

    def build(x, out_features, bias=True, gelu=False):
        seen.update(out_features=out_features, bias=bias, gelu=gelu)
        return ops.gelu(x) if gelu else x

    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(build, popxl.TensorSpec((2,), popxl.float32), out_features=3,
                            gelu=True)
    assert seen == {"out_features": 3, "bias": True, "gelu": True}
    assert [op.type for op in g._data.ops] == ["Gelu"]


def test_build_location_names_the_user_line_whatever_the_package_folders_are_called(tmp_path):
    """An op records where the program built it, also when popxl and popxl_addons are imported
    from folders named differently from the source tree (an installed wheel's `popxl/`, or
    symlinks as a test harness makes), and not from inside popxl_addons."""
    import os
    import subprocess
    import sys

    import popxl_addons

    links = tmp_path / "links"
    links.mkdir()
    os.symlink(os.path.dirname(popxl.__file__), links / "popxl")
    os.symlink(os.path.dirname(popxl_addons.__file__), links / "popxl_addons")
    script = tmp_path / "prog.py"
    script.write_text(
        "import numpy as np\n"
        "import popxl\n"
        "from popxl_addons.layers import Linear\n"
        "ir = popxl.Ir()\n"
        "with ir.main_graph:\n"
        "    x = popxl.variable(np.ones(3, np.float32))\n"
        "    y = x + 1\n"
        "    facts, g = Linear(2).create_graph(popxl.TensorSpec((1, 3), popxl.float32))\n"
        "assert popxl.__file__.startswith(%r), popxl.__file__\n"
        "print([op.debug for op in ir.main_graph._data.ops][-1])\n"
        "print(sorted({op.debug.rsplit(':', 1)[0] for op in g.graph._data.ops}))\n"
        % str(links))
    env = dict(os.environ, PYTHONPATH=str(links))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = proc.stdout.splitlines()
    assert first == f"{script}:7"
    assert second == f"[{str(script)!r}]"


def test_create_graph_refuses_varargs_that_mix_tensors_and_other_values():
    """As upstream: *args / **kwargs (like list arguments) hold Tensors only or none."""
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.float32(1), name="v")
        for args in ((v, 5), (5, v)):
            with pytest.raises(TypeError, match="argument can't contain a mixture of Tensors "
                                                "and other types. Arg name: _"):
                ir.create_graph(lambda *_: None, *args)
        with pytest.raises(TypeError, match="mixture of Tensors and other types. Arg name: kw"):
            ir.create_graph(lambda **kw: None, a=v, b=5)
        ir.create_graph(lambda *_: None, 5, 6)               # no tensors: fine
        ir.create_graph(lambda *ts: ts[0] + ts[1], v, v)
