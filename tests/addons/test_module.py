"""Module: nesting, name scopes, add_variable_inputs, from_list, build_grad, call_module."""
from functools import partial

import numpy as np
import pytest

import popxl
import popxl_addons as addons
from popxl_addons.layers import LayerNorm, Linear


class Scale(addons.Module):
    def build(self, x):
        w = self.add_variable_input("w", partial(np.full, x.shape, 3.0), x.dtype)
        return x * w


class ScaleWithGrad(Scale):
    def build(self, x):
        y = super().build(x)
        self.aux["x"] = x
        return y

    def build_grad(self, dy):
        x = self.aux["x"]
        assert self.aux["x"] is x   # one grad input per key
        w_grad = dy * x
        self.var_grad["w"] = w_grad
        return dy * 3.0


def test_nested_names_scopes_and_reuse():
    class Outer(addons.Module):
        def __init__(self):
            super().__init__()
            self.inner = Scale()

        def build(self, x):
            return self.inner(x) + self.add_variable_input("fwd.offset", partial(np.ones, 2),
                                                           x.dtype)

    ir = popxl.Ir()
    with ir.main_graph:
        m = Outer()
        facts, g = m.create_graph(popxl.TensorSpec((2,), popxl.float32))
        assert list(facts.to_dict()) == ["inner.w", "fwd.offset"]
        assert g.args.inner.w.name.startswith("inner/")   # built inside name_scope("inner")
        facts2, g2 = m.create_graph(popxl.TensorSpec((2,), popxl.float32))   # reusable
        assert list(facts2.to_dict()) == ["inner.w", "fwd.offset"]
        assert g2.graph is not g.graph

    class Twice(addons.Module):
        def __init__(self):
            super().__init__()
            self.s = Scale()

        def build(self, x):
            return self.s(self.s(x))

    with ir.main_graph, pytest.raises(ValueError, match="already exists"):
        Twice().create_graph(popxl.TensorSpec((2,), popxl.float32))


def test_add_variable_inputs_and_from_list():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, sub = Scale().create_graph(popxl.TensorSpec((2,), popxl.float32))

        class Outer(addons.Module):
            def build(self, x):
                with pytest.raises(ValueError, match="negative"):
                    self.add_variable_inputs(-1, facts)
                for i in range(2):
                    x, = sub.bind(self.add_variable_inputs(i, facts)).call(x)
                return x

        f2, g2 = Outer().create_graph(popxl.TensorSpec((2,), popxl.float32))
        assert list(f2.to_dict()) == ["0.w", "1.w"]
        lst = addons.Module.from_list([Scale(), Scale()])
        assert lst[1] is lst.get(1) and len(list(lst)) == 2
        with pytest.raises(AttributeError):
            iter(Scale())
        x = popxl.variable(np.ones(2, np.float32))
        y, = g2.bind(f2.init()).call(x)
        st = addons.host_store(y)
    with popxl.Session(ir, "ipu_hw") as s:
        np.testing.assert_allclose(s.run()[st], 9.0)


def test_build_grad_and_call_module():
    x0 = np.array([1.0, 2.0], np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        m = ScaleWithGrad()
        facts, fwd = m.create_graph(popxl.TensorSpec((2,), popxl.float32))
        grad = fwd.autodiff()
        with pytest.raises(Exception, match="already been applied"):
            fwd.autodiff()
        assert len(grad.graph.outputs) == 2   # dx, then dw
        v = facts.init()
        x = popxl.variable(x0)
        info = fwd.bind(v).call_with_info(x)
        dinfo = grad.call_with_info(popxl.constant(np.ones(2, np.float32)),
                                    args=grad.grad_graph_info.inputs_dict(info))
        grads = grad.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, dinfo)
        s_dx, s_dw = addons.host_store(grads[x]), addons.host_store(grads[v.w])
        with pytest.raises(Exception, match="build_grad"):
            ScaleWithGrad()(x)   # inline call of a module with build_grad

        class Parent(addons.Module):
            def build(self, x):
                y, = self.call_module(ScaleWithGrad(), "sc")(x)
                return y

        pf, pg = Parent().create_graph(popxl.TensorSpec((2,), popxl.float32))
        assert list(pf.to_dict()) == ["sc.w"] and len(pg.called_graphs_grad_info) == 1
        pgrad = addons.autodiff(pg)   # uses the hand-written grad of the called graph
        pv = pf.init()
        pinfo = pg.bind(pv).call_with_info(x)
        pd = pgrad.call_with_info(popxl.constant(np.ones(2, np.float32)),
                                  args=pgrad.grad_graph_info.inputs_dict(pinfo))
        pgrads = pgrad.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(pinfo, pd)
        s_pdw = addons.host_store(pgrads[pv.sc.w])
    with popxl.Session(ir, "ipu_hw") as s:
        out = s.run()
    np.testing.assert_allclose(out[s_dx], 3.0)
    np.testing.assert_allclose(out[s_dw], x0)
    np.testing.assert_allclose(out[s_pdw], x0)


