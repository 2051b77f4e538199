"""A small application with its own C++ custom op, written to a folder by the tests.

Layout (as Graphcore's applications ship theirs)::

    emulated_ops.py                   the emulator's implementation: CustomOps + register()
    run_scaled_leak.py                a program: fwd + autodiff of the op on 2 replicas -> .npz
    <pkg>/__init__.py
    <pkg>/scaled_leak/__init__.py
    <pkg>/scaled_leak/scaled_leak.py  the op's wrapper: cppimport hook + createOpInGraph
    <pkg>/scaled_leak/scaled_leak_binding.cpp, scaled_leak.cpp   never compiled

The op `ScaledLeak(x, w; alpha)` has two outputs: `y = leak(x) * w` and `z = leak(x)`, with
`leak(x) = x if x > 0 else alpha * x` and `w` of shape `x.shape[-1:]`.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

BINDING_CPP = """\
// cppimport
// A test binding. The emulator reads its names and never compiles it.
#include <pybind11/pybind11.h>
#include "scaled_leak.hpp"

namespace py = pybind11;

PYBIND11_MODULE(scaled_leak_binding, m) {
  py::class_<test::ScaledLeakOp, std::shared_ptr<test::ScaledLeakOp>> binding(m, "ScaledLeakOp");
  binding.def_static("createOpInGraph", &test::ScaledLeakOp::createOpInGraph);
}

/*
<%
cfg['sources'] = ['scaled_leak.cpp']
setup_pybind11(cfg)
%>
*/
"""

OP_CPP = """\
// The op's (pretend) implementation.
#include "scaled_leak.hpp"
namespace test { float leak(float x, float a) { return x > 0 ? x : a * x; } }
"""

OP_HPP = """\
#pragma once
namespace test { struct ScaledLeakOp; float leak(float x, float a); }
"""

WRAPPER = """\
import cppimport.import_hook  # noqa: F401  (compiles the binding, upstream)
from . import scaled_leak_binding

import popxl
from popxl.context import get_current_context, op_debug_context


@op_debug_context
def scaled_leak(x, w, alpha):
    ctx = get_current_context()
    g = ctx.graph
    settings = ctx._get_op_settings("ScaledLeakOp")
    op = scaled_leak_binding.ScaledLeakOp.createOpInGraph(
        g._pb_graph, {0: x.id, 1: w.id},
        {0: g._create_tensor_id("y"), 1: g._create_tensor_id("leak")}, alpha, settings)
    ctx._op_created(op)
    return (popxl.Tensor._from_pb_tensor(op.outTensor(0)),
            popxl.Tensor._from_pb_tensor(op.outTensor(1)))
"""

EMULATED_OPS = """\
import numpy as np

import popxl.ops as ops
from popxl.custom_ops import CustomOp, register


class LeakGrad(CustomOp):
    op_type = "LeakGrad"
    domain = "test.ops"
    attributes = ("alpha",)

    def setup(self, g, x):
        return g

    def compute(self, g, x):
        return np.where(x > 0, g, g * np.float32(self.alpha))


@register(binding="scaled_leak_binding")
class ScaledLeak(CustomOp):
    op_type = "ScaledLeak"
    domain = "test.ops"
    attributes = ("alpha",)
    num_outputs = 2

    def setup(self, x, w):
        if tuple(w.shape) != tuple(x.shape[-1:]):
            raise ValueError(f"ScaledLeak: w must have shape {x.shape[-1:]}, got {w.shape}")
        return x, x

    def compute(self, x, w):
        leak = np.where(x > 0, x, x * np.float32(self.alpha))
        return leak * w, leak

    def grad(self, grad_outputs, fwd):
        dy, dz = grad_outputs
        x, w = fwd.input(0), fwd.input(1)
        total = None if dy is None else dy * w
        if dz is not None:
            total = dz if total is None else total + dz
        dx = LeakGrad.create(total, x, alpha=self.alpha)
        dw = None
        if dy is not None and fwd.requires_grad(1):
            dw = ops.sum(dy * fwd.output(1), axis=list(range(x.rank - 1)))
        return [dx, dw]
"""

RUN_SCRIPT = """\
import sys

import numpy as np

import popxl
import popxl.ops as ops

import emulated_ops  # noqa: F401  (registers the emulator's implementation)
from {pkg}.scaled_leak.scaled_leak import scaled_leak

ALPHA = 0.25
R = 2


def inputs():
    rng = np.random.default_rng(7)
    f = np.float32
    return (rng.normal(size=(R, 3, 4)).astype(f), rng.normal(size=4).astype(f),
            rng.normal(size=(R, 3, 4)).astype(f), rng.normal(size=(R, 3, 4)).astype(f))


