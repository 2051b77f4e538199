"""`popxl.ops.random_seed`: derive new random seeds on the device."""
from __future__ import annotations

from typing import Union

from .. import dtypes
from ..tensor import Tensor, constant
from ._builder import Out, add_op, check_tensor

__all__ = ["create_random_seed"]


def create_random_seed(seed: Tensor, modifier: Union[int, Tensor]) -> Tensor:
    """A new uint32 (2,) seed derived deterministically from `seed` and `modifier`.

    Args:
        seed: uint32 tensor of shape (2,).
        modifier: uint32 scalar (a Tensor, or an int made a uint32 constant).
    Returns:
        The modified seed (op type ModifyRandomSeed).
    """
    check_tensor(seed, "create_random_seed", "seed")
    if seed.dtype != dtypes.uint32 or seed.shape != (2,):
        raise ValueError(f"seed Tensor must be shape=(2,) dtype=uint32. Provided {seed} "
                         f"(create_random_seed: {seed.dtype.name} {seed.shape})")
    if not isinstance(modifier, Tensor):
        if not isinstance(modifier, int) or isinstance(modifier, bool) or modifier < 0:
            raise TypeError(f"create_random_seed: 'modifier' must be a non-negative int or a "
                            f"uint32 scalar Tensor, got {modifier!r}")
        modifier = constant(modifier, dtypes.uint32, "modifier")
    elif modifier.dtype != dtypes.uint32 or modifier.nelms != 1:
        raise ValueError(f"create_random_seed: 'modifier' '{modifier.id}' must be a uint32 scalar, "
                         f"got {modifier.dtype.name} {modifier.shape}")
    return add_op("ModifyRandomSeed", "modify_random_seed", [seed, modifier],
                  [Out("modified_random_seed", (2,), dtypes.uint32)])[0]
