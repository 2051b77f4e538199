"""`popxl.ops.var_updates`: in-place optimiser updates (all modify `t`, none has a gradient).

A Python float argument is a compile-time constant (an attribute); a Tensor is a runtime scalar
(an extra input). `t` and `X` have the same shape and may differ in dtype (mixed precision: `X`
is rounded into `t`'s dtype, the update is computed in float32 and rounded once into `t`).

The accumulate family (`accumulate_*`, `accumulator_scale_`, `accumulator_zero_`,
`sparse_accumulate_`) and `copy_var_update_` also take integer accumulators, as upstream does
(e.g. `accumulate_(int32 tensor, int32 variable)`): a plain add is exact integer arithmetic
(wrapping on overflow); with a scale factor the update is computed in float64 and converted back
with truncation toward zero (C's float-to-int conversion).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from popart import OptimizerValue

from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor

__all__ = ["accumulate_", "accumulate_square_", "accumulate_mean_",
           "accumulate_moving_average_", "accumulate_moving_average_square_",
           "accumulator_scale_", "accumulator_zero_", "sparse_accumulate_", "copy_var_update_",
           "adam_updater", "lamb_updater", "adamax_updater", "adam_var_update"]

Scalar = Union[float, Tensor]


def _check_numeric(t: Tensor, opname: str, argname: str) -> None:
    if not (t.dtype.is_floating_point or t.dtype.is_int):
        raise TypeError(f"{opname}: '{argname}' '{t.id}' must have a numeric (float or integer) "
                        f"dtype, got {t.dtype.name}")


def _check_same_shape(opname: str, t: Tensor, X: Tensor) -> None:
    if t.shape != X.shape:
        raise ValueError(f"{opname}: 't' '{t.id}' {t.shape} and 'X' '{X.id}' {X.shape} must have "
                         f"the same shape (no broadcasting)")


def _scalar_arg(opname: str, argname: str, v: Any, ins: List[Tensor], attrs: Dict[str, Any],
                key: str = "f") -> None:
    """A float becomes `attrs[key]`; a scalar Tensor becomes an extra input."""
    if isinstance(v, Tensor):
        if v.nelms != 1:
            raise ValueError(f"{opname}: '{argname}' '{v.id}' must be a scalar tensor, got shape "
                             f"{v.shape}")
        if not (v.dtype.is_floating_point or v.dtype.is_int):
            raise TypeError(f"{opname}: '{argname}' '{v.id}' must be numeric, got {v.dtype.name}")
        ins.append(v)
        attrs[f"{key}_tensor"] = True
        attrs[key] = None
    else:
        try:
            attrs[key] = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"{opname}: '{argname}' must be a float or a scalar Tensor, got "
                            f"{v!r}") from None
        attrs[f"{key}_tensor"] = False


def _accumulate(opname: str, mode: str, t: Tensor, X: Tensor, f: Optional[Scalar]) -> Tensor:
    check_tensor(t, opname, "t")
    check_tensor(X, opname, "X")
    _check_numeric(t, opname, "t")
    _check_numeric(X, opname, "X")
    _check_same_shape(opname, t, X)
    ins = [t, X]
    attrs: Dict[str, Any] = {"mode": mode}
    if f is None:
        attrs.update(f=None, f_tensor=False)
    else:
        _scalar_arg(opname, "f", f, ins, attrs)
    return add_op("Accumulate", "accumulate", ins,
                  [Out(f"accumulate__{t.name}", t.shape, t.dtype, t.meta_shape)], attrs)[0]


def accumulate_(t: Tensor, X: Tensor, f: Optional[Scalar] = None) -> Tensor:
    """In place `t += X`, or `t += f*X` when `f` is given. Returns t's alias."""
    return _accumulate("accumulate_", "add" if f is None else "dampened_add", t, X, f)


def accumulate_square_(t: Tensor, X: Tensor, f: Scalar = 1.0) -> Tensor:
    """In place `t += f*X**2`."""
    return _accumulate("accumulate_square_", "dampened_add_square", t, X, f)


def accumulate_mean_(t: Tensor, X: Tensor, step: Scalar) -> Tensor:
    """In place running mean: `t = step/(step+1)*t + X/(step+1)` (`step` = samples so far)."""
    return _accumulate("accumulate_mean_", "mean", t, X, step)


def accumulate_moving_average_(t: Tensor, X: Tensor, f: Scalar) -> Tensor:
    """In place `t = f*t + (1-f)*X`."""
    return _accumulate("accumulate_moving_average_", "moving_average", t, X, f)


