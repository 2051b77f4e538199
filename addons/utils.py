"""Small helpers shared by popxl_addons: the printable `OrderedDict`, `peekable`, `timer`, ..."""
from __future__ import annotations

import contextlib
import logging
import re
import time
import typing
from collections.abc import MutableMapping
from typing import Any, Callable, Iterable, Iterator, List, Optional

import numpy as np

import popxl

__all__ = ["OrderedDict", "WeightsDict", "timer", "suffix_graph_name", "overrides",
           "duplicate_items", "null_context", "peekable", "WANDB_IMPORTED"]

logger = logging.getLogger("popxl_addons")
# Upstream logs `timer` results to Weights & Biases when wandb imports; the emulator never does
# (no network), so `timer(..., log_to_wandb=True)` only logs locally.
WANDB_IMPORTED = False
E = typing.TypeVar("E")


class OrderedDict(dict):
    """An insertion-ordered dict (as upstream's `popxl_addons.utils.OrderedDict`).

    It subclasses `dict` so that `.keys()` prints as `dict_keys([...])`. Its repr is one
    `key: value,` line per entry; `idx(i)` returns the i-th value.
    """

    def __repr__(self) -> str:
        if not self:
            return "{}"
        return "{\n" + "".join(f"{k}: {v!r},\n" for k, v in self.items()) + "}"

    def idx(self, idx: int) -> Any:
        return list(self.values())[idx]


class WeightsDict(MutableMapping):
    """A mapping {popxl Variable: np.ndarray} that checks dtype and host shape on insertion
    (also for the initial `*args, **kwargs`, as `dict(...)`). The data is in `.dict`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.dict: dict = {}
        self.update(dict(*args, **kwargs))

    def __getitem__(self, key: popxl.Tensor) -> np.ndarray:
        return self.dict[key]

    def __setitem__(self, key: popxl.Tensor, value: Any) -> None:
        if not isinstance(key, popxl.Tensor):
            raise TypeError(f"WeightsDict keys must be popxl Variables, got {type(key).__name__}")
        arr = np.asarray(value)
        want = getattr(key, "shape_on_host", key.shape)
        if arr.dtype != key.dtype.as_numpy():
            raise ValueError(f"WeightsDict: '{key.name}' has dtype {key.dtype.name}, the data "
                             f"has dtype {arr.dtype}")
        if tuple(arr.shape) != tuple(want):
            raise ValueError(f"WeightsDict: '{key.name}' has host shape {tuple(want)}, the data "
                             f"has shape {arr.shape}")
        self.dict[key] = arr

    def __delitem__(self, key: popxl.Tensor) -> None:
        del self.dict[key]

    def __len__(self) -> int:
        return len(self.dict)

    def __iter__(self) -> Iterator[popxl.Tensor]:
        return iter(self.dict)

    def __repr__(self) -> str:
        return f"WeightsDict({self.dict!r})"


@contextlib.contextmanager
def timer(title: Optional[str] = None, log_to_wandb: bool = True) -> Iterator[None]:
    """Log the elapsed wall time (in minutes) of the block."""
    start = time.perf_counter()
    try:
        yield
    finally:
        mins = (time.perf_counter() - start) / 60
        logger.info(f"{title or 'Duration'}: {mins:.2f} mins")


def suffix_graph_name(name: str, suffix: str) -> str:
    """`Linear_subgraph(3)`, `grad` -> `Linear_grad`."""
    return re.sub(r"_subgraph\(\d+\)$", "", name) + f"_{suffix}"


def overrides(cls: type, base_cls: type, method: str) -> bool:
    """Whether `cls` (a subclass of `base_cls`) overrides `base_cls.<method>`."""
    return getattr(cls, method, None) is not getattr(base_cls, method, None)


def duplicate_items(iterable: Iterable) -> List:
    """Items that occur more than once, in first-occurrence order."""
    seen, dups = [], []
    for x in iterable:
        if x in seen:
            if x not in dups:
                dups.append(x)
        else:
            seen.append(x)
    return dups


@contextlib.contextmanager
def null_context() -> Iterator[None]:
    yield


_MISSING = object()


class peekable:
    """A tiny `more_itertools.peekable`: an iterator whose next item can be looked at first."""

    def __init__(self, iterable: Iterable):
        self._it = iter(iterable)
        self._cache = _MISSING

    def __iter__(self) -> "peekable":
        return self

    def peek(self, default: Any = _MISSING) -> Any:
        if self._cache is _MISSING:
            try:
                self._cache = next(self._it)
            except StopIteration:
                if default is _MISSING:
                    raise
                return default
        return self._cache

    def __next__(self) -> Any:
        if self._cache is not _MISSING:
            v, self._cache = self._cache, _MISSING
            return v
        return next(self._it)


def repeatfunc(fn: Callable[[], Any]) -> Iterator[Any]:
    """Call `fn` forever (`more_itertools.repeatfunc`)."""
    while True:
        yield fn()
