"""The built-in implementations of the C++ bindings Graphcore's applications ship: the Dolly and
Llama applications' rotary embedding (halves forward; popxl.addons' interleaved gradient op, as
their C++ has it) and popxl.addons' own binding (the built-in `RotaryPosEmbed`), against NumPy
references written here; a binding of the same name with other sources is not resolved."""
from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

import popxl
from harness import grads, run_ops
from popxl.custom_ops import UnknownBindingError, registrations
from popxl.custom_ops.known import (ADDONS_ROTARY_SOURCES, APPS_ROTARY_HALVES_SOURCES,
                                    AddonsRotaryPosEmbedOp, RotaryPosEmbedHalves)
from popxl_addons.ops.rotary_pos_embed import rotary_pos_embed


def _tables(batch, seq, half, seed):
    angle = np.random.default_rng(seed).uniform(-3, 3, size=(batch, seq, half))
    return np.sin(angle).astype(np.float32), np.cos(angle).astype(np.float32)


def _halves_ref(x, sin, cos, r):
    """Per element: feature i < r/2 pairs with feature i + r/2."""
    out = x.astype(np.float64).copy()
    b_, s_, h_, _ = x.shape
    s = np.broadcast_to(sin, (b_, s_, r // 2)).astype(np.float64)
    c = np.broadcast_to(cos, (b_, s_, r // 2)).astype(np.float64)
    for b, p, h, i in np.ndindex(b_, s_, h_, r // 2):
        x1, x2 = float(x[b, p, h, i]), float(x[b, p, h, i + r // 2])
        out[b, p, h, i] = x1 * c[b, p, i] - x2 * s[b, p, i]
        out[b, p, h, i + r // 2] = x2 * c[b, p, i] + x1 * s[b, p, i]
    return out


def _interleaved_inverse_ref(dy, sin, cos, r):
    """Per element: pair (2i, 2i + 1) turned back by the angle."""
    out = dy.astype(np.float64).copy()
    b_, s_, h_, _ = dy.shape
    s = np.broadcast_to(sin, (b_, s_, r // 2)).astype(np.float64)
    c = np.broadcast_to(cos, (b_, s_, r // 2)).astype(np.float64)
    for b, p, h, i in np.ndindex(b_, s_, h_, r // 2):
        re, im = float(dy[b, p, h, 2 * i]), float(dy[b, p, h, 2 * i + 1])
        out[b, p, h, 2 * i] = re * c[b, p, i] + im * s[b, p, i]
        out[b, p, h, 2 * i + 1] = im * c[b, p, i] - re * s[b, p, i]
    return out


@pytest.mark.parametrize("batch_tables, rotary_dim", [(1, 6), (2, 4)])
def test_apps_rotary_halves_forward_and_its_gradient_op(batch_tables, rotary_dim):
    rng = np.random.default_rng(rotary_dim)
    x = rng.normal(size=(2, 5, 3, 6)).astype(np.float32)
    sin, cos = _tables(batch_tables, 5, rotary_dim // 2, seed=batch_tables)

    def fn(t):
        return RotaryPosEmbedHalves.create(t, popxl.constant(sin), popxl.constant(cos),
                                           rotary_dim=rotary_dim)

    out, = run_ops(fn, x)
    np.testing.assert_allclose(out, _halves_ref(x, sin, cos, rotary_dim), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[..., rotary_dim:], x[..., rotary_dim:])
    dy = rng.normal(size=x.shape).astype(np.float32)
    _, (dx,) = grads(fn, [x], [dy])
    np.testing.assert_allclose(dx, _interleaved_inverse_ref(dy, sin, cos, rotary_dim),
                               rtol=1e-5, atol=1e-6)


def test_apps_rotary_halves_float16_and_errors():
    x = np.random.default_rng(3).normal(size=(1, 4, 2, 4)).astype(np.float16)
    sin, cos = (a.astype(np.float16) for a in _tables(1, 4, 2, seed=4))
    out, = run_ops(lambda t: RotaryPosEmbedHalves.create(
        t, popxl.constant(sin), popxl.constant(cos), rotary_dim=4), x)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, _halves_ref(x, sin, cos, 4).astype(np.float32)
                                  .astype(np.float16))
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros((1, 4, 2, 5), np.float32))
        s = popxl.constant(np.zeros((1, 4, 2), np.float32))
        with pytest.raises(ValueError, match="rotary_dim must be an even int in \\[2, 5\\]"):
            RotaryPosEmbedHalves.create(t, s, s, rotary_dim=5)


def test_addons_binding_builds_the_builtin_op():
    """createOpInGraph of popxl.addons' binding gives what popxl_addons' wrapper builds."""
    x = np.random.default_rng(5).normal(size=(2, 3, 2, 4)).astype(np.float32)
    sin, cos = _tables(1, 3, 2, seed=6)

    def via_binding(t):
        ctx = popxl.context.get_current_context()
        g = ctx.graph
        s, c = popxl.constant(sin), popxl.constant(cos)
        op = AddonsRotaryPosEmbedOp.createOpInGraph(
            g._pb_graph, {0: t.id, 1: s.id, 2: c.id}, {0: g._create_tensor_id("t_rotated")}, 4,
            ctx._get_op_settings("RotaryPosEmbedOp"))
        ctx._op_created(op)
        assert op.opType() == "RotaryPosEmbed"
        return popxl.Tensor._from_pb_tensor(op.outTensor(0))

    def via_addons(t):
        return rotary_pos_embed(t, popxl.constant(sin[0]), popxl.constant(cos[0]), 4)

    a, = run_ops(via_binding, x)
    b, = run_ops(via_addons, x)
    np.testing.assert_array_equal(a, b)


def test_builtin_registrations_are_for_exact_sources(tmp_path):
    builtins = [r for r in registrations() if r.builtin]
    assert {(r.binding, r.name, r.sources) for r in builtins} >= {
        ("rotary_pos_embed_binding", "RotaryPosEmbedOp", ADDONS_ROTARY_SOURCES),
        ("rotary_pos_embed_binding", "RotaryPosEmbedOp", APPS_ROTARY_HALVES_SOURCES)}
    # a binding of that name with other sources is another op
    pkg = tmp_path / "ropeapp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rotary_pos_embed_binding.cpp").write_text(
        "// cppimport\nPYBIND11_MODULE(rotary_pos_embed_binding, m) {\n"
        "  pybind11::class_<Mine>(m, \"RotaryPosEmbedOp\");\n}\n")
    (pkg / "rope.py").write_text("import cppimport.import_hook\n"
                                 "from . import rotary_pos_embed_binding\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(UnknownBindingError, match="registered for a binding of this name, "
                                                      "but for other C\\+\\+ sources"):
            importlib.import_module("ropeapp.rope")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith("ropeapp")]:
            del sys.modules[name]