def accumulate_moving_average_square_(t: Tensor, X: Tensor, f: Scalar) -> Tensor:
    """In place `t = f*t + (1-f)*X**2`."""
    return _accumulate("accumulate_moving_average_square_", "moving_average_square", t, X, f)


def accumulator_scale_(t: Tensor, f: Scalar) -> Tensor:
    """In place `t = f*t`; a constant `f == 0` zeroes `t` (clearing NaN/Inf)."""
    check_tensor(t, "accumulator_scale_", "t")
    _check_numeric(t, "accumulator_scale_", "t")
    ins = [t]
    attrs: Dict[str, Any] = {}
    _scalar_arg("accumulator_scale_", "f", f, ins, attrs)
    return add_op("AccumulatorScale", "accumulator_scale", ins,
                  [Out(f"accumulator_scale__{t.name}", t.shape, t.dtype, t.meta_shape)], attrs)[0]


def accumulator_zero_(t: Tensor) -> Tensor:
    """In place `t = 0` (an AccumulatorScale by the constant 0)."""
    return accumulator_scale_(t, 0.0)


def sparse_accumulate_(t: Tensor, X: Tensor, indices: Tensor, axis: int = 0,
                       f: Optional[Scalar] = None, W: Optional[Tensor] = None) -> Tensor:
    """In place scatter-add: `t[..., indices[j], ...] += f*X[..., j, ...]` along `axis`.

    Args:
        t: the accumulator, e.g. the gradient of an embedding table.
        X: the update, shaped like `gather(t, indices, axis)`.
        indices: integer indices into `t` along `axis`.
        axis: the scatter axis.
        f: scale of `X` (default 1).
        W: the gathered weight; it only controls tile layout upstream and is ignored here.
    """
    name = "sparse_accumulate_"
    check_tensor(t, name, "t")
    check_tensor(X, name, "X")
    check_tensor(indices, name, "indices")
    _check_numeric(t, name, "t")
    if not indices.dtype.is_int:
        raise TypeError(f"{name}: 'indices' '{indices.id}' must be integer, got "
                        f"{indices.dtype.name}")
    # An axis out of range, or an X not shaped like gather(t, indices, axis), builds (as
    # upstream); the Session refuses it (session_checks.check_op_setups).
    if -t.rank <= axis < t.rank:
        axis %= t.rank
    ins = [t, X, indices]
    attrs: Dict[str, Any] = {"axis": axis}
    if f is None:
        attrs.update(f=1.0, f_tensor=False)
    else:
        _scalar_arg(name, "f", f, ins, attrs)
    if W is not None:
        check_tensor(W, name, "W")
        if W.shape != t.shape:
            raise ValueError(f"{name}: 'W' '{W.id}' {W.shape} must have the shape of 't' "
                             f"{t.shape}")
        ins.append(W)
    attrs["has_W"] = W is not None
    return add_op("SparseAccumulate", "sparse_accumulate", ins,
                  [Out(f"accumulate__{t.name}", t.shape, t.dtype, t.meta_shape)], attrs)[0]


def copy_var_update_(t: Tensor, X: Tensor) -> Tensor:
    """In place `t := X` (same shape and dtype). Returns t's alias, named `updated__<t>`."""
    check_tensor(t, "copy_var_update_", "t")
    check_tensor(X, "copy_var_update_", "X")
    _check_same_shape("copy_var_update_", t, X)
    if t.dtype != X.dtype:
        raise TypeError(f"copy_var_update_: 't' '{t.id}' {t.dtype.name} and 'X' '{X.id}' "
                        f"{X.dtype.name} must have the same dtype")
    return add_op("CopyVarUpdate", "copy_var_update", [t, X],
                  [Out(f"updated__{t.name}", t.shape, t.dtype, t.meta_shape)])[0]


