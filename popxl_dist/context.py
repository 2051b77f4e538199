"""Build-time context: the graph stack, name scopes, ipu / tile-set / execution-context settings."""
from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Callable, Iterator, List, Union

if TYPE_CHECKING:
    from .graph import Graph
    from .ir import Ir

__all__ = ["get_current_graph", "gcg", "get_main_graph", "gmg", "get_ir", "gir", "in_sequence",
           "name_scope", "ipu", "io_tiles", "get_current_context", "op_debug_context",
           "debug_context_frame_offset"]


class Context:
    """Process-wide build state. `get_current_context()` returns the single instance."""

    def __init__(self) -> None:
        self.graphs: List["Graph"] = []
        self.name_scopes: List[str] = []
        self.ipu_id = 0
        self.tile_set = "compute"
        self.execution_context = "Normal"
        self.in_sequence_stack: List[Union[bool, str]] = []

    @property
    def graph(self) -> "Graph":
        if not self.graphs:
            raise RuntimeError(
                "Trying to access a graph, but no graph has been selected: create ops inside "
                "`with ir.main_graph:` or another graph's context")
        return self.graphs[-1]

    def push_graph(self, g: "Graph") -> None:
        if self.graphs and self.graphs[-1].ir is not g.ir:
            raise RuntimeError(
                f"Cannot enter graph '{g.id}' of {g.ir!r} while a graph of "
                f"{self.graphs[-1].ir!r} is the current graph")
        self.graphs.append(g)

    def pop_graph(self) -> None:
        self.graphs.pop()

    def scoped_name(self, name: str) -> str:
        return "/".join(self.name_scopes + [name]) if self.name_scopes else name

    def _get_op_settings(self, name: str) -> dict:
        return {"name": self.scoped_name(name), "ipu": self.ipu_id, "tile_set": self.tile_set,
                "exec_ctx": self.execution_context}

    def register_op_created_hook(self, fn: Callable) -> int:
        return self.graph.register_op_created_hook(fn)


_CONTEXT = Context()


def get_current_context() -> Context:
    return _CONTEXT


def get_current_graph() -> "Graph":
    """The graph new ops are added to (`RuntimeError` if none is open)."""
    return _CONTEXT.graph


def get_main_graph() -> "Graph":
    """The main graph of the current IR."""
    return _CONTEXT.graph.ir.main_graph


def get_ir() -> "Ir":
    """The IR of the current graph."""
    return _CONTEXT.graph.ir


gcg = get_current_graph
gmg = get_main_graph
gir = get_ir


@contextlib.contextmanager
def in_sequence(enabled: Union[bool, str] = True) -> Iterator[None]:
    """Force ops created inside to run in creation order.

    The emulator always executes ops in creation order (a valid schedule, and the one upstream
    compiles whenever it accepts the program), so this only validates its argument and records
    the mode. Usable as a decorator too.
    """
    if enabled is None or not isinstance(enabled, (bool, str)) or (
            isinstance(enabled, str) and enabled != "pass"):
        raise TypeError(f"in_sequence: `enabled` must be True, False or 'pass', got {enabled!r}")
    _CONTEXT.in_sequence_stack.append(enabled)
    try:
        yield
    finally:
        _CONTEXT.in_sequence_stack.pop()


@contextlib.contextmanager
def name_scope(name: str) -> Iterator[None]:
    """Prefix `name/` to the names of tensors and ops created inside."""
    _CONTEXT.name_scopes.append(name)
    try:
        yield
    finally:
        _CONTEXT.name_scopes.pop()


@contextlib.contextmanager
def ipu(ipu: int) -> Iterator[None]:
    """Place ops created inside on virtual IPU `ipu` (numerically irrelevant in the emulator)."""
    if not isinstance(ipu, int) or ipu < 0:
        raise ValueError(f"ipu: the IPU index must be a non-negative int, got {ipu!r}")
    prev = _CONTEXT.ipu_id
    _CONTEXT.ipu_id = ipu
    try:
        yield
    finally:
        _CONTEXT.ipu_id = prev


@contextlib.contextmanager
def io_tiles() -> Iterator[None]:
    """Place ops created inside on the IO tile set (numerically irrelevant in the emulator)."""
    prev = _CONTEXT.tile_set
    _CONTEXT.tile_set = "io"
    try:
        yield
    finally:
        _CONTEXT.tile_set = prev


@contextlib.contextmanager
def _execution_context(ctx) -> Iterator[None]:
    """Create ops in another execution context (e.g. WeightsFromHostFragment)."""
    prev = _CONTEXT.execution_context
    _CONTEXT.execution_context = getattr(ctx, "name", str(ctx))
    try:
        yield
    finally:
        _CONTEXT.execution_context = prev


@contextlib.contextmanager
def debug_context_frame_offset(i: int) -> Iterator[None]:
    """Accepted for compatibility; debug info is taken from the first frame outside popxl."""
    yield


def op_debug_context(name_or_fn):
    """Decorator used by custom ops: accepted for compatibility, adds nothing."""
    if callable(name_or_fn):
        return name_or_fn

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*a, **k)
        return wrapper
    return deco