def test_module_errors():
    with pytest.raises(ValueError, match="grad_inlining_error"):
        addons.Module(grad_inlining_error="bad")

    class Bad(addons.Module):
        def __init__(self):
            self.sub = Scale()

    with pytest.raises(AttributeError, match="super"):
        Bad()


def test_layers_linear_layernorm():
    np.random.seed(0)
    x0 = np.random.normal(size=(3, 4)).astype(np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        lf, lg = Linear(5).create_graph(popxl.TensorSpec((3, 4), popxl.float32))
        nf, ng = LayerNorm().create_graph(popxl.TensorSpec((3, 5), popxl.float32))
        lv, nv = lf.init(), nf.init()
        y, = lg.bind(lv).call(popxl.variable(x0))
        z, = ng.bind(nv).call(y)
        st = addons.host_store(z)
        with pytest.raises(ValueError, match="2-D"):
            LayerNorm().create_graph(popxl.TensorSpec((3, 5, 2), popxl.float32))
    with popxl.Session(ir, "ipu_hw") as s:
        w = s.get_tensor_data(lv.weight)
        got = s.run()[st]
    assert np.abs(w).max() <= 0.04 + 1e-7 and w.std() > 0.01   # truncated normal, std 0.02
    yy = x0 @ w
    want = (yy - yy.mean(-1, keepdims=True)) / np.sqrt(yy.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_a_module_is_true_in_a_boolean_context():
    """`if self.norm:` (an optional sub-module) tests presence, as upstream: a module without
    sub-modules, and an empty `from_list` one, are true."""

    class MaybeScaled(addons.Module):
        def __init__(self, scaled: bool):
            super().__init__()
            self.scale = Scale() if scaled else None

        def build(self, x):
            return self.scale(x) if self.scale else x

    assert bool(Scale()) and bool(addons.Module.from_list([]))
    assert len(addons.Module.from_list([Scale()])) == 1
    results = []
    for scaled in (True, False):
        ir = popxl.Ir()
        with ir.main_graph:
            facts, g = MaybeScaled(scaled).create_graph(popxl.TensorSpec((2,), popxl.float32))
            y, = g.bind(facts.init()).call(popxl.variable(np.ones(2, np.float32)))
            st = addons.host_store(y)
        with popxl.Session(ir, "ipu_hw") as s:
            results.append(s.run()[st])
    np.testing.assert_array_equal(results[0], 3.0)
    np.testing.assert_array_equal(results[1], 1.0)


class _AuxLinear(addons.Module):
    def build(self, x):
        self.w = self.add_variable_input("w", partial(np.ones, (2, 2)), popxl.float32)
        self.aux["x"] = x
        self.aux["w"] = self.w
        return x @ self.w

    def build_grad(self, dy):
        assert "w" not in self.var_grad and "nope" not in self.var_grad
        self.var_grad["w"] = (dy.T @ self.aux["x"]).T
        assert "w" in self.var_grad
        return dy @ self.aux["w"].T


def test_build_grad_stitches_every_aux_tensor_and_checks_the_signature():
    """As upstream: every aux tensor becomes a forward output (inputs too), so the gradient
    graph's inputs (the gradient, then the aux it reads) number the forward outputs;
    `name in var_grad` says whether a gradient was set; gradients provided that do not fit
    build_grad's signature are refused as create_graph refuses them."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((3, 2), np.float32), name="x")
        facts, fwd = _AuxLinear().create_graph(x)
        grad = fwd.autodiff(method="build_grad")
        assert len(fwd.graph.outputs) == 3 == len(grad.graph.inputs)
        assert [e.connection_type.name for e in grad.grad_graph_info.expected_inputs] == \
            ["FwdGrad", "Fwd", "Fwd"]
        facts2, fwd2 = _AuxLinear().create_graph(x)
        with pytest.raises(ValueError, match=r"^The arguments, `args` and `kwargs`, do not match "
                                             r"the signature of the function `fn`"):
            fwd2.autodiff(method="build_grad", grads_provided=[])
