"""The `{index: tensor id}` dicts that C++ bindings' `createOpInGraph` takes for inputs and
outputs, as the list of ids in index order."""
from __future__ import annotations

from typing import Any, List

__all__ = ["index_map"]


def index_map(mapping: Any, what: str) -> List[str]:
    """{0: id, 1: id, ...} as a list (indices must be 0..n-1)."""
    if not isinstance(mapping, dict):
        raise TypeError(f"{what} must be a dict {{index: tensor id}}, got "
                        f"{type(mapping).__name__}")
    keys = sorted(mapping)
    if keys != list(range(len(keys))):
        raise ValueError(f"{what}: indices must be 0..{len(keys) - 1}, got {keys}")
    return [str(mapping[k]) for k in keys]

