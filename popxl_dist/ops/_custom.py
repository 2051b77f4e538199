"""Builders of the single-replica ops that upstream implements as popxl.addons C++ custom ops:
rotary positional embedding, group-quantised weight decompression, the linear tile layout and
the dense x constant-sparse matmul. `popxl_addons` wraps them under upstream's names; kernels
are in `engine/kernels/custom.py`, grad rules in `transforms/grads/custom.py`.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from .. import dtypes
from ..tensor import Tensor, constant
from ._builder import Out, add_op, check_float_tensors, check_tensor

__all__ = ["rotary_pos_embed", "check_rotary_args", "group_quantize_decompress",
           "linear_layout", "dense_const_sparse_matmul"]

_FLOATS = (dtypes.float32, dtypes.float16)


def check_rotary_args(opname: str, t, sin, cos, rotary_dim) -> int:
    """Check RoPE's arguments (Tensors or TensorSpecs: `.shape`, `.dtype`); the rotary_dim.

    `t` is `(batch, seq, heads, head_dim)`; `sin` / `cos` are `(1 or batch, seq, rotary_dim //
    2)`, or any table that broadcasts to `(batch, seq, rotary_dim // 2)` without growing it, of
    `t`'s dtype; `rotary_dim` is even and at most `head_dim`."""
    def name(x) -> str:
        return f"'{x.id}' {x.shape}" if isinstance(x, Tensor) else f"{tuple(x.shape)}"

    for argname, x in (("t", t), ("sin", sin), ("cos", cos)):
        if x.dtype not in _FLOATS:
            raise TypeError(f"{opname}: {argname} {name(x)} must be float32 or float16, got "
                            f"{x.dtype.name}")
    if len(t.shape) != 4:
        raise ValueError(f"{opname}: {name(t)} must have rank 4 (batch, seq, heads, head_dim)")
    if len(sin.shape) != 3 or len(cos.shape) != 3:
        raise ValueError(f"{opname}: sin and cos must have rank 3 (1 or batch, seq, "
                         f"rotary_dim // 2), got {name(sin)} and {name(cos)}")
    if sin.dtype != t.dtype or cos.dtype != t.dtype:
        raise TypeError(f"{opname}: sin and cos must have the dtype of {name(t)} "
                        f"({t.dtype.name}), got {sin.dtype.name} and {cos.dtype.name}")
    batch, seq, _, head = t.shape
    if (not isinstance(rotary_dim, (int, np.integer)) or isinstance(rotary_dim, bool)
            or rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head):
        raise ValueError(f"{opname}: rotary_dim must be an even int in [2, {head}] (head_dim "
                         f"of {name(t)}), got {rotary_dim!r}")
    rotary_dim = int(rotary_dim)
    want = (batch, seq, rotary_dim // 2)
    for table in (sin, cos):
        try:
            fits = np.broadcast_shapes(tuple(table.shape), want) == want
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"{opname}: {name(table)} does not broadcast to (batch, seq, "
                             f"rotary_dim // 2) = {want} for {name(t)} and rotary_dim "
                             f"{rotary_dim}")
    return rotary_dim


def rotary_pos_embed(t: Tensor, sin: Tensor, cos: Tensor, rotary_dim: int,
                     op_type: str = "RotaryPosEmbed", *, settings_name: Optional[str] = None,
                     out_ids: Optional[Sequence[str]] = None, notify: bool = True) -> Tensor:
    """Rotate the first `rotary_dim` features of `t` `(batch, seq, heads, head_dim)` by position,
    as interleaved (even, odd) pairs (op `RotaryPosEmbed`; `RotaryPosEmbedGrad` rotates back).
    See `check_rotary_args` for the shapes; `settings_name`, `out_ids` and `notify` are
    `add_op`'s (for `createOpInGraph`)."""
    opname = "rotary_pos_embed"
    check_float_tensors(opname, _FLOATS, t=t, sin=sin, cos=cos)
    rotary_dim = check_rotary_args(opname, t, sin, cos, rotary_dim)
    out = "t_rotated" if op_type == "RotaryPosEmbed" else "dt_rotated"
    return add_op(op_type, settings_name or f"{op_type}Op", [t, sin, cos],
                  [Out(out, t.shape, t.dtype, t.meta_shape)], {"rotary_dim": rotary_dim},
                  out_ids=out_ids, notify=notify)[0]


