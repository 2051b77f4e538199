"""The checks `Session` makes before anything runs, so bad arguments never reach the workers and
no run returns a silently wrong answer: argument types and values that a
downcast to the stream's dtype would change (int64 wrapping, float64 overflowing to inf)."""
from __future__ import annotations

from collections import abc
from typing import Any, Mapping, Optional

import numpy as np

from .errors import SessionFailed
from .utils import to_numpy

__all__ = ["as_stream_mapping", "checked_downcast", "number_as", "check_output_array",
           "read_only", "session_failed", "variable_data_array", "check_compilable_dtypes",
           "check_op_setups"]

_INT_LIMITS = {np.dtype(np.int32): np.iinfo(np.int32), np.dtype(np.uint32): np.iinfo(np.uint32)}


def as_stream_mapping(value: Any, what: str, kind: str) -> Mapping:
    """`value` as a `{stream: array}` mapping (None is empty); a TypeError naming the call for
    anything else (a list or a bare array is a common slip)."""
    if type(value) is dict:
        return value
    if value is None:
        return {}
    if isinstance(value, abc.Mapping):
        return value
    example = "{x_stream: x_data}" if kind == "input" else "session.create_host_outputs()"
    raise TypeError(f"{what}: `{'inputs' if kind == 'input' else 'outputs'}` must be a mapping "
                    f"from {kind} streams to NumPy arrays (e.g. {example}), got "
                    f"{type(value).__name__}")


def checked_downcast(stream_id: str, arr: np.ndarray, want: np.dtype) -> np.ndarray:
    """`arr` (int64, uint64 or float64) converted to the stream's 32-bit dtype `want`; a
    ValueError naming the stream and the first value the conversion would change (an integer
    that wraps, a finite float that overflows to inf)."""
    limits = _INT_LIMITS.get(want)
    if limits is not None:
        if arr.size:
            lo, hi = arr.min(), arr.max()
            if lo < limits.min or hi > limits.max:
                bad = lo if lo < limits.min else hi
                _raise_changed(stream_id, arr, bad, want, "does not fit")
        return arr.astype(want)
    with np.errstate(over="ignore"):
        out = arr.astype(want)
    if not np.isfinite(out).all():
        overflow = np.isinf(out) & np.isfinite(arr)
        if overflow.any():
            _raise_changed(stream_id, arr, arr[overflow].flat[0], want, "overflows")
    return out


def number_as(tensor_id: str, value: Any, want: np.dtype):
    """The Python or NumPy number `value` written to a variable of NumPy dtype `want` (filled
    into its whole shape); a ValueError if the conversion would change it: a fraction, a value
    out of range or a NaN/inf into an integer (or bool) type, a finite value that overflows a
    float type. (Rounding to the float type's precision is not a change.)"""
    if isinstance(value, (complex, np.complexfloating)) and want.kind != "c":
        problem = "is complex"
    elif want.kind in "biu":
        try:
            exact = float(value).is_integer() and np.asarray(value, want).item() == value
        except (OverflowError, ValueError):
            exact = False
        problem = None if exact else "is not exactly representable"
    elif want.kind == "f":
        try:    # float(): a Python int beyond int64 is no NumPy number
            as_float = float(value)
        except OverflowError:
            as_float = None
        with np.errstate(over="ignore"):
            converted = None if as_float is None else np.asarray(as_float).astype(want)
        problem = ("overflows" if converted is None or (np.isinf(converted)
                                                         and np.isfinite(as_float)) else None)
    else:
        problem = None
    if problem is not None:
        raise ValueError(f"write_variable_data: the value {value!r} for variable {tensor_id} "
                         f"{problem} in its dtype {want.name}: it would be stored as a different "
                         f"value. Convert it yourself if that is intended.")
    return np.asarray(value if want.kind in "biuc" else float(value)).astype(want)


def variable_data_array(tensor_id: str, data: Any, host_shape, want: np.dtype) -> np.ndarray:
    """`data` for `write_variable_data` as a NumPy array (not yet checked against the
    variable's dtype and shape); a TypeError naming the variable and what it expects when it
    is no array at all (a ragged list, an object NumPy cannot convert)."""
    try:
        return to_numpy(data, copy=False, downcast=False)
    except (ValueError, TypeError) as e:
        raise TypeError(f"write_variable_data: the data for variable {tensor_id} is not an "
                        f"array ({type(data).__name__}: {type(e).__name__}: {e}); expected a "
                        f"NumPy array of shape {tuple(host_shape)} and dtype {want}") from None


def _raise_changed(stream_id: str, arr: np.ndarray, value, want: np.dtype, how: str) -> None:
    index = tuple(int(i) for i in np.argwhere(arr == value)[0])
    value = np.asarray(value).item()
    raise ValueError(f"Session.run: input for stream '{stream_id}' has value {value!r} at index "
                     f"{index} that {how} {want.name} (the stream's dtype; the {arr.dtype} data "
                     f"would be downcast). Convert the data yourself if that is intended, or "
                     f"give the stream a wider dtype.")


def check_output_array(stream_id: str, arr: Any, want: np.dtype, dtype_name: str) -> None:
    """An output of `run_with_outputs` must be a writable NumPy array of the stream's storage
    dtype `want` (popxl dtype `dtype_name`)."""
    if not isinstance(arr, np.ndarray) or arr.dtype != want:
        got = f"{type(arr).__name__} of dtype {arr.dtype}" if isinstance(arr, np.ndarray) \
            else type(arr).__name__
        raise TypeError(f"Session.run_with_outputs: output for stream '{stream_id}' must be a "
                        f"NumPy array of dtype {dtype_name} ({want}), got {got}")
    if not arr.flags.writeable:
        raise ValueError(f"Session.run_with_outputs: output array for stream '{stream_id}' is "
                         f"read-only; pass a writable array (e.g. a copy)")


