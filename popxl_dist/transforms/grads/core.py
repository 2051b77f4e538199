"""Grad rules: arithmetic, matmul, shape views, sum, gelu, softmax, identity/cast, and Call."""
from __future__ import annotations

from typing import List, Optional

from ... import ops
from ...ops._internal import expand, grad_op
from ...tensor import Tensor
from ..grad_registry import grad_rule, no_grad

Grads = List[Optional[Tensor]]

no_grad("HostLoad", "HostStore", "Init", "NlllWithSoftmaxGradDirect", "Detach", "DetachInplace",
        "ScaledAdd")


@grad_rule("Add")
def _add_grad(g, dys) -> Grads:
    dy, = dys
    return [g.unbroadcast(dy, g.in_info(0).shape) if g.needs(0) else None,
            g.unbroadcast(dy, g.in_info(1).shape) if g.needs(1) else None]


@grad_rule("Sub")
def _sub_grad(g, dys) -> Grads:
    dy, = dys
    return [g.unbroadcast(dy, g.in_info(0).shape) if g.needs(0) else None,
            g.unbroadcast(ops.negate(dy), g.in_info(1).shape) if g.needs(1) else None]


@grad_rule("Mul")
def _mul_grad(g, dys) -> Grads:
    dy, = dys
    return [g.unbroadcast(ops.mul(dy, g.fwd_in(1)), g.in_info(0).shape) if g.needs(0) else None,
            g.unbroadcast(ops.mul(dy, g.fwd_in(0)), g.in_info(1).shape) if g.needs(1) else None]


@grad_rule("Div")
def _div_grad(g, dys) -> Grads:
    dy, = dys
    b = g.fwd_in(1)
    da = g.unbroadcast(ops.div(dy, b), g.in_info(0).shape) if g.needs(0) else None
    db = None
    if g.needs(1):
        db = g.unbroadcast(ops.negate(ops.div(ops.mul(dy, g.fwd_out(0)), b)), g.in_info(1).shape)
    return [da, db]


@grad_rule("Neg")
def _neg_grad(g, dys) -> Grads:
    return [ops.negate(dys[0])]


def _swap_last(t: Tensor) -> Tensor:
    perm = list(range(t.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ops.transpose(t, perm)


@grad_rule("MatMul")
def _matmul_grad(g, dys) -> Grads:
    dy, = dys
    if g.num_inputs == 3:                     # matmul_pow2scaled: see grads/float8.py
        from .float8 import matmul_pow2scaled_grad

        return matmul_pow2scaled_grad(g, dy)
    a_dtype = g.in_info(0).dtype
    if dy.dtype != a_dtype:
        dy = ops.cast(dy, a_dtype)
    return matmul_operand_grads(g, dy, lambda: g.fwd_in(0), lambda: g.fwd_in(1))


def matmul_operand_grads(g, dy: Tensor, lhs, rhs) -> Grads:
    """[d lhs, d rhs] of `lhs() @ rhs()` (np.matmul shapes, batch broadcasting) for the output
    gradient `dy`; `lhs` / `rhs` make the operands in the gradient graph when needed."""
    a_shape, b_shape = g.in_info(0).shape, g.in_info(1).shape
    a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
    b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
    s = list(g.out_info(0).shape)
    if len(b_shape) == 1:
        s.append(1)
    if len(a_shape) == 1:
        s.insert(len(s) - 1, 1)
    out2 = tuple(s)
    dy2 = ops.reshape(dy, out2) if dy.shape != out2 else dy
    da = db = None
    if g.needs(0):
        b = rhs()
        b = ops.reshape(b, b2) if b.shape != b2 else b
        da = g.unbroadcast(ops.matmul(dy2, _swap_last(b)), a2)
        da = ops.reshape(da, a_shape) if da.shape != a_shape else da
    if g.needs(1):
        a = lhs()
        a = ops.reshape(a, a2) if a.shape != a2 else a
        db = g.unbroadcast(ops.matmul(_swap_last(a), dy2), b2)
        db = ops.reshape(db, b_shape) if db.shape != b_shape else db
    return [da, db]


@grad_rule("Reshape", "ReshapeInplace")
def _reshape_grad(g, dys) -> Grads:
    return [ops.reshape(dys[0], g.in_info(0).shape)]


@grad_rule("Transpose", "TransposeInplace")
def _transpose_grad(g, dys) -> Grads:
    perm = list(g.attrs["perm"])
    inv = [perm.index(i) for i in range(len(perm))]
    return [ops.transpose(dys[0], inv)]


@grad_rule("ReduceSum")
def _reduce_sum_grad(g, dys) -> Grads:
    in_shape = g.in_info(0).shape
    axes = g.attrs["axes"]
    keep = tuple(1 if i in axes else s for i, s in enumerate(in_shape))
    dy = dys[0]
    if dy.shape != keep:
        dy = ops.reshape(dy, keep) if keep else dy
    return [expand(dy, in_shape) if dy.shape != in_shape else ops.identity(dy)]


@grad_rule("Gelu")
def _gelu_grad(g, dys) -> Grads:
    x = g.fwd_in(0)
    return [grad_op("GeluGrad", [dys[0], x], x)]


@grad_rule("Softmax")
def _softmax_grad(g, dys) -> Grads:
    y = g.fwd_out(0)
    return [grad_op("SoftmaxGrad", [dys[0], y], y, {"axis": g.attrs["axis"]})]


@grad_rule("Identity")
def _identity_grad(g, dys) -> Grads:
    return [dys[0]]


@grad_rule("Cast")
def _cast_grad(g, dys) -> Grads:
    src = g.in_info(0).dtype
    if not src.is_floating_point:
        return [None]
    return [ops.cast(dys[0], src)]


@grad_rule("Call")
def _call_grad(g, dys) -> Grads:
    from ..autodiff import ExpectedConnectionType

    op = g.op
    info = g.autodiff_called(op.called[0])
    cgd = info.forward_graph._data
    args = []
    for e in info.expected_inputs:
        ft = e.fwd_tensor
        if e.connection_type == ExpectedConnectionType.FwdGrad:
            k = cgd.outputs.index(ft.id) if ft.id in cgd.outputs else -1
            d = dys[k] if 0 <= k < len(dys) else None
            if d is None:
                d = ops.init(ft.shape, ft.dtype, "zero_grad", "zero")
            args.append(d)
        elif ft.id in cgd.inputs:
            args.append(g._b.fwd(op.inputs[cgd.inputs.index(ft.id)]))
        elif ft.id in cgd.outputs:
            args.append(g._b.fwd(op.outputs[cgd.outputs.index(ft.id)]))
        else:
            raise RuntimeError(f"autodiff: gradient graph '{info.graph.id}' needs '{ft.id}', which "
                               f"is neither an input nor an output of '{cgd.id}'")
    outs = ops.call(info.graph, *args)
    dxs: Grads = [None] * len(op.inputs)
    for e, o in zip(info.expected_outputs, outs):
        if e.fwd_tensor.id in cgd.inputs:
            dxs[cgd.inputs.index(e.fwd_tensor.id)] = o
    return dxs


@grad_rule("Expand")
def _expand_grad(g, dys) -> Grads:
    return [g.unbroadcast(dys[0], g.in_info(0).shape)]
