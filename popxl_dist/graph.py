"""Public `Graph`: a view of one GraphData of an Ir, and the graph context manager."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, List, Tuple

from ._ir.records import GraphData, Op, TensorKind
from .context import get_current_context

if TYPE_CHECKING:
    from .ir import Ir
    from .tensor import Tensor

__all__ = ["Graph"]


class Graph:
    """A graph of an Ir. Created only through `Ir.main_graph`, `Ir.create_graph` and friends."""

    def __init__(self) -> None:
        raise TypeError("Graph cannot be constructed directly: use ir.create_graph(...) or "
                        "ir.create_empty_graph(...)")

    @classmethod
    def _create(cls, ir: "Ir", data: GraphData) -> "Graph":
        g = object.__new__(cls)
        g._ir = ir
        g._data = data
        g._wrappers: Dict[str, "Tensor"] = {}
        g._hooks: Dict[int, Callable] = {}
        g._next_hook = 0
        return g

    # --- identity --------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._data.id

    name = id

    @property
    def ir(self) -> "Ir":
        return self._ir

    @property
    def main_graph(self) -> "Graph":
        return self._ir.main_graph

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Graph) and other._data is self._data

    def __hash__(self) -> int:
        return hash((self._data.id, id(self._ir)))

    def __repr__(self) -> str:
        return f"Graph[id={self.id} name={self.name}]"

    # --- tensors ---------------------------------------------------------------------
    def _tensor(self, tid: str) -> "Tensor":
        t = self._wrappers.get(tid)
        if t is None:
            from .tensor import Constant, Tensor, Variable

            info = self._data.tensors[tid]
            cls = {TensorKind.VARIABLE: Variable, TensorKind.CONSTANT: Constant}.get(info.kind, Tensor)
            t = cls._create(self, info)
            self._wrappers[tid] = t
        return t

    def _scoped_tensor_id(self, name: str) -> str:
        scoped = get_current_context().scoped_name(name)
        return f"{self.id}/{scoped}" if self.id else scoped

    @property
    def inputs(self) -> Tuple["Tensor", ...]:
        return tuple(self._tensor(t) for t in self._data.inputs)

    @property
    def inputs_by_name(self) -> Dict[str, "Tensor"]:
        return {t.name: t for t in self.inputs}

    @property
    def outputs(self) -> Tuple["Tensor", ...]:
        return tuple(self._tensor(t) for t in self._data.outputs)

    @property
    def tensors(self) -> Tuple["Tensor", ...]:
        return tuple(self._tensor(t) for t, i in self._data.tensors.items()
                     if i.kind != TensorKind.STREAM)

    @property
    def variables(self) -> Tuple["Tensor", ...]:
        return tuple(self._tensor(t) for t, i in self._data.tensors.items()
                     if i.kind == TensorKind.VARIABLE)

    @property
    def constants(self) -> Tuple["Tensor", ...]:
        return tuple(self._tensor(t) for t, i in self._data.tensors.items()
                     if i.kind == TensorKind.CONSTANT)

    @property
    def called_graphs(self) -> Tuple["Graph", ...]:
        seen: List[str] = []
        for op in self._data.ops:
            for c in op.called:
                if c not in seen:
                    seen.append(c)
        return tuple(self._ir._graph(c) for c in seen)

    def get_tensor(self, tid: str) -> "Tensor":
        if tid not in self._data.tensors:
            raise KeyError(f"Graph '{self.id}' has no tensor '{tid}'")
        return self._tensor(tid)

    def __contains__(self, t) -> bool:
        tid = t if isinstance(t, str) else getattr(t, "id", None)
        return tid in self._data.tensors

    @property
    def _by_ref_inputs(self) -> set:
        return {self._tensor(t) for t in self._data.by_ref_inputs}

    # --- context ---------------------------------------------------------------------
    def __enter__(self) -> "Graph":
        get_current_context().push_graph(self)
        return self

    def __exit__(self, *exc) -> None:
        get_current_context().pop_graph()

    # --- hooks -----------------------------------------------------------------------
    def register_op_created_hook(self, fn: Callable[[Op], None]) -> int:
        h = self._next_hook
        self._next_hook += 1
        self._hooks[h] = fn
        return h

    def remove_op_created_hook(self, handle: int) -> None:
        self._hooks.pop(handle, None)

    def _op_created(self, op: Op) -> None:
        for fn in list(self._hooks.values()):
            fn(op)

    @property
    def _pb_graph(self):
        from ._pb_shim import PbGraph

        return PbGraph(self)