def group_quantize_decompress(t: Tensor, group_scale: Tensor, group_bias: Tensor,
                              dim: int = -1) -> Tensor:
    """Decompress 4-bit group-quantised values (op `GroupQuantizeDecompress`).

    `t` is uint16 `(*lead, G, group_size // 4)` (four 4-bit codes per word, lowest nibble
    first); `group_scale` / `group_bias` are `(*lead, G, 1)`. The output `(*lead, G *
    group_size)` with the grouped axis moved to `dim` has the scale's dtype."""
    opname = "group_quantize_decompress"
    for name, x in (("t", t), ("group_scale", group_scale), ("group_bias", group_bias)):
        check_tensor(x, opname, name)
    if t.dtype != dtypes.uint16:
        raise TypeError(f"{opname}: 't' must be uint16 (four 4-bit codes per element), got "
                        f"'{t.id}' {t.dtype.name}")
    if t.rank < 2:
        raise ValueError(f"{opname}: 't' must be (*lead, groups, group_size // 4), got "
                         f"'{t.id}' {t.shape}")
    want = t.shape[:-1] + (1,)
    for x in (group_scale, group_bias):
        if x.shape != want or x.dtype not in _FLOATS:
            raise ValueError(f"{opname}: '{x.id}' must be float16/float32 of shape {want} for "
                             f"'{t.id}' {t.shape}, got {x.shape} {x.dtype.name}")
    if group_bias.dtype != group_scale.dtype:
        raise TypeError(f"{opname}: group_scale and group_bias must have one dtype, got "
                        f"{group_scale.dtype.name} and {group_bias.dtype.name}")
    lead = t.shape[:-2]
    rank = len(lead) + 1
    if not isinstance(dim, int) or not -rank <= dim < rank:
        raise ValueError(f"{opname}: dim {dim!r} is out of range for an output of rank {rank}")
    dim %= rank
    n = t.shape[-2] * t.shape[-1] * 4
    shape = list(lead) + [n]
    shape.insert(dim, shape.pop())
    return add_op("GroupQuantizeDecompress", opname, [t, group_scale, group_bias],
                  [Out(f"{opname}_out", tuple(shape), group_scale.dtype)], {"dim": dim})[0]


def linear_layout(t: Tensor, bs: int = 1) -> Tensor:
    """`t` re-laid-out on the tiles for a matmul with `bs` grains (op `LinearLayout`):
    numerically an identity, gradient identity."""
    check_tensor(t, "linear_layout", "t")
    if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
        raise ValueError(f"linear_layout: bs must be a positive int, got {bs!r}")
    return add_op("LinearLayout", "linear_layout", [t],
                  [Out(f"{t.name}_linear_layout", t.shape, t.dtype, t.meta_shape)],
                  {"bs": bs})[0]


def csr_arrays(rhs) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Tuple[int, int]]:
    """(data, indices, indptr, shape) of any object with CSR `data/indices/indptr/shape`
    (e.g. a scipy.sparse.csr_matrix), checked."""
    try:
        data, indices, indptr = (np.asarray(rhs.data), np.asarray(rhs.indices),
                                 np.asarray(rhs.indptr))
        shape = tuple(int(s) for s in rhs.shape)
    except AttributeError:
        raise TypeError(f"dense_const_sparse_matmul: 'rhs' must be a CSR matrix (an object "
                        f"with data, indices, indptr and shape), got {type(rhs).__name__}"
                        ) from None
    if len(shape) != 2 or indptr.shape != (shape[0] + 1,) or data.shape != indices.shape \
            or data.ndim != 1 or int(indptr[-1]) != data.size or np.any(np.diff(indptr) < 0) \
            or (indices.size and (indices.min() < 0 or indices.max() >= shape[1])):
        raise ValueError(f"dense_const_sparse_matmul: 'rhs' is not a valid CSR matrix of shape "
                         f"{shape}: indptr {indptr.shape}, indices {indices.shape}, data "
                         f"{data.shape}")
    return data, indices.astype(np.int32), indptr.astype(np.int32), shape


def dense_const_sparse_matmul(lhs: Tensor, rhs, output_cols: int) -> Tensor:
    """`lhs @ rhs` with `rhs` a constant CSR matrix (op `DenseConstSparseMatMul`; its CSR
    arrays are constant inputs)."""
    opname = "dense_const_sparse_matmul"
    check_float_tensors(opname, _FLOATS, lhs=lhs)
    data, indices, indptr, shape = csr_arrays(rhs)
    if lhs.rank < 1 or lhs.shape[-1] != shape[0]:
        raise ValueError(f"{opname}: '{lhs.id}' {lhs.shape} @ sparse {shape}: inner dims "
                         f"differ")
    if output_cols != shape[1]:
        raise ValueError(f"{opname}: output_cols ({output_cols!r}) must equal the number of "
                         f"columns of the sparse matrix, {shape[1]}")
    ins = [lhs, constant(data.astype(lhs.dtype.as_numpy()), lhs.dtype, "sparse_values"),
           constant(indices, dtypes.int32, "sparse_col_indices"),
           constant(indptr, dtypes.int32, "sparse_row_ptr")]
    return add_op("DenseConstSparseMatMul", opname, ins,
                  [Out(f"{opname}_out", lhs.shape[:-1] + (shape[1],), lhs.dtype)],
                  {"rows": shape[0], "cols": shape[1]})[0]