def read_only(arr: np.ndarray) -> np.ndarray:
    """A read-only view of `arr` (writes raise instead of changing the Session's host copy).
    An np.memmap is returned itself: a memmap-backed variable shares its file by design (as
    upstream), and the file is the host copy."""
    if isinstance(arr, np.memmap):
        return arr
    view = arr.view()
    view.flags.writeable = False
    return view


def session_failed(what: str, first: BaseException) -> SessionFailed:
    """The error every device operation of a failed Session raises, naming the first error."""
    text = str(first).strip().splitlines()
    first_line = text[0] if text else ""
    err = SessionFailed(
        f"{what}: this Session failed earlier ({type(first).__name__}: {first_line}), so its "
        f"replicas may be out of step (one may have applied an update the others did not). "
        f"Create a new Session, or call session.reset() to restore every replica from the host "
        f"weights (the values last copied to the host).")
    err.first_error = first
    return err


# Operand dtypes upstream's builders accept but no IPU program compiles (Poplar has no integer
# codelets for them): refused when the Session is made, naming the op and where it was built.
# op type -> fn(op) -> [(input index, operand name, "float" or "int")]
_FLOAT_0 = ("Exp", "ExpInplace", "Log", "Sqrt", "Sin", "Cos", "Tanh", "GeluErf",
            "GeluErfInplace", "Swish", "SwishInplace", "Dropout", "ShapedDropout", "LambSquare")


def _updater_operands(op) -> list:
    names = (["weight"] if op.attrs.get("has_weight") else []) + \
        ["acc_first_order", "acc_second_order"]
    out = [(i, n, "float") for i, n in enumerate(names)]
    if op.attrs.get("has_step"):
        out.append((len(op.inputs) - 1, "time_step", "float"))
    return out


_OPERAND_DTYPES = {
    **{t: (lambda op: [(0, "t", "float")]) for t in _FLOAT_0},
    **{t: _updater_operands for t in ("AdamUpdater", "LambUpdater", "AdaMaxUpdater")},
    "AdamVarUpdate": lambda op: [(0, "t", "float"), (1, "x", "float")],
    "NlllWithSoftmaxGradDirect": lambda op: [(1, "labels", "int")],
}


def check_compilable_dtypes(ir_data) -> None:
    """A TypeError for the first op whose operands have a dtype its IPU program cannot take
    (an integer input to exp, dropout or an Adam updater, float labels of a fused NLL...):
    upstream builds such ops, and fails when the Session compiles them; so does this."""
    for gd in ir_data.graphs.values():
        for op in gd.ops:
            rule = _OPERAND_DTYPES.get(op.type)
            if rule is None:
                continue
            for index, name, want in rule(op):
                info = gd.tensors[op.inputs[index]]
                ok = info.dtype.is_floating_point if want == "float" else info.dtype.is_int
                if not ok:
                    kind = "a floating point" if want == "float" else "an integer"
                    raise TypeError(
                        f"Session: {op.describe()}: '{name}' '{info.id}' must have {kind} dtype, "
                        f"got {info.dtype.name} (the op builds, as upstream, but cannot compile)")


def _sparse_accumulate_setup(op, gd) -> Optional[str]:
    t, x, indices = (gd.tensors[i] for i in op.inputs[:3])
    axis = op.attrs["axis"]
    if not 0 <= axis < len(t.shape):
        return f"axis {axis} is out of range for 't' '{t.id}' {t.shape}"
    want = t.shape[:axis] + indices.shape + t.shape[axis + 1:]
    if x.shape != want:
        return (f"'X' '{x.id}' must have shape {want} (t {t.shape} with axis {axis} replaced by "
                f"indices {indices.shape}), got {x.shape}")
    return None


def _dynamic_update_setup(op, gd) -> Optional[str]:
    t, _, update = (gd.tensors[i] for i in op.inputs[:3])
    window = list(t.shape)
    for axis, size in zip(op.attrs["axes"], op.attrs["sizes"]):
        window[axis] = size
    if tuple(update.shape) != tuple(window):
        return (f"'t_update' '{update.id}' has shape {update.shape}, expected the window shape "
                f"{tuple(window)}")
    return None


def _matmul_setup(op, gd) -> Optional[str]:
    a, b = (gd.tensors[i] for i in op.inputs[:2])
    if len(op.inputs) == 2 and a.dtype != b.dtype:
        return (f"its operands '{a.id}' {a.dtype.name} and '{b.id}' {b.dtype.name} must have "
                f"one dtype")
    return None


# Op setups upstream's builders do not check (its C++ op or Poplar fails later): op type ->
# fn(op, graph data) -> what is wrong, or None.
_SETUP_RULES = {"SparseAccumulate": _sparse_accumulate_setup, "MatMul": _matmul_setup,
                "DynamicUpdate": _dynamic_update_setup,
                "DynamicUpdateInplace": _dynamic_update_setup}


def check_op_setups(ir_data) -> None:
    """A ValueError for the first op whose attributes and operand shapes cannot be compiled
    although its builder accepted them, as upstream's does (see `_SETUP_RULES`)."""
    for gd in ir_data.graphs.values():
        for op in gd.ops:
            rule = _SETUP_RULES.get(op.type)
            problem = rule(op, gd) if rule is not None else None
            if problem:
                raise ValueError(f"Session: {op.describe()}: {problem} (the op builds, as "
                                 f"upstream, but cannot compile)")
