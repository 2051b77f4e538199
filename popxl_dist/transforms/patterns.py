"""PopART's OpToIdentity pattern, the one pre-alias pattern with a numerical meaning here.

Some ops exist only for their gradient: a replicated all-reduce with `identical_inputs` is an
identity in the forward pass and an all-reduce in the backward pass. Upstream's C++ op cannot run
as it is; the OpToIdentity pattern (part of the "default" and "all" pattern levels, not of the
"minimal" level a Session applies) replaces it with an `Identity`, and a Session refuses an IR
in which such an op is left. `popxl_addons.transforms.autodiff` applies the pattern to the
gradient graphs it builds and `popxl_addons.patterns.apply_pre_alias_patterns` to a whole IR.

Every other pre-alias pattern only changes op types (e.g. in-place variants) and is not modelled.
"""
from __future__ import annotations

from typing import Callable, Dict

from .._ir.records import GraphData, IrData, Op
from ..errors import popart_exception
from ..graph import Graph

__all__ = ["OP_TO_IDENTITY", "OP_TO_IDENTITY_MESSAGE", "PATTERN_LEVELS", "op_to_identity",
           "apply_pre_alias_patterns", "check_op_to_identity_applied"]

OP_TO_IDENTITY_MESSAGE = "You need to run the `OpToIdentityPattern` pattern before running the IR."

# op type -> predicate: the op must be replaced by an identity before the IR can run
OP_TO_IDENTITY: Dict[str, Callable[[Op], bool]] = {
    "ReplicatedAllReduceTP": lambda op: bool(op.attrs.get("identical_inputs")),
    "ReplicatedAllReduceStrided": lambda op: bool(op.attrs.get("identical_inputs")),
}


def _replaceable(op: Op) -> bool:
    when = OP_TO_IDENTITY.get(op.type)
    return when is not None and when(op)


def op_to_identity(gd: GraphData) -> int:
    """Replace every op of `gd` that the pattern applies to by an `Identity` of its first input
    (same id, name and output). Returns the number of ops replaced."""
    n = 0
    for op in gd.ops:
        if _replaceable(op):
            op.type = "Identity"
            op.inputs = op.inputs[:1]
            op.attrs = {}
            n += 1
    return n


PATTERN_LEVELS = ("no_patterns", "minimal", "default", "all")
_WITH_OP_TO_IDENTITY = ("default", "all")


def apply_pre_alias_patterns(graph: Graph, level: str = "default") -> int:
    """Apply the pre-alias patterns of `level` to `graph`: OpToIdentity for "default" and
    "all", nothing for "minimal" and "no_patterns". Returns the number of ops replaced."""
    if level not in PATTERN_LEVELS:
        raise ValueError(f"apply_pre_alias_patterns: level must be one of {PATTERN_LEVELS}, "
                         f"got {level!r}")
    if not isinstance(graph, Graph):
        raise TypeError(f"apply_pre_alias_patterns: expected a popxl.Graph, got "
                        f"{type(graph).__name__}")
    return op_to_identity(graph._data) if level in _WITH_OP_TO_IDENTITY else 0


def check_op_to_identity_applied(ir: IrData) -> None:
    """Raise (as upstream's Session does) if an op that needs the pattern is still in the IR."""
    for gd in ir.graphs.values():
        for op in gd.ops:
            if _replaceable(op):
                raise popart_exception(f"{OP_TO_IDENTITY_MESSAGE} ({op.describe()} in graph "
                                   f"'{gd.id or 'main'}')")
