"""Grad rules: the var_updates ops have none (they modify their input in place, as upstream)."""
from __future__ import annotations

from ..grad_registry import no_grad

__all__: list = []   # registrations only

no_grad("Accumulate", "AccumulatorScale", "SparseAccumulate", "CopyVarUpdate", "AdamUpdater",
        "LambUpdater", "AdaMaxUpdater", "AdamVarUpdate")