def _updater(opname: str, op_type: str, m: Tensor, v: Tensor, weight: Optional[Tensor],
             time_step: Optional[Tensor], weight_decay: Optional[Scalar], beta1: Optional[float],
             beta2: Optional[float], epsilon: float, mode: str) -> Tensor:
    check_tensor(m, opname, "acc_first_order")
    check_tensor(v, opname, "acc_second_order")
    if m.shape != v.shape:
        raise ValueError(f"{opname}: 'acc_first_order' '{m.id}' {m.shape} and 'acc_second_order' "
                         f"'{v.id}' {v.shape} must have the same shape")
    wd_on = weight_decay_is_required(weight_decay)
    if wd_on and weight is None:
        raise ValueError(f"Weight decay requires weight to not be None. ({opname}: weight "
                         f"decay {weight_decay!r})")
    if time_step is not None and (beta1 is None or (mode != "adamax" and beta2 is None)):
        raise ValueError(f"Bias correction requires both beta1 and beta2 to not be None. "
                         f"({opname}: got beta1={beta1!r}, beta2={beta2!r})")
    ins: List[Tensor] = []
    attrs: Dict[str, Any] = {"mode": mode, "epsilon": float(epsilon),
                             "beta1": None if beta1 is None else float(beta1),
                             "beta2": None if beta2 is None else float(beta2)}
    out_dtype = m.dtype
    if wd_on:
        check_tensor(weight, opname, "weight")
        if weight.shape != m.shape:
            raise ValueError(f"{opname}: 'weight' '{weight.id}' {weight.shape} must have the "
                             f"shape of the accumulators {m.shape}")
        ins.append(weight)
        out_dtype = weight.dtype
    ins += [m, v]
    attrs["has_weight"] = wd_on
    if wd_on:
        _scalar_arg(opname, "weight_decay", weight_decay, ins, attrs, key="wd")
    else:
        attrs.update(wd=0.0, wd_tensor=False)
    if time_step is not None:
        check_tensor(time_step, opname, "time_step")
        if time_step.nelms != 1:
            raise ValueError(f"{opname}: 'time_step' '{time_step.id}' must be a scalar, got "
                             f"shape {time_step.shape}")
        # Last input on purpose: the kernel registry marks input -1 as modified (the step is
        # incremented in place). Upstream puts a weight-decay tensor after the step.
        ins.append(time_step)
    attrs["has_step"] = time_step is not None
    attrs["bias_correction"] = time_step is not None and beta1 is not None and (
        mode == "adamax" or beta2 is not None)
    return add_op(op_type, opname, ins, [Out("Updater", m.shape, out_dtype, m.meta_shape)],
                  attrs)[0]


_ADAM_MODES = {"Adam": ("AdamUpdater", "adam", True), "AdamNoBias": ("AdamUpdater", "adam", False),
               "Lamb": ("LambUpdater", "lamb", True), "LambNoBias": ("LambUpdater", "lamb", False),
               "AdaMax": ("AdaMaxUpdater", "adamax", True)}


def weight_decay_is_required(weight_decay: Optional[Scalar]) -> bool:
    """Whether `weight_decay` turns weight decay on: a Tensor, or a non-zero number."""
    return isinstance(weight_decay, Tensor) or (weight_decay is not None
                                                and float(weight_decay) != 0.0)


def handle_optimizer_value(f: Optional[Scalar], ins: Dict[int, str], index: int) -> OptimizerValue:
    """An optimiser hyper-parameter as upstream passes it to PopART: a Tensor becomes input
    `index` (`ins[index] = f.id`) and a non-constant `OptimizerValue`; a number a constant one."""
    if isinstance(f, Tensor):
        ins[index] = f.id
        return OptimizerValue(0.0, False)
    if f is None:
        return OptimizerValue()
    return OptimizerValue(float(f), True)


def create_adamupdater(acc_first_order: Tensor, acc_second_order: Tensor, ins: Dict[int, str],
                       mode, weight: Optional[Tensor] = None,
                       time_step: Optional[Tensor] = None,
                       weight_decay: Optional[Scalar] = None, beta1: Optional[float] = None,
                       beta2: Optional[float] = None, epsilon: float = 1e-07) -> Tensor:
    """Build an updater op (what `adam_updater`, `lamb_updater` and `adamax_updater` share).

    Args:
        mode: "Adam", "AdamNoBias", "Lamb", "LambNoBias", "AdaMax" or the `_ir.AdamMode` value;
            the "NoBias" modes take no `time_step`.
        ins: the op's inputs by index as upstream's builders fill them (0: weight, 1: first
            order, 2: second order, 3: time step); each entry must name the matching argument.
    """
    name = getattr(mode, "name", mode)
    if name not in _ADAM_MODES:
        raise ValueError(f"create_adamupdater: unknown mode {mode!r}; expected one of "
                         f"{sorted(_ADAM_MODES)}")
    op_type, kind, bias = _ADAM_MODES[name]
    opname = f"{kind}_updater"
    if not bias and time_step is not None:
        raise ValueError(f"{opname}: mode {name} has no bias correction, so it takes no "
                         f"'time_step'")
    for idx, arg, t in ((0, "weight", weight), (1, "acc_first_order", acc_first_order),
                        (2, "acc_second_order", acc_second_order), (3, "time_step", time_step)):
        if idx in ins and (t is None or ins[idx] != t.id):
            raise ValueError(f"{opname}: ins[{idx}] is {ins[idx]!r} but '{arg}' is "
                             f"{None if t is None else t.id!r}")
    return _updater(opname, op_type, acc_first_order, acc_second_order, weight, time_step,
                    weight_decay, beta1, beta2, epsilon, kind)


