"""Builder: matmul (NumPy matmul rules, including 1-D operands and batch broadcasting)."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .. import dtypes
from ..errors import OpSetupError, OpSetupTypeError
from ..tensor import Tensor
from ._builder import Out, add_op, check_same_dtype, check_tensor

_MATMUL_FLOATS = (dtypes.float16, dtypes.float32)
# float64 (which upstream's host conversions downcast away) stays available for checking
# gradients; integer and bool operands are refused as on the IPU
_MATMUL_OPERANDS = _MATMUL_FLOATS + (dtypes.float64,)

__all__ = ["matmul", "matmul_pow2scaled"]


def _matmul_shape(lhs: Tensor, rhs: Tensor) -> Tuple[int, ...]:
    """The output shape (NumPy's matmul rules); PopART's errors (`OpSetupError`, a
    popart_exception) for scalars and unequal contracting dimensions."""
    a, b = lhs.shape, rhs.shape
    for side, t in (("lhs", lhs), ("rhs", rhs)):
        if not t.shape:
            raise OpSetupError(f"MatMul doesn't support scalar tensor '{t.id}' as the {side} "
                               f"input (matmul: '{lhs.id}' {a} @ '{rhs.id}' {b})")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise OpSetupError(f"MatMul contracting dimensions unequal: lhs '{lhs.id}' {list(a)}, "
                           f"rhs '{rhs.id}' {list(b)} (matmul: inner dims {a2[-1]} vs "
                           f"{b2[-2]})")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise OpSetupError(f"matmul: '{lhs.id}' {a} @ '{rhs.id}' {b}: batch dims cannot be "
                           f"broadcast") from None
    out = tuple(batch) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def matmul(lhs: Tensor, rhs: Tensor, available_memory_proportion: Optional[float] = None,
           output_type: Optional[dtypes.dtype] = None,
           partials_type: Optional[dtypes.dtype] = None) -> Tensor:
    """Matrix product with `np.matmul` semantics. float16 accumulates in float32.

    Example:
        >>> y = ops.matmul(x, w)   # (2, 4) @ (4, 32) -> (2, 32)
    """
    check_tensor(lhs, "matmul", "lhs")
    check_tensor(rhs, "matmul", "rhs")
    if lhs.dtype != rhs.dtype and {lhs.dtype, rhs.dtype} <= set(_MATMUL_OPERANDS):
        # float16 with float32 builds, as upstream (the output takes lhs's dtype); the
        # Session refuses it (session_checks.check_op_setups)
        d = lhs.dtype
    else:
        d = check_same_dtype("matmul", lhs, rhs)
    if d in dtypes.FLOAT8_DTYPES:
        raise TypeError(f"matmul: '{lhs.id}' and '{rhs.id}' are {d.name}: use "
                        f"matmul_pow2scaled for float8 operands")
    if d not in _MATMUL_OPERANDS:
        raise OpSetupTypeError(f"matmul: '{lhs.id}' and '{rhs.id}' are {d.name}; the IPU's "
                               f"matmul takes float16 or float32 operands")
    if partials_type is not None and partials_type not in _MATMUL_FLOATS:
        raise ValueError(f"dtype {partials_type} is not valid, must be float16 or float32 "
                         f"(matmul partials_type)")
    if partials_type is None:     # as upstream: the Ir's SessionOptions.partialsTypeMatMuls
        opt = str(lhs.ir._session_opts().partialsTypeMatMuls).lower()
        if opt not in ("", "float", "half"):
            raise ValueError(f"str {opt} is not valid, must be 'float' or 'half' "
                             f"(SessionOptions.partialsTypeMatMuls)")
    shape = _matmul_shape(lhs, rhs)
    out_d = dtypes.dtype.as_dtype(output_type) if output_type is not None else d
    if out_d not in _MATMUL_OPERANDS:
        raise OpSetupTypeError(f"matmul: output_type must be float16 or float32, got "
                               f"{out_d!r}")
    return add_op("MatMul", "matmul", [lhs, rhs], [Out("matmul_out", shape, out_d)],
                  {"output_type": out_d.name})[0]


def matmul_pow2scaled(lhs: Tensor, rhs: Tensor, log2_scale: Tensor,
                      available_memory_proportion: Optional[float] = None) -> Tensor:
    """`(lhs @ rhs) * 2^log2_scale` for float8 operands, as float16.

    The product of the decoded (exact) values accumulates in float32, is scaled, and is
    rounded once to float16 (the IPU also accumulates float8 products in higher precision).

    Args:
        lhs, rhs: float8 tensors (float8_143 and float8_152 may be mixed), `np.matmul` shapes.
        log2_scale: an int32 scalar tensor (a Python int is accepted and made a constant).

    Returns:
        The float16 product (op type `MatMul` with 3 inputs).
    """
    from .float8 import check_float8_operands, log2_scale_tensor

    name = "matmul_pow2scaled"
    check_float8_operands(name, "matmul", lhs=lhs, rhs=rhs)
    s = log2_scale_tensor(name, log2_scale)
    shape = _matmul_shape(lhs, rhs)
    return add_op("MatMul", name, [lhs, rhs, s], [Out("matmul_out", shape, dtypes.float16)],
                  {"output_type": dtypes.float16.name})[0]
