"""How "the same on every replica" flows through each op type: the table the replica-consistency
pass (`replica_consistency.py`) reads, beside the grad rules.

A value is described by a partition of the replicas: replicas in one block are known to hold
the same value (`(0, 0, 0, 0)`: the same everywhere; `(0, 1, 2, 3)`: nothing known). An op's
outputs are the same on two replicas when all its inputs are (`meet` of the inputs), except:

* host data (`HOST_DATA`): each replica loads its own, so nothing is known;
* collectives over a replica grouping (`GROUP_COMBINING`): every member of a group gets the same
  result, and two groups get the same result when their members' inputs agree position by
  position; `GROUP_SCATTERING` gives each member its own part of that result;
* the tensor-parallel ops that reduce statistics over a group (`GROUP_STATISTICS`): the outputs
  listed are the group's (combined), the others also depend on the replica's own shard;
* remote memory (`REMOTE_LOADS`, `REMOTE_STORES`): a buffer holds what was stored in it;
* optimiser updaters increment their step input in place from the step alone
  (`SELF_UPDATES`), whatever the gradients are;
* ops that set their output to a constant whatever their inputs (`CONSTANT_RESULT`: an
  accumulator zeroed by `accumulator_zero_` / `accumulator_scale_(t, 0)`): the same everywhere.

Op types not listed (all the element-wise, matmul, shape, random ... ops) follow the default.
"""
from __future__ import annotations

from typing import Callable, Dict, FrozenSet, Tuple

__all__ = ["HOST_DATA", "GROUP_COMBINING", "GROUP_SCATTERING", "GROUP_STATISTICS",
           "REMOTE_LOADS", "REMOTE_STORES", "IDENTITY_WHEN_IDENTICAL", "CONSTANT_RESULT",
           "SELF_UPDATES", "STORES"]

HOST_DATA: FrozenSet[str] = frozenset({"HostLoad"})

GROUP_COMBINING: FrozenSet[str] = frozenset({
    "ReplicatedAllReduce", "ReplicatedAllReduceInplace", "ReplicatedAllGather",
    "ReplicatedAllReduceStrided", "ReplicatedAllReduceTP", "CrossEntropySharded",
})

GROUP_SCATTERING: FrozenSet[str] = frozenset({"ReplicatedReduceScatter"})

# op type -> the output indices that are the group's statistics (the rest: per shard)
GROUP_STATISTICS: Dict[str, Tuple[int, ...]] = {
    "LayerNormDistributed": (1, 2),
    "LayerNormDistributedGrad": (),
}

# op type -> the input index of the remote-buffer offset
REMOTE_LOADS: Dict[str, int] = {"RemoteLoad": 1, "RemoteLoadInplace": 1}
REMOTE_STORES: Dict[str, Tuple[int, int]] = {"RemoteStore": (0, 1)}   # (value, offset)

# All-reduces flagged `identical_inputs` are identities in the forward pass (upstream's
# OpToIdentity pattern): their output is their input.
IDENTITY_WHEN_IDENTICAL: FrozenSet[str] = frozenset({"ReplicatedAllReduceTP",
                                                     "ReplicatedAllReduceStrided"})

# op type -> whether this op's result is a constant (the same everywhere), from its attributes
CONSTANT_RESULT: Dict[str, Callable] = {
    "AccumulatorScale": lambda attrs: attrs.get("f") == 0.0 and not attrs.get("f_tensor"),
}

# Op types whose in-place writes depend on the written input alone (the updaters' step: +1).
SELF_UPDATES: FrozenSet[str] = frozenset({"AdamUpdater", "LambUpdater", "AdaMaxUpdater"})

# Op types that store a value into their first input (op type -> the stored value's input):
# a store of data not computed from the written variable itself leaves no difference behind
# that a later run would inherit from the variable (see replica_consistency.py).
STORES: Dict[str, int] = {"CopyVarUpdate": 1, "DynamicUpdateInplace": 2}
