"""`BoundGraph` and `GraphWithNamedArgs`: a popxl Graph plus bound / named inputs."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple

import popxl
from popxl import ops
from popxl.transforms import GradGraphInfo

from .dot_tree import to_mapping
from .named_tensors import NamedTensors

if TYPE_CHECKING:
    from .module import Module

__all__ = ["BoundGraph", "GraphWithNamedArgs"]


class BoundGraph:
    """A graph plus a mapping {graph input: parent tensor} supplied at every call."""

    def __init__(self, graph: popxl.Graph, args: Optional[Mapping[popxl.Tensor, popxl.Tensor]] = None):
        self.graph = graph
        self.args: Dict[popxl.Tensor, popxl.Tensor] = dict(args or {})

    def call(self, *targs: Any, args: Optional[Mapping] = None) -> Tuple[popxl.Tensor, ...]:
        """Call the graph; `args` override the bound inputs. Returns the outputs."""
        return self.call_with_info(*targs, args=args).outputs

    def call_with_info(self, *targs: Any, args: Optional[Mapping] = None):
        """Like `call` but returns the `CallSiteInfo`."""
        return ops.call_with_info(self.graph, *targs, inputs_dict={**self.args, **(args or {})})

    def bind(self, args: Mapping) -> "BoundGraph":
        """A new BoundGraph with `args` merged over the bound ones."""
        return BoundGraph(self.graph, {**self.args, **args})

    def subgraph_io_map(self, *targs: Any, args: Optional[Mapping] = None,
                        outs: Optional[Tuple[popxl.Tensor, ...]] = None) -> Dict:
        """{graph input: call input} plus {graph output: call output} (if `outs` given)."""
        inputs = {**self.args, **(args or {})}
        g_ins = self.graph.inputs
        io = dict(zip(g_ins, targs))
        io.update(inputs)
        if outs is not None:
            io.update(dict(zip(self.graph.outputs, outs)))
        return io


class GraphWithNamedArgs:
    """A popxl Graph plus `NamedTensors` of its named inputs.

    Args:
        graph: the graph.
        args: named graph inputs (default empty).
        grad_graph_info: set for gradient graphs.
        from_module: the Module that built the graph (used by `autodiff(method="auto")`).
    """

    def __init__(self, graph: popxl.Graph, args: Optional[NamedTensors] = None,
                 grad_graph_info: Optional[GradGraphInfo] = None,
                 from_module: Optional["Module"] = None, aux: Optional[Mapping] = None,
                 called_graphs_grad_info: Optional[Mapping] = None):
        self.graph = graph
        self.args = args if args is not None else NamedTensors()
        self._grad_graph_info = grad_graph_info
        self.from_module = from_module
        self._aux = dict(aux or {})
        self.called_graphs_grad_info = dict(called_graphs_grad_info or {})
        self.autodiff_applied = False

    @classmethod
    def from_grad_graph(cls, grad_graph_info: GradGraphInfo,
                        args: Optional[NamedTensors] = None) -> "GraphWithNamedArgs":
        return cls(grad_graph_info.graph, args, grad_graph_info=grad_graph_info)

    @property
    def grad_graph_info(self) -> GradGraphInfo:
        if self._grad_graph_info is None:
            raise AttributeError("`grad_graph_info` attribute does not exist. Not a gradient "
                                 "graph.")
        return self._grad_graph_info

    @grad_graph_info.setter
    def grad_graph_info(self, info: GradGraphInfo) -> None:
        self._grad_graph_info = info

    def bind(self, args: Optional[NamedTensors] = None) -> BoundGraph:
        """Bind the named inputs to the leaves of `args` with the same keys."""
        return BoundGraph(self.graph, to_mapping(self.args, args) if args is not None else {})

    def call(self, *targs: Any, args: Optional[Mapping] = None) -> Tuple[popxl.Tensor, ...]:
        return BoundGraph(self.graph).call(*targs, args=args)

    def call_with_info(self, *targs: Any, args: Optional[Mapping] = None):
        return BoundGraph(self.graph).call_with_info(*targs, args=args)

    def copy(self) -> "GraphWithNamedArgs":
        """A shallow copy (graph, a copy of args, grad info)."""
        return GraphWithNamedArgs(self.graph, self.args.copy(), self._grad_graph_info)

    def autodiff(self, grads_provided=None, grads_required=None, called_graphs_grad_info=None,
                 method: str = "auto", force: bool = False) -> "GraphWithNamedArgs":
        """The gradient graph, from the module's `build_grad` or the autodiff transform."""
        if method not in ("auto", "build_grad", "autodiff"):
            raise ValueError(f"method should be one of 'auto', 'build_grad', 'autodiff'. Not: "
                             f"{method}")
        if self.autodiff_applied and not force:
            raise Exception(
                "Autodiff has already been applied to the graph, as autodiff modifies the "
                "forward graph in-place, it should only be applied once. Use `force=True` to "
                "apply it again.")
        from .module import _has_build_grad

        has_grad = self.from_module is not None and _has_build_grad(self.from_module)
        if method == "build_grad" and not has_grad:
            raise Exception("To use method='build_grad', `Module.build_grad` should be "
                            "overridden and `from_module` is specified when this object was "
                            "initialised.")
        if method == "build_grad" or (method == "auto" and has_grad):
            grad = self.from_module.create_grad_graph(self, grads_provided, grads_required)
        else:
            from .transforms.autodiff import autodiff

            grad = autodiff(self, grads_provided, grads_required, called_graphs_grad_info)
        self.autodiff_applied = True
        return grad

    def print_schedule(self) -> str:
        """The schedule of the graph as text (see the tutorials for the format)."""
        g = self.graph
        numbers: Dict[str, int] = {}

        def num(tid: str) -> str:
            if tid not in numbers:
                numbers[tid] = len(numbers) + 1
            return f"%{numbers[tid]}"

        def desc(pb_tensor) -> str:
            t = popxl.Tensor._from_pb_tensor(pb_tensor)
            return f"{num(t.id)} [{tuple(t.shape)} {t.dtype.name}]"

        names, tensors = self.args.unpack()
        arg_ids = {t.id: n for n, t in zip(names, tensors)}
        ins = []
        for t in g.inputs:
            s = num(t.id)
            ins.append(f"{arg_ids[t.id]}={s}" if t.id in arg_ids else s)
        lines = []
        for op in g._pb_graph.getOpSchedule(True):
            head = f"{op.opType()}.{op.id}"
            if hasattr(op, "getCalledGraph"):
                head += f"({op.getCalledGraph().id.str()})"
            i_s = ", ".join(desc(t) for t in op.getInputTensors())
            o_s = ", ".join(desc(t) for t in op.getOutputTensors())
            lines.append(f"    {head} ({i_s}) -> ({o_s})")
        outs = ", ".join(num(t.id) for t in g.outputs)
        header = [f"Graph : {g.name}", f"  ({', '.join(ins)}) -> ({outs}) {{"]
        return "\n".join(header + lines + ["  }"])
