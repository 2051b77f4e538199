"""Builders of the ops that pass a tensor through: identity / rename, detach(_), cast,
print_tensor, ipu_copy and io_tile_copy."""
from __future__ import annotations

from typing import Literal, Optional

from popart._internal._types import FloatFormat as _FloatFormat
from popart._internal._types import PrintTensorFmt as _PrintTensorFmt

from .. import context, dtypes
from ..tensor import Tensor
from ._builder import Out, add_op, check_tensor

__all__ = ["identity", "rename", "detach", "detach_", "cast", "print_tensor", "ipu_copy",
           "io_tile_copy"]

PrintTensorFmt = _PrintTensorFmt
FloatFormat = Literal["auto", "fixed", "scientific", "none"]
FLOAT_FORMAT_MAP = {"auto": _FloatFormat.Auto, "fixed": _FloatFormat.Fixed,
                    "scientific": _FloatFormat.Scientific, "none": _FloatFormat.None_}
_FLOAT_FORMATS = tuple(FLOAT_FORMAT_MAP)


class _FloatFormatError(KeyError, ValueError):
    """An unknown `float_format` (upstream raises KeyError; a ValueError too)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _inferred_ipu(t: Tensor) -> Optional[int]:
    """The IPU of `t` as upstream places it (its producer, call site or first consumer), or
    None."""
    return t._placement()[0]


def print_tensor(t: Tensor, title: Optional[str] = None, print_self: bool = True,
                 print_gradient: bool = False, summarise_threshold: int = 1000,
                 edge_items: int = 3, max_line_width: int = 75, digits: int = 8,
                 float_format: str = "auto", separator: str = " ", open_bracket: str = "[",
                 close_bracket: str = "]") -> Tensor:
    """Print `t` at run time (`<title>: <values>`, NumPy-like) and return a copy of it.

    As upstream (Poplar's PrintTensor stream), the text goes to the host's stderr; here it is
    written by the host process after each run, replica by replica, whichever backend runs
    the replicas. The op has a side effect, so it runs (and prints) even when its output is
    unused; its gradient is printed only if the output is used on the gradient's path.

    Args:
        t: the tensor to print.
        title: the printed title (default: `print_<tensor name>`).
        print_self: print `t` in the forward pass.
        print_gradient: print the gradient of `t` when the graph is differentiated (titled
            `<title>_gradient`).
        summarise_threshold, edge_items, max_line_width, digits, float_format, separator,
        open_bracket, close_bracket: formatting, as NumPy's `array2string`; `float_format` is
            one of "auto", "fixed", "scientific", "none".
    Returns:
        A pass-through copy of `t` named `print_out`.
    """
    check_tensor(t, "print_tensor", "t")
    for arg, char in (("separator", separator), ("open_bracket", open_bracket),
                      ("close_bracket", close_bracket)):
        if not isinstance(char, str) or len(char) != 1:
            raise ValueError(f"Parameter {arg} must be 1 character exactly. Not length "
                             f"{len(char) if isinstance(char, str) else '-'} and value {char}.")
    if float_format not in _FLOAT_FORMATS:
        raise _FloatFormatError(f"print_tensor: float_format must be one of {_FLOAT_FORMATS}, "
                                f"got {float_format!r}")
    for arg, v in (("summarise_threshold", summarise_threshold), ("edge_items", edge_items),
                   ("max_line_width", max_line_width), ("digits", digits)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"print_tensor: '{arg}' must be a non-negative int, got {v!r}")
    attrs = {"title": f"print_{t.name}" if title is None else str(title),
             "print_self": bool(print_self),
             "print_gradient": bool(print_gradient),
             "fmt": {"summarise_threshold": summarise_threshold, "edge_items": edge_items,
                     "max_line_width": max_line_width, "digits": digits,
                     "float_format": float_format, "separator": separator,
                     "open_bracket": open_bracket, "close_bracket": close_bracket}}
    return add_op("PrintTensor", "print_tensor", [t],
                  [Out("print_out", t.shape, t.dtype, t.meta_shape)], attrs)[0]


def ipu_copy(t: Tensor, destination: int, source: Optional[int] = None) -> Tensor:
    """Copy `t` to IPU `destination` (numerically an identity; no gradient upstream).

    `source` defaults to the IPU of `t`'s producer (for a tensor without one, such as a variable,
    the IPU of the ops that consume it; with none, `source` must be given, as upstream). The
    source and destination must differ. The output is named `<name>_c<destination>`.
    """
    check_tensor(t, "ipu_copy", "t")
    if isinstance(destination, bool) or not isinstance(destination, int) or destination < 0:
        raise ValueError(f"ipu_copy: destination must be a non-negative int, got {destination!r}")
    if source is None:
        source = _inferred_ipu(t)
        if source is None:
            raise ValueError(f'Could not infer the ipu for Tensor to be copied "{t}" . Please '
                             f'specify `source` when copying for this tensor.')
    elif isinstance(source, bool) or not isinstance(source, int) or source < 0:
        raise ValueError(f"ipu_copy: source must be a non-negative int, got {source!r}")
    if source == destination:
        raise ValueError(f"ipu_copy: tensor '{t.id}' is already on IPU {source}: an IPU copy "
                         f"moves a tensor from one IPU to another (source {source}, destination "
                         f"{destination})")
    with context.ipu(destination):
        return add_op("IpuCopy", "ipu_copy", [t],
                      [Out(f"{t.name}_c{destination}", t.shape, t.dtype, t.meta_shape)],
                      {"source": source, "destination": destination})[0]


def io_tile_copy(t: Tensor) -> Tensor:
    """Copy `t` between the compute and IO tile sets (numerically an identity; no gradient)."""
    check_tensor(t, "io_tile_copy", "t")
    return add_op("IoTileCopy", "io_tile_copy", [t],
                  [Out("io_tile_copy_out", t.shape, t.dtype, t.meta_shape)])[0]


def identity(t: Tensor, output_name: Optional[str] = None) -> Tensor:
    """A copy of `t` (output named `identity_<name>` unless given)."""
    check_tensor(t, "identity", "t")
    return add_op("Identity", "identity", [t],
                  [Out(output_name or f"identity_{t.name}", t.shape, t.dtype, t.meta_shape)])[0]


rename = identity


def detach(t: Tensor) -> Tensor:
    """`t`'s value, with no gradient flowing back through it."""
    check_tensor(t, "detach", "t")
    return add_op("Detach", "detach", [t], [Out("detach_out", t.shape, t.dtype, t.meta_shape)])[0]


def detach_(t: Tensor) -> Tensor:
    """In-place (aliasing) detach."""
    check_tensor(t, "detach_", "t")
    return add_op("DetachInplace", "detach_inplace", [t],
                  [Out("detach_inplace_out", t.shape, t.dtype, t.meta_shape)])[0]


def cast(t: Tensor, data_type: dtypes.dtype) -> Tensor:
    """`t` converted to `data_type` (float to int truncates toward zero)."""
    check_tensor(t, "cast", "t")
    d = dtypes.dtype.as_dtype(data_type)
    if d in dtypes.FLOAT8_DTYPES:
        raise TypeError(f"Data type {d} not supported for popxl.ops.cast, please consider "
                        f"pow2scale_cast_to_fp8 or pow2scale_cast_from_fp8")
    return add_op("Cast", "cast", [t], [Out(f"{t.name}_{d.name}", t.shape, d, t.meta_shape)],
                  {"to": d.name})[0]
