"""Pre-alias patterns on a whole IR (upstream `popxl_addons.patterns`).

Of PopART's pre-alias patterns only OpToIdentity changes what a program computes here: it turns
the `*_identical_inputs` all-reduces (forward identity, gradient all-reduce) into identities,
which a Session requires. The other patterns only change op types (e.g. in-place variants) and
are not modelled. Apply the patterns after autodiff: an all-reduce replaced by an identity before
autodiff would differentiate as an identity.
"""
from __future__ import annotations

import enum

import popxl
from popxl.transforms.patterns import apply_pre_alias_patterns as _apply_to_graph

__all__ = ["PatternsLevel", "patterns_level", "apply_pre_alias_patterns"]


class PatternsLevel(enum.Enum):
    """Stand-in for upstream's `_ir.patterns.PatternsLevel`."""

    NoPatterns = "no_patterns"
    Minimal = "minimal"
    Default = "default"
    All = "all"


patterns_level = {level.value: level for level in PatternsLevel}


def apply_pre_alias_patterns(ir: popxl.Ir, level: str = "default") -> None:
    """Apply the pre-alias patterns of `level` to every graph of `ir`.

    Args:
        ir: the program; call this after building it (and after autodiff) whenever a
            `*_identical_inputs` collective is in a forward graph.
        level: "no_patterns", "minimal", "default" or "all". OpToIdentity belongs to "default"
            and "all" (not to "minimal", the level a Session applies itself).

    Example:
        >>> apply_pre_alias_patterns(ir, level="default")
        >>> session = popxl.Session(ir, "ipu_hw")
    """
    if not isinstance(ir, popxl.Ir):
        raise TypeError(f"apply_pre_alias_patterns: 'ir' must be a popxl.Ir, got "
                        f"{type(ir).__name__}")
    if level not in patterns_level:
        raise ValueError(f"apply_pre_alias_patterns: level must be one of "
                         f"{list(patterns_level)}, got {level!r}")
    for graph in ir._graph_cache.values():
        _apply_to_graph(graph, level)