def main(out):
    x0, w0, dy0, dz0 = inputs()
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        spec = popxl.TensorSpec((3, 4), popxl.float32)
        streams = [popxl.h2d_stream((3, 4), popxl.float32, n) for n in ("x", "dy", "dz")]
        w = popxl.variable(w0, name="w")
        g = ir.create_graph(lambda x, w: scaled_leak(x, w, ALPHA), spec,
                            popxl.TensorSpec((4,), popxl.float32))
        bwd = popxl.transforms.autodiff(g)
        x, dy, dz = (ops.host_load(s) for s in streams)
        info = ops.call_with_info(g, x, w)
        y, z = info.outputs
        dx, dw = ops.call(bwd.graph, dy, dz, inputs_dict=bwd.inputs_dict(info))
        outs = {{}}
        for name, t in (("y", y), ("z", z), ("dx", dx), ("dw", dw)):
            s = popxl.d2h_stream(t.shape, t.dtype, name)
            ops.host_store(s, t)
            outs[name] = s
    types = sorted((op.opType(), str(op.opid)) for op in g._pb_graph.getOps())
    with popxl.Session(ir, "ipu_hw") as session:
        res = session.run(dict(zip(streams, (x0, dy0, dz0))))
    np.savez(out, **{{k: res[s] for k, s in outs.items()}}, types=np.array(types))


if __name__ == "__main__":
    main(sys.argv[1])
"""


def write_app(root: Path, pkg: str) -> Path:
    """Write the application under `root` with its package named `pkg`; the run script."""
    op_dir = root / pkg / "scaled_leak"
    op_dir.mkdir(parents=True)
    (root / pkg / "__init__.py").write_text("")
    (op_dir / "__init__.py").write_text("")
    (op_dir / "scaled_leak_binding.cpp").write_text(BINDING_CPP)
    (op_dir / "scaled_leak.cpp").write_text(OP_CPP)
    (op_dir / "scaled_leak.hpp").write_text(OP_HPP)
    (op_dir / "scaled_leak.py").write_text(WRAPPER)
    (root / "emulated_ops.py").write_text(EMULATED_OPS)
    script = root / "run_scaled_leak.py"
    script.write_text(RUN_SCRIPT.format(pkg=pkg))
    return script


def reference(x, w, dy, dz, alpha):
    """NumPy: (y, z, dx, dw) of the op for per-replica x, dy, dz `(R, 3, 4)`; dw per replica."""
    x64, w64, dy64, dz64 = (a.astype(np.float64) for a in (x, w, dy, dz))
    leak = np.where(x64 > 0, x64, alpha * x64)
    slope = np.where(x64 > 0, 1.0, alpha)
    dx = slope * (dy64 * w64 + dz64)
    dw = (dy64 * leak).sum(axis=1)
    return leak * w64, leak, dx, dw


def fake_real_cppimport(root: Path) -> None:
    """A package shaped like the real cppimport under `root`: its import hook goes first on
    sys.meta_path and calls `cppimport.imp`, which would compile (here: raises)."""
    pkg = root / "cppimport"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent("""\
        __version__ = "fake-real"
        settings = dict(file_exts=[".cpp", ".c"])


        class CompileError(Exception):
            pass


        def imp(fullname, opt_in=False):
            from cppimport.find import find
            path = find(fullname, opt_in)
            if path is None:
                raise ImportError("no such C++ module: " + fullname)
            raise CompileError("fake cppimport would compile " + path + " here")


        def imp_from_filepath(filepath, fullname=None):
            raise CompileError("fake cppimport would compile " + filepath + " here")
        """))
    (pkg / "find.py").write_text(textwrap.dedent("""\
        import os
        import sys


        def find(fullname, opt_in):
            rel = fullname.replace(".", os.sep)
            for d in sys.path:
                for ext in (".cpp", ".c"):
                    p = os.path.join(d or ".", rel + ext)
                    if os.path.isfile(p):
                        with open(p) as f:
                            if not opt_in or "cppimport" in f.readline():
                                return p
            return None
        """))
    (pkg / "import_hook.py").write_text(textwrap.dedent("""\
        import sys

        import cppimport


        class Hook:
            running = False

            def find_spec(self, fullname, path, target=None):
                if self.running:
                    return None
                self.running = True
                try:
                    cppimport.imp(fullname, opt_in=True)
                except ImportError:
                    pass
                finally:
                    self.running = False


        sys.meta_path.insert(0, Hook())
        """))