def _mode(base: str, time_step: Optional[Tensor]) -> str:
    return base if time_step is not None else f"{base}NoBias"


def adam_updater(acc_first_order: Tensor, acc_second_order: Tensor,
                 weight: Optional[Tensor] = None, time_step: Optional[Tensor] = None,
                 weight_decay: Optional[Scalar] = None, beta1: Optional[float] = None,
                 beta2: Optional[float] = None, epsilon: float = 1e-07) -> Tensor:
    """The Adam updater `x = mc/(sqrt(vc)+eps) (+ wd*w)`.

    If `time_step` is given it is incremented in place by 1 first and the new value t used for
    bias correction (mc = m/(1-beta1^t), vc = v/(1-beta2^t)) when beta1 and beta2 are given.

    Returns:
        `Updater`: the weight's dtype when weight decay uses the weight, else m's dtype.
    """
    return create_adamupdater(acc_first_order, acc_second_order, {}, _mode("Adam", time_step),
                              weight, time_step, weight_decay, beta1, beta2, epsilon)


def lamb_updater(acc_first_order: Tensor, acc_second_order: Tensor,
                 weight: Optional[Tensor] = None, time_step: Optional[Tensor] = None,
                 weight_decay: Optional[Scalar] = None, beta1: Optional[float] = None,
                 beta2: Optional[float] = None, epsilon: float = 1e-07) -> Tensor:
    """The LAMB updater: the Adam formula; the trust ratio is applied by `adam_var_update`."""
    return create_adamupdater(acc_first_order, acc_second_order, {}, _mode("Lamb", time_step),
                              weight, time_step, weight_decay, beta1, beta2, epsilon)


def adamax_updater(acc_first_order: Tensor, acc_second_order: Tensor,
                   weight: Optional[Tensor] = None, time_step: Optional[Tensor] = None,
                   weight_decay: Optional[Scalar] = None, beta1: float = 0.9,
                   epsilon: float = 1e-07) -> Tensor:
    """The AdaMax updater `x = m/(1-beta1^t) / (u + eps) (+ wd*w)`; `time_step` is required and
    incremented in place first."""
    if time_step is None:
        raise ValueError("AdaMax requires time_step to not be None.")
    return create_adamupdater(acc_first_order, acc_second_order, {}, "AdaMax", weight,
                              time_step, weight_decay, beta1, None, epsilon)


def adam_var_update(t: Tensor, x: Tensor, r1: Tensor, r2: Tensor,
                    learning_rate: Optional[Scalar] = None,
                    max_weight_norm: Optional[Scalar] = None) -> Tensor:
    """In place `t -= lr * ratio * x`, ratio = min(sqrt(r1), max_weight_norm) / sqrt(r2).

    `r1`, `r2` are the squared norms of the weight and of the updater; the ratio is 1 when either
    is 0 or `max_weight_norm` is 0. `learning_rate=None` means 1; `max_weight_norm=None` means no
    clipping.
    """
    name = "adam_var_update"
    for arg, tt in (("t", t), ("x", x), ("r1", r1), ("r2", r2)):
        check_tensor(tt, name, arg)
    if x.shape != t.shape:
        raise ValueError(f"{name}: 'x' '{x.id}' {x.shape} must have the shape of 't' '{t.id}' "
                         f"{t.shape}")
    for arg, tt in (("r1", r1), ("r2", r2)):
        if tt.nelms != 1:
            raise ValueError(f"{name}: '{arg}' '{tt.id}' must be a scalar, got shape {tt.shape}")
    ins = [t, x, r1, r2]
    attrs: Dict[str, Any] = {}
    _scalar_arg(name, "learning_rate", 1.0 if learning_rate is None else learning_rate, ins,
                attrs, key="lr")
    if max_weight_norm is None:
        attrs.update(mwn=float("inf"), mwn_tensor=False)
    else:
        _scalar_arg(name, "max_weight_norm", max_weight_norm, ins, attrs, key="mwn")
    return add_op("AdamVarUpdate", name, ins,
                  [Out(f"updated__{t.name}", t.shape, t.dtype, t.meta_shape)], attrs)[0]
