"""popxl.custom_ops: an application's C++ op registered through the public API and built by the
application's own wrapper (`createOpInGraph`), forward and backward against NumPy, in process and
on MPI ranks; ops built directly with `create`; the errors of bad definitions and of bindings
nobody registered."""
from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import popxl
from cppapp_files import reference, write_app
from harness import grads, run_ops
from popxl.custom_ops import CustomOp, UnknownBindingError, register, sources_digest
from popxl.custom_ops.op import CustomOpRef

HAVE_MPI = (importlib.util.find_spec("mpi4py") is not None
            and os.path.exists(os.path.join(os.path.dirname(sys.executable), "mpiexec")))


@pytest.fixture
def app_path(tmp_path, request):
    """A folder on sys.path for an application; its modules are forgotten afterwards."""
    before = set(sys.modules)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in set(sys.modules) - before:
        mod = sys.modules[name]
        if str(tmp_path) in str(getattr(mod, "__file__", "") or ""):
            del sys.modules[name]


def _run_in_process(script: Path, out: Path) -> dict:
    spec = importlib.util.spec_from_file_location(f"run_{script.parent.name}", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(str(out))
    return dict(np.load(out)), mod.inputs()


def _check_against_numpy(res: dict, inputs) -> None:
    x, w, dy, dz = inputs
    y, z, dx, dw = reference(x, w, dy, dz, 0.25)
    np.testing.assert_allclose(res["y"], y, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(res["z"], z, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(res["dx"], dx, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(res["dw"], dw, rtol=1e-5, atol=1e-6)
    # the graph holds the op under its own type and domain
    assert ["ScaledLeak", "test.ops.ScaledLeak:1"] in res["types"].tolist()


def test_app_binding_forward_and_backward_in_process(app_path):
    script = write_app(app_path, "leakapp_local")
    res, inputs = _run_in_process(script, app_path / "local.npz")
    _check_against_numpy(res, inputs)


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpich not installed")
def test_app_binding_on_mpi_ranks_gives_the_same_bits(app_path):
    """Replica 1 runs on the second rank, which imports the op's module itself."""
    script = write_app(app_path, "leakapp_mpi")
    local, inputs = _run_in_process(script, app_path / "local.npz")
    cmd = [sys.executable, "-m", "popxl_launch", "--backend", "mpi", "--workers", "2",
           str(script), str(app_path / "mpi.npz")]
    proc = subprocess.run(cmd, cwd=app_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mpi = dict(np.load(app_path / "mpi.npz"))
    _check_against_numpy(mpi, inputs)
    for k in ("y", "z", "dx", "dw"):
        np.testing.assert_array_equal(mpi[k], local[k])


# --- ops built directly ------------------------------------------------------------------------
class Cube(CustomOp):
    op_type = "Cube"
    domain = "test.direct"

    def setup(self, x):
        return x

    def compute(self, x):
        return x.astype(np.float64) ** 3          # cast back to x's dtype by the emulator

    def grad(self, grad_outputs, fwd):
        x = fwd.input(0)
        return [grad_outputs[0] * x * x * 3.0]


class Offset(CustomOp):
    """Two attributes; no gradient."""
    op_type = "Offset"
    attributes = ("a", "b")

    def setup(self, x):
        return popxl.TensorSpec(x.shape, x.dtype)

    def compute(self, x):
        return x + self.a * self.b


def test_create_forward_and_backward():
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    out, = run_ops(lambda t: Offset.create(Cube.create(t), a=2.0, b=0.5), x)
    np.testing.assert_allclose(out, x.astype(np.float64) ** 3 + 1.0, rtol=1e-6)
    assert out.dtype == np.float32
    dy = np.full_like(x, 0.5)
    (y,), (dx,) = grads(lambda t: Cube.create(t), [x], [dy])
    np.testing.assert_allclose(dx, 1.5 * x.astype(np.float64) ** 2, rtol=1e-6)
    with pytest.raises(popxl.errors.popart_exception, match="defines no grad"):
        grads(lambda t: Offset.create(t, a=1.0, b=1.0), [x], [dy])


class WrongShape(CustomOp):
    op_type = "WrongShape"

    def setup(self, x):
        return x

    def compute(self, x):
        return x[:1]


class InPlaceWriter(CustomOp):
    op_type = "InPlaceWriter"

    def setup(self, x):
        return x

    def compute(self, x):
        x += 1                                     # inputs are read-only
        return x


def test_bad_compute_results_are_errors_naming_the_op():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(Exception, match=r"'WrongShape'.*output 0 has shape \(1, 3\), setup\(\) "
                                        r"declared \(2, 3\)"):
        run_ops(lambda t: WrongShape.create(t), x)
    with pytest.raises(Exception, match="read-only"):
        run_ops(lambda t: InPlaceWriter.create(t), x)


def test_definition_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros(3, np.float32))
        with pytest.raises(TypeError, match=r"attributes are \['a', 'b'\] \(missing \['b'\]\)"):
            Offset.create(t, a=1.0)
        with pytest.raises(TypeError, match=r"unknown \['c'\]"):
            Offset.create(t, a=1.0, b=2.0, c=3)

        class Reserved(CustomOp):
            op_type = "Call"
        with pytest.raises(ValueError, match="built-in op the emulator treats specially"):
            Reserved.create(t)

        class Nameless(CustomOp):
            pass
        with pytest.raises(TypeError, match="op_type must be a name"):
            Nameless.create(t)

        class TwoOuts(CustomOp):
            op_type = "TwoOuts"
            num_outputs = 2

            def setup(self, x):
                return x
        with pytest.raises(ValueError, match="setup\\(\\) returned 1 outputs, num_outputs is 2"):
            TwoOuts.create(t)
    with pytest.raises(TypeError, match="CustomOp subclass"):
        register(object, binding="x_binding")
    with pytest.raises(ValueError, match="binding must be a Python identifier"):
        register(Cube, binding="not a name")
    with pytest.raises(ValueError, match="sources must be a sources_digest"):
        register(Cube, binding="cube_binding", sources="abc")


def test_a_class_defined_in_main_is_refused_where_main_is_another_script():
    ref = CustomOpRef("__main__", "NotDefinedHere", None, "Mine", "custom.ops", 1)
    with pytest.raises(RuntimeError, match="defined in the script run as __main__.*importable "
                                           "module"):
        ref.resolve()


# --- bindings nobody registered, and registrations for exact sources ------------------------------
_MYSTERY = """\
// cppimport
#include <pybind11/pybind11.h>
PYBIND11_MODULE(mystery_binding, m) {
  pybind11::class_<MysteryOp>(m, "MysteryOp").def_static("createOpInGraph", &make);
  pybind11::class_<OtherOp>(m, "OtherOp");
}
"""


def _package(root: Path, pkg: str, binding: str, text: str) -> None:
    (root / pkg).mkdir()
    (root / pkg / "__init__.py").write_text("")
    (root / pkg / f"{binding}.cpp").write_text(text)
    (root / pkg / "wrapper.py").write_text(f"import cppimport.import_hook\n"
                                           f"from . import {binding}\n")


def test_unknown_binding_fails_naming_it_and_how_to_register(app_path):
    _package(app_path, "mysteryapp", "mystery_binding", _MYSTERY)
    with pytest.raises(UnknownBindingError) as err:
        importlib.import_module("mysteryapp.wrapper")
    msg = str(err.value)
    assert "C++ custom op binding 'mystery_binding'" in msg
    assert "classes: MysteryOp, OtherOp" in msg
    assert str(app_path / "mysteryapp" / "mystery_binding.cpp") in msg
    assert ("popxl.custom_ops.register(MyMysteryOp, binding='mystery_binding', "
            "name='MysteryOp')") in msg
    assert isinstance(err.value, ImportError)


class Mystery(CustomOp):
    op_type = "Mystery"
    attributes = ("k",)

    def setup(self, x):
        return x

    def compute(self, x):
        return x * self.k


def test_registration_for_exact_sources(app_path):
    _package(app_path, "exactapp", "exact_binding", _MYSTERY.replace("mystery", "exact"))
    cpp = app_path / "exactapp" / "exact_binding.cpp"
    digest = sources_digest(str(cpp))
    register(Mystery, binding="exact_binding", name="MysteryOp", sources=digest)
    # comments and whitespace do not change the digest
    cpp.write_text("// cppimport\n// a comment\n" + _MYSTERY.replace("mystery", "exact")
                   .replace("// cppimport\n", "").replace("  ", "\t"))
    assert sources_digest(str(cpp)) == digest
    binding = importlib.import_module("exactapp.exact_binding")
    with pytest.raises(UnknownBindingError, match="class OtherOp has no implementation"):
        binding.OtherOp
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.ones(2, np.float32))
        settings = popxl.context.get_current_context()._get_op_settings("MysteryOp")
        op = binding.MysteryOp.createOpInGraph(ir.main_graph._pb_graph, {0: t.id},
                                               {0: ir.main_graph._create_tensor_id("out")},
                                               3.0, settings)
        assert op.opType() == "Mystery" and op.getName() == "MysteryOp"
        out = popxl.Tensor._from_pb_tensor(op.outTensor(0))
        assert out.id == "out" and out.shape == (2,)
        with pytest.raises(TypeError, match=r"takes \(graph, inputs, outputs, k, settings\)"):
            binding.MysteryOp.createOpInGraph(ir.main_graph._pb_graph, {0: t.id}, {0: "o2"},
                                              1.0, 2.0, settings)
    # a copy whose code differs is another op: not resolved
    (app_path / "otherapp").mkdir()
    (app_path / "otherapp" / "__init__.py").write_text("")
    (app_path / "otherapp" / "exact_binding.cpp").write_text(
        _MYSTERY.replace("mystery", "exact").replace("&make", "&make_other"))
    with pytest.raises(UnknownBindingError, match="registered for a binding of this name, but "
                                                  "for other C\\+\\+ sources"):
        importlib.import_module("otherapp.exact_binding")
