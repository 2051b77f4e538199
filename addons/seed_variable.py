"""`seed_variable`: a random seed that lives on the device and is saved with the weights."""
from __future__ import annotations

from typing import Optional, Tuple

import popxl
from popxl import ops
from popxl.context import _execution_context

__all__ = ["seed_variable"]


def seed_variable(seed: int, replica_grouping: Optional[popxl.ReplicaGrouping] = None
                  ) -> Tuple[popxl.Variable, popxl.Tensor]:
    """A device seed per replica group, kept in a remote buffer between sessions.

    The seeds are `popxl.create_seeds(seed, replicas=num_groups)` in a remote variable named
    "random_seed" (host shape `(num_groups, 2)`, or `(2,)` for one group). The main graph loads
    it in the WeightsFromHost fragment and stores it back in the WeightsToHost fragment, so the
    returned tensor is persistent device state: update it in place (e.g. with
    `ops.var_updates.copy_var_update_`) and `session.get_tensor_data(seed_var)` follows.

    Args:
        seed: the host seed.
        replica_grouping: replicas sharing a seed (default `group_size=1`: one per replica).

    Returns:
        `(seed_var, seed_tensor)`: the remote variable and the uint32 (2,) seed on the device.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed_variable: 'seed' must be an int, got {seed!r}")
    ir = popxl.gcg().ir
    rg = replica_grouping if replica_grouping is not None else ir.replica_grouping(group_size=1)
    buffer = popxl.remote_buffer((2,), popxl.uint32, 1)
    data = popxl.create_seeds(seed, replicas=rg.num_groups)
    seed_var = popxl.remote_variable(data, buffer, 0, popxl.uint32, "random_seed",
                                     replica_grouping=rg)
    with _execution_context(popxl.ExecutionContext.WeightsFromHostFragment):
        seed_tensor = ops.remote_load(buffer, 0, "random_seed")
    with _execution_context(popxl.ExecutionContext.WeightsToHostFragment):
        ops.remote_store(buffer, 0, seed_tensor)
    return seed_var, seed_tensor
