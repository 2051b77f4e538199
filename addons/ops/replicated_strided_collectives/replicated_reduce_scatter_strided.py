"""`replicated_reduce_scatter_strided`: reduce over a strided group, keep one chunk each."""
from __future__ import annotations

import popxl
from popxl import ops

from ._checks import check_group, check_reduce_op, check_tensor

__all__ = ["replicated_reduce_scatter_strided"]


def replicated_reduce_scatter_strided(
        t: popxl.Tensor, op: str = "add", group: popxl.ReplicaGrouping | None = None,
        configure_output_for_replicated_tensor_sharding: bool = False) -> popxl.Tensor:
    """Reduce the flattened `t` over its group and give each member its chunk.

    The reduction is zero-padded to a multiple of the group size and cut into contiguous
    chunks; rank i gets chunk i.

    Args:
        t: the tensor to reduce.
        op: "add" or "mean".
        group: constant-stride grouping (None: all replicas).
        configure_output_for_replicated_tensor_sharding: give the output `meta_shape = t.shape`.

    Returns:
        A 1-D tensor of `ceil(t.nelms / group_size)` elements.
    """
    opname = "replicated_reduce_scatter_strided"
    check_tensor(t, opname)
    op = check_reduce_op(op, opname)
    group = check_group(group, opname)
    return ops.collectives.replicated_reduce_scatter(
        t, op=op, group=group,
        configure_output_for_replicated_tensor_sharding=bool(
            configure_output_for_replicated_tensor_sharding))
