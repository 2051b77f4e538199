"""Public `Graph`: a view of one GraphData of an Ir, and the graph context manager."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from ._ir.records import GraphData, TensorKind
from .context import get_current_context

if TYPE_CHECKING:
    from .ir import Ir
    from .tensor import Tensor

__all__ = ["Graph"]

# record kind -> upstream tensor type (`Tensor.__init_subclass__(tensor_type=...)`)
_TENSOR_TYPES = {TensorKind.VARIABLE: "Variable", TensorKind.CONSTANT: "Const"}


class Graph:
    """A graph of an Ir. Created only through `Ir.main_graph`, `Ir.create_graph` and friends."""

    def __init__(self) -> None:
        raise TypeError("Cannot create popxl.graph.Graph instances using the constructor. "
                        "(Use ir.create_graph(...) or ir.create_empty_graph(...).)")

    @classmethod
    def _from_pb(cls, pb_graph) -> "Graph":
        """The Graph of a `_pb_graph` view."""
        return pb_graph._graph

    @classmethod
    def _create(cls, ir: "Ir", data: GraphData) -> "Graph":
        g = object.__new__(cls)
        g._ir = ir
        g._data = data
        g._wrappers: Dict[str, "Tensor"] = {}
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

    def __eq__(self, value: object) -> bool:
        """Graph equality (the same graph of the same Ir); TypeError for a non-Graph, as
        upstream."""
        if not isinstance(value, Graph):
            raise TypeError(f"Value must be of type popxl.Graph. Value: {value}. Type: "
                            f"{type(value)}")
        return value._data is self._data

    def __hash__(self) -> int:
        return hash((self._data.id, id(self._ir)))

    def __repr__(self) -> str:
        return f"Graph[id={self.id} name={self.name}]"

    # --- tensors ---------------------------------------------------------------------
    def _tensor(self, tid: str) -> "Tensor":
        t = self._wrappers.get(tid)
        if t is None:
            from .tensor import Tensor

            info = self._data.tensors[tid]
            cls = Tensor._tensor_types.get(_TENSOR_TYPES.get(info.kind, ""), Tensor)
            t = cls._create(self, info)
            self._wrappers[tid] = t
        return t

    def _scoped_tensor_id(self, name: str) -> str:
        scoped = get_current_context().scoped_name(name)
        return f"{self.id}/{scoped}" if self.id else scoped

    def _create_tensor_id(self, name: Optional[str] = None) -> str:
        """A new tensor id of this graph: `<graph id>/<name scopes>/<name or "t">`, made unique
        with an IR-wide `__t<k>` suffix."""
        return self.ir._data.unique_tensor_id(self._data, self._scoped_tensor_id(name or "t"))

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
        """Every tensor of the graph (in the main graph, the host streams' tensors too, as
        upstream)."""
        return tuple(self._tensor(t) for t in self._data.tensors)

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

    def get_tensor(self, tensor_id: str) -> "Tensor":
        if tensor_id not in self._data.tensors:
            raise KeyError(f"Graph '{self.id}' has no tensor '{tensor_id}'")
        return self._tensor(tensor_id)

    def __contains__(self, value) -> bool:
        """Whether the Tensor `value` is in this graph (popxl-dist extension: or a tensor id);
        TypeError for anything else, as upstream."""
        if isinstance(value, str):
            return value in self._data.tensors
        from .tensor import Tensor

        if not isinstance(value, Tensor):
            raise TypeError(f"Value must be of type popxl.Tensor. Value: {value}. Type: "
                            f"{type(value)}")
        return value.id in self._data.tensors

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
    def register_op_created_hook(self, fn: Callable) -> int:
        """Call `fn(op)` (an `_ir.Op` view) for every op created in this graph; returns a
        handle for `remove_op_created_hook`."""
        data = self._data

        def hook(op) -> None:
            if op._graph._data is data:
                fn(op)

        return get_current_context().register_op_created_hook(hook)

    def remove_op_created_hook(self, handle: int) -> None:
        get_current_context().remove_op_created_hook(handle)

    @property
    def _pb_graph(self):
        from ._pb_shim import PbGraph

        return PbGraph(self)
