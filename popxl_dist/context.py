"""Build-time context: the graph stack, name scopes, ipu / tile-set / execution-context settings."""
from __future__ import annotations

import contextlib
import inspect
from typing import (TYPE_CHECKING, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple,
                    TypeVar, Union)

if TYPE_CHECKING:
    from .graph import Graph
    from .ir import Ir

__all__ = ["get_current_graph", "gcg", "get_main_graph", "gmg", "get_ir", "gir", "in_sequence",
           "name_scope", "ipu", "io_tiles", "get_current_context", "op_debug_context",
           "debug_context_frame_offset", "get_source_location", "Context", "InSequenceKey",
           "SourceLocation"]

# (graph id, execution context): where in_sequence order is kept (upstream's key type)
InSequenceKey = Tuple[str, str]
Fn = TypeVar("Fn")


class Context:
    """Process-wide build state. `get_current_context()` returns the single instance."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """Forget all build state (graphs, scopes, placement, hooks)."""
        self.graphs: List["Graph"] = []
        self.name_scopes: List[str] = []
        self.ipu_id = 0
        self.tile_set = "compute"
        self.execution_context = "Normal"
        self.in_sequence_stack: List[Union[bool, str]] = []
        self._hooks: Dict[int, Callable] = {}
        self._next_hook = 0
        # (ir id, graph id, execution context) -> id of the last op created in sequence
        self._previous_ops: Dict[Tuple[int, str, str], int] = {}

    @property
    def graph(self) -> "Graph":
        if not self.graphs:
            raise RuntimeError(
                "Trying to access a graph, but no graph has been selected. Hint - try performing "
                "the operations in a context manager (e.g. `with graph_instance:`) or inside of a "
                "function that's called by `popxl.Ir().create_graph()`")
        return self.graphs[-1]

    @property
    def main_graph(self) -> "Graph":
        return self.graph.main_graph

    @property
    def ir(self) -> "Ir":
        return self.graph.ir

    @property
    def io_tile_set(self) -> bool:
        """Whether ops are being placed on the IO tile set (inside `io_tiles()`)."""
        return self.tile_set == "io"

    @property
    def in_sequence(self) -> Optional[bool]:
        """The innermost `in_sequence` mode (None outside any, "pass" blocks are skipped)."""
        for mode in reversed(self.in_sequence_stack):
            if mode != "pass":
                return bool(mode)
        return None

    @in_sequence.setter
    def in_sequence(self, mode: Optional[bool]) -> None:
        self.in_sequence_stack = [] if mode is None else [bool(mode)]

    def push_graph(self, g: "Graph") -> None:
        if self.graphs and self.graphs[-1].ir is not g.ir:
            raise RuntimeError(
                f"Trying to a create a context manager nested in another context, when the "
                f"previous context's Ir is different. {self.graphs[-1].ir} != {g.ir} (graph "
                f"'{g.id}' entered while a graph of another Ir is the current graph)")
        self.graphs.append(g)

    def pop_graph(self) -> None:
        self.graphs.pop()

    def push_name_scope(self, name: str) -> None:
        self.name_scopes.append(name)

    def pop_name_scope(self) -> None:
        self.name_scopes.pop()

    def scoped_name(self, name: str) -> str:
        return "/".join(self.name_scopes + [name]) if self.name_scopes else name

    def _get_op_settings(self, name: str) -> dict:
        return {"name": self.scoped_name(name), "ipu": self.ipu_id, "tile_set": self.tile_set,
                "exec_ctx": self.execution_context}

    # --- op-created hooks ----------------------------------------------------------------
    def register_op_created_hook(self, fn: Callable) -> int:
        """Call `fn(op)` (an `_ir.Op` view) for every op created in any graph; returns a
        handle for `remove_op_created_hook`."""
        handle = self._next_hook
        self._next_hook += 1
        self._hooks[handle] = fn
        return handle

    def remove_op_created_hook(self, handle: int) -> None:
        if handle not in self._hooks:
            raise ValueError(f"Unknown op created hook {handle}")
        del self._hooks[handle]

    def _op_created(self, op) -> None:
        """Run the hooks for a new op (an `_ir.Op` view) and record in_sequence order."""
        for fn in list(self._hooks.values()):
            fn(op)
        self._add_in_sequence_topocons(op)

    def _add_in_sequence_topocons(self, op) -> None:
        """Inside `in_sequence(True)`, constrain `op` to run after the previous sequenced op of
        its graph and execution context (recorded in the graph's topo constraints; the engine's
        creation-order schedule satisfies them)."""
        mode = self.in_sequence
        if mode is None:
            return
        graph = op._graph
        key = (graph.ir.id, graph.id, op._op.exec_ctx)
        prev = self._previous_ops.get(key)
        if mode and prev is not None:
            graph._data.topo_cons.append((prev, op.id, False))
        if mode:
            self._previous_ops[key] = op.id


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
def in_sequence(mode: Union[bool, str] = True) -> Iterator[None]:
    """Force ops created inside to run in creation order.

    The emulator always executes ops in creation order (a valid schedule, and the one upstream
    compiles whenever it accepts the program); the constraints are recorded in the graph.
    `mode` is True, False (no order among the block's ops) or "pass" (keep the enclosing
    mode). Usable as a decorator too.
    """
    if mode is None:
        raise TypeError("`None` cannot be passed to `in_sequence`. Try `False` instead.")
    if not isinstance(mode, (bool, str)) or (isinstance(mode, str) and mode != "pass"):
        raise ValueError(f"`in_sequence` mode not understood: {mode}. Must be one of `True`, "
                         f"`False`, `'pass'`.")
    _CONTEXT.in_sequence_stack.append(mode)
    try:
        yield
    finally:
        _CONTEXT.in_sequence_stack.pop()


@contextlib.contextmanager
def name_scope(name: str) -> Iterator[None]:
    """Prefix `name/` to the names of tensors and ops created inside."""
    _CONTEXT.push_name_scope(name)
    try:
        yield
    finally:
        _CONTEXT.pop_name_scope()


@contextlib.contextmanager
def ipu(ipu: Optional[int]) -> Iterator[None]:
    """Place ops created inside on virtual IPU `ipu` (numerically irrelevant in the emulator);
    None leaves them unplaced, as upstream (their outputs then have no IPU)."""
    if ipu is not None and (not isinstance(ipu, int) or isinstance(ipu, bool) or ipu < 0):
        raise ValueError(f"ipu: the IPU index must be a non-negative int or None, got {ipu!r}")
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
def _execution_context(execution_context) -> Iterator[None]:
    """Create ops in another execution context (an `ExecutionContext` or its name, e.g.
    "WeightsFromHostFragment")."""
    prev = _CONTEXT.execution_context
    _CONTEXT.execution_context = getattr(execution_context, "name", str(execution_context))
    try:
        yield
    finally:
        _CONTEXT.execution_context = prev


@contextlib.contextmanager
def debug_context_frame_offset(i: int) -> Iterator[None]:
    """Accepted for compatibility; debug info is taken from the first frame outside popxl."""
    yield


def op_debug_context(name):
    """Decorator for op builders, as `@op_debug_context("name")` or bare `@op_debug_context`.

    Upstream it opens a PopART debug context; here debug info (where the user built the op) is
    taken from the stack when the op is created, so the decorator returns the builder unchanged.
    """
    if callable(name):
        return name

    def deco(fn: Fn) -> Fn:
        return fn
    return deco


class SourceLocation(NamedTuple):
    """Where a call came from (upstream `popart.SourceLocation`)."""

    function_name: str
    file_name: str
    line_number: int


def get_source_location(offset: int) -> SourceLocation:
    """The caller `offset` frames above the caller of this function."""
    frame = inspect.stack()[offset + 1]
    return SourceLocation(frame.function, frame.filename, frame.lineno)
