"""Builders: call / call_with_info, repeat / repeat_with_info, conditional(_with_info)."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from .. import dtypes
from .._ir.records import Op
from ..context import gcg
from ..errors import OpSetupError
from ..graph import Graph
from .._pb_shim import op_view
from ..tensor import Tensor, constant
from ._builder import Out, add_op, check_in_graph

__all__ = ["call", "call_with_info", "CallSiteInfo", "repeat", "repeat_with_info", "conditional",
           "conditional_with_info", "ConditionalSiteInfo"]


def _flatten(xs: Iterable) -> List[Any]:
    out: List[Any] = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            out.extend(_flatten(x))
        else:
            out.append(x)
    return out


def _connect(graph: Graph, inputs: tuple, inputs_dict: Optional[Mapping], opname: str,
             parent: Graph, graph_name: str = "called") -> List[Tensor]:
    """Parent tensors for each input of `graph`, from positional inputs and inputs_dict
    (upstream's checks and wording; `graph_name` is "called", "then_branch" or
    "else_branch")."""
    if not isinstance(graph, Graph):
        raise TypeError(f"{opname}: expected a popxl.Graph, got {type(graph).__name__}")
    if graph.ir is not parent.ir:
        raise ValueError(f"{opname}: graph '{graph.id}' belongs to another Ir")
    g_inputs = graph.inputs
    flat = _flatten(inputs)
    if len(flat) > len(g_inputs):
        raise ValueError(f"Too many inputs have been provided to the {graph_name} graph. The "
                         f"number of positional inputs exceeds the number of inputs of the "
                         f"graph. {len(flat)} > {len(g_inputs)}. For graph: {graph}")
    conn: Dict[int, Any] = {i: v for i, v in enumerate(flat)}
    index = {t.id: i for i, t in enumerate(g_inputs)}
    for sub_t, parent_t in (inputs_dict or {}).items():
        if not isinstance(sub_t, Tensor) or sub_t.id not in index or sub_t._graph is not graph:
            raise ValueError(f'The graph input tensor "{sub_t}" is not in the {graph_name} graph '
                             f'({graph}).')
        i = index[sub_t.id]
        if i in conn:
            raise ValueError(f"Graph input tensor is specified twice for the {graph_name} graph, "
                             f"in `inputs_dict` and positionally in `inputs`: {sub_t}")
        conn[i] = parent_t
    missing = [i for i in range(len(g_inputs)) if i not in conn]
    if missing:
        raise ValueError(_missing_inputs_message(graph, graph_name, conn, missing))
    result = []
    for i, sub_t in enumerate(g_inputs):
        v = conn[i]
        if not isinstance(v, Tensor):
            try:
                v = constant(v, sub_t.dtype, f"{sub_t.name}_const")
            except Exception:
                where = f'at position "{i}"' if i < len(flat) else f'"{sub_t}"'
                raise TypeError(f"Input {where} could not be coerced into a tensor for the "
                                f"{graph_name} graph: Type {type(v)}. Value: {v}") from None
        check_in_graph(parent, v, opname)
        if v.shape != sub_t.shape or v.dtype != sub_t.dtype:    # popart's op setup refuses it
            raise OpSetupError(f"{opname}: input {i} of graph '{graph.id}' ('{sub_t.name}') expects "
                             f"{sub_t.shape} {sub_t.dtype.name}, got '{v.id}' {v.shape} "
                             f"{v.dtype.name}")
        result.append(v)
    return result


def _missing_inputs_message(graph: Graph, graph_name: str, conn: Dict[int, Any],
                            missing: List[int]) -> str:
    from ..utils import table_to_string

    g_inputs = graph.inputs
    missing_rows = [("Index", "Graph Tensor", "Shape", "Dtype")] + [
        (i, g_inputs[i].id, g_inputs[i].shape, g_inputs[i].dtype.name) for i in missing]
    connected_rows = [("Index", "Graph Tensor", "Parent Graph Tensor")] + [
        (i, g_inputs[i].id, v.id if isinstance(v, Tensor) else repr(v))
        for i, v in sorted(conn.items())]
    return (f"Not enough inputs have been provided for the {graph_name} graph ({graph}).\n\n"
            f"Missing inputs:\n{table_to_string(missing_rows)}\n\nConnected inputs:\n"
            f"{table_to_string(connected_rows)}")


class CallSiteInfo:
    """Information about one call (or repeat) site: the op and its input/output mapping.

    Args:
        subgraph_op: the Call / Loop / If op, as an `_ir.Op` view (`op_view`).
    """

    def __init__(self, subgraph_op):
        self._rec: Op = subgraph_op._op       # the emulator's record of the op
        self._parent: Graph = subgraph_op._graph

    @property
    def _op(self):
        """The op as upstream's `_ir` op (a view: `modifiesIndex`, `opType` ..., and the
        record's fields)."""
        return op_view(self._parent, self._rec)

    @property
    def called_graph(self) -> Graph:
        return self._parent.ir._graph(self._rec.called[0])

    def _offset(self) -> int:
        return 2 if self._rec.type == "Loop" else 0

    def graph_to_parent_input_index(self, idx: int) -> int:
        return idx - self._offset()

    def parent_to_graph_input_index(self, idx: int) -> int:
        return idx + self._offset()

    def graph_to_parent_output_index(self, idx: int) -> int:
        return idx - (1 if self._rec.type == "Loop" else 0)

    def parent_to_graph_output_index(self, idx: int) -> int:
        return idx + (1 if self._rec.type == "Loop" else 0)

    def graph_to_parent(self, graph_tensor: Tensor) -> Tensor:
        g = self.called_graph._data
        if graph_tensor.id in g.inputs:
            i = self.graph_to_parent_input_index(g.inputs.index(graph_tensor.id))
            return self._parent._tensor(self._rec.inputs[i])
        if graph_tensor.id in g.outputs:
            i = self.graph_to_parent_output_index(g.outputs.index(graph_tensor.id))
            return self._parent._tensor(self._rec.outputs[i])
        raise ValueError(f"Tensor {graph_tensor.name} is not an input or output of the called "
                         f"graph(s). ('{graph_tensor.id}', graph '{g.id}')")

    def parent_to_graph(self, parent_tensor: Tensor) -> Tensor:
        if parent_tensor.id not in self._rec.inputs:
            raise ValueError(f"Tensor {parent_tensor.name} is not a parent graph input of the "
                             f"call site. ('{parent_tensor.id}')")
        i = self.parent_to_graph_input_index(self._rec.inputs.index(parent_tensor.id))
        return self.called_graph._tensor(self.called_graph._data.inputs[i])

    def parent_input(self, idx: int) -> Tensor:
        return self._parent._tensor(self._rec.inputs[idx])

    def parent_output(self, idx: int) -> Tensor:
        return self._parent._tensor(self._rec.outputs[idx])

    @property
    def inputs(self) -> Tuple[Tensor, ...]:
        return tuple(self._parent._tensor(t) for t in self._rec.inputs)

    @property
    def outputs(self) -> Tuple[Tensor, ...]:
        return tuple(self._parent._tensor(t) for t in self._rec.outputs)

    def set_parent_input_modified(self, parent_tensor: Tensor, infer_modified_regions: bool = False):
        """Write the subgraph's final value of this input back to `parent_tensor`."""
        if parent_tensor.id not in self._rec.inputs:
            raise ValueError(f"Tensor '{parent_tensor.id}' is not an input of this call site")
        mod = set(self._rec.attrs.get("modified", ()))
        mod.add(self._rec.inputs.index(parent_tensor.id))
        self._rec.attrs["modified"] = tuple(sorted(mod))


def _prep_and_validate_inputs(check_inputs: bool, parent_graph: Graph, graph: Graph,
                              graph_name: str, inputs: Iterable,
                              inputs_dict: Optional[Mapping]) -> Dict[Tensor, Tensor]:
    """{graph input: parent tensor} from positional `inputs` (nested lists flattened) and
    `inputs_dict`, every input connected once; Python numbers become constants of the input's
    dtype. Parent tensors must be in `parent_graph` and match the inputs' shapes and dtypes;
    the emulator always checks (`check_inputs=False` does not skip it: a mismatch would give
    wrong results rather than a compile error)."""
    ins = _connect(graph, tuple(inputs or ()), inputs_dict, "call", parent_graph,
                   graph_name or "called")
    return dict(zip(graph.inputs, ins))


def _outputs_of(graph: Graph) -> List[Out]:
    return [Out(t.name, t.shape, t.dtype, t.meta_shape) for t in graph.outputs]


def call_with_info(graph: Graph, *inputs: Any, inputs_dict: Optional[Mapping] = None,
                   check_inputs: bool = True) -> CallSiteInfo:
    """Call `graph` and return the call site's info."""
    parent = gcg()
    ins = _connect(graph, inputs, inputs_dict, "call", parent)
    add_op("Call", f"{parent.name}--call--{graph.id}", ins, _outputs_of(graph), {"modified": ()},
           called=(graph.id,))
    return CallSiteInfo(op_view(parent, parent._data.ops[-1]))


def call(graph: Graph, *inputs: Any, inputs_dict: Optional[Mapping] = None) -> Tuple[Tensor, ...]:
    """Call `graph` with `inputs` (positional, then `inputs_dict`); returns its outputs.

    Example:
        >>> y, = ops.call(linear_graph, x, inputs_dict={linear.W: W0})
    """
    return call_with_info(graph, *inputs, inputs_dict=inputs_dict).outputs


def repeat_with_info(graph: Graph, repeat_count: int, *inputs: Any,
                     inputs_dict: Optional[Mapping] = None,
                     check_inputs: bool = True) -> CallSiteInfo:
    """Run `graph` `repeat_count` times; outputs 0..k-1 feed inputs 0..k-1 of the next
    iteration. `.called_graph` is the loop wrapper graph, as upstream."""
    if isinstance(repeat_count, bool) or not isinstance(repeat_count, int):
        raise TypeError(f"repeat: repeat_count must be an int, got {repeat_count!r}")
    if repeat_count < 0:
        raise ValueError(f"Repeat count must be >= 0. Repeat count: {repeat_count}. Graph: "
                         f"{graph}")
    if len(graph.inputs) < len(graph.outputs):
        raise ValueError(f"To repeat the subgraph ({graph.id}) the number of inputs must be "
                         f"greater than or equal to the number of outputs. {len(graph.inputs)} "
                         f"< {len(graph.outputs)} (outputs feed the first inputs of the next "
                         f"iteration)")
    parent = gcg()
    ins = _connect(graph, inputs, inputs_dict, "repeat", parent)
    for i, o in enumerate(graph.outputs):
        gi = graph.inputs[i]
        if o.shape != gi.shape or o.dtype != gi.dtype:
            raise ValueError(f"repeat: output {i} of graph '{graph.id}' {o.shape} "
                             f"{o.dtype.name} must match input {i} {gi.shape} {gi.dtype.name}")
    ir = parent.ir
    wrapper = ir._new_graph(f"{graph.id}__loop_wrapper")
    from ..tensor import graph_input, graph_output

    by_ref = graph._data.by_ref_inputs
    with wrapper:
        graph_input((), dtypes.int32, "Iterator___")
        cond = graph_input((), dtypes.bool, "LoopCond___")
        w_ins = [graph_input(t.shape, t.dtype, t.name, by_ref=t.id in by_ref, meta_shape=t.meta_shape)
                 for t in graph.inputs]
        outs = call(graph, *w_ins)
        graph_output(cond)
        for o in outs:
            graph_output(o)
    k = len(graph.outputs)
    add_op("Loop", f"{parent.name}__loop__{wrapper.id}", ins,
           [Out(f"{o.name}", o.shape, o.dtype, o.meta_shape) for o in graph.outputs],
           {"trip_count": repeat_count, "num_carried": k, "modified": ()}, called=(wrapper.id,))
    return CallSiteInfo(op_view(parent, parent._data.ops[-1]))


def repeat(graph: Graph, repeat_count: int, *inputs: Any,
           inputs_dict: Optional[Mapping] = None) -> Tuple[Tensor, ...]:
    """Run `graph` `repeat_count` times (loop-carried outputs); returns the last outputs."""
    return repeat_with_info(graph, repeat_count, *inputs, inputs_dict=inputs_dict).outputs


class ConditionalSiteInfo(CallSiteInfo):
    """Site info of a `conditional`: `.called_graph` is `(then_graph, else_graph)`. As upstream,
    parent input 0 is the condition, the then branch's inputs are parent inputs 1..n and the
    else branch's follow (a tensor both branches take is connected twice); outputs map one to
    one. Indices that map to nothing raise IndexError."""

    @property
    def called_graph(self):
        return (self._parent.ir._graph(self._rec.called[0]), self._parent.ir._graph(self._rec.called[1]))

    def _branch_inputs(self, then_branch: bool) -> Tuple[int, ...]:
        return self._rec.attrs["then_inputs" if then_branch else "else_inputs"]

    def _branch_of(self, idx: int) -> Tuple[bool, int]:
        """(then branch?, branch input index) of parent input `idx`."""
        for then_branch in (True, False):
            ins = self._branch_inputs(then_branch)
            if idx in ins:
                return then_branch, ins.index(idx)
        raise IndexError(f"Invalid parent graph input index (parent input {idx!r} of "
                         f"'{self._rec.name}' feeds no branch; input 0 is the condition)")

    def is_parent_index_in_then_branch(self, idx: int) -> bool:
        return self._branch_of(idx)[0]

    def graph_to_parent_input_index(self, idx: int, then_branch: bool = True) -> int:
        ins = self._branch_inputs(then_branch)
        if not isinstance(idx, int) or not 0 <= idx < len(ins):
            raise IndexError(f"Invalid graph input index ({idx!r}: the "
                             f"{'then' if then_branch else 'else'} branch has {len(ins)} inputs)")
        return ins[idx]

    def parent_to_graph_input_index(self, idx: int) -> int:
        """The branch input fed by parent input `idx`."""
        return self._branch_of(idx)[1]

    def _output_index(self, idx: int, then_branch: bool) -> int:
        if not isinstance(idx, int) or not 0 <= idx < len(self._rec.outputs):
            raise IndexError(f"Invalid graph input index (output {idx!r}: the "
                             f"{'then' if then_branch else 'else'} branch has "
                             f"{len(self._rec.outputs)} outputs)")
        return idx

    def graph_to_parent_output_index(self, idx: int, then_branch: bool = True) -> int:
        return self._output_index(idx, then_branch)

    def parent_to_graph_output_index(self, idx: int, then_branch: bool = True) -> int:
        return self._output_index(idx, then_branch)

    def graph_to_parent(self, graph_tensor: Tensor) -> Tensor:
        for then_branch, graph in zip((True, False), self.called_graph):
            g = graph._data
            if graph_tensor._graph._data is not g:
                continue
            if graph_tensor.id in g.inputs:
                i = self.graph_to_parent_input_index(g.inputs.index(graph_tensor.id), then_branch)
                return self._parent._tensor(self._rec.inputs[i])
            if graph_tensor.id in g.outputs:
                return self._parent._tensor(self._rec.outputs[g.outputs.index(graph_tensor.id)])
        raise ValueError(f"Tensor {graph_tensor.name} is not an input or output of the called "
                         f"graph(s). ('{graph_tensor.id}', conditional '{self._rec.name}')")

    def parent_to_graph(self, parent_tensor: Tensor) -> Tensor:
        """The branch input `parent_tensor` feeds first (the then branch's if it feeds both)."""
        if parent_tensor.id not in self._rec.inputs[1:]:
            raise ValueError(f"Tensor {parent_tensor.name} is not a parent graph input of the "
                             f"call site. ('{parent_tensor.id}', conditional '{self._rec.name}')")
        idx = self._rec.inputs.index(parent_tensor.id, 1)
        then_graph, else_graph = self.called_graph
        graph = then_graph if self.is_parent_index_in_then_branch(idx) else else_graph
        return graph._tensor(graph._data.inputs[self.parent_to_graph_input_index(idx)])

    def set_parent_input_modified(self, parent_tensor: Tensor, infer_modified_regions: bool = True):
        raise NotImplementedError("Parent input modification is not yet implemented for the "
                                  "conditional op.")


def conditional_with_info(cond: Tensor, then_branch: Graph, else_branch: Graph,
                          then_inputs: Optional[Iterable] = None,
                          else_inputs: Optional[Iterable] = None,
                          then_inputs_dict: Optional[Mapping] = None,
                          else_inputs_dict: Optional[Mapping] = None,
                          check_inputs: bool = True) -> ConditionalSiteInfo:
    """Run `then_branch` if the scalar `cond` is true, else `else_branch`."""
    parent = gcg()
    if not isinstance(cond, Tensor) or cond.nelms != 1:
        raise ValueError(f"conditional: `cond` must be a scalar Tensor, got {cond!r}")
    check_in_graph(parent, cond, "conditional")
    for g in (then_branch, else_branch):
        if g._data.by_ref_inputs:
            raise NotImplementedError("conditional: TensorByRef inputs are not supported (as "
                                      "upstream)")
    if len(then_branch.outputs) != len(else_branch.outputs):
        raise ValueError(f"`then_branch` graph and `else_branch` graph must have the same number "
                         f"of outputs: {len(then_branch.outputs)} != {len(else_branch.outputs)}")
    for a, b in zip(then_branch.outputs, else_branch.outputs):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"conditional: branch outputs differ: '{a.id}' {a.shape} "
                             f"{a.dtype.name} vs '{b.id}' {b.shape} {b.dtype.name}")
    t_ins = _connect(then_branch, tuple(then_inputs or ()), then_inputs_dict, "conditional", parent,
                     "then_branch")
    e_ins = _connect(else_branch, tuple(else_inputs or ()), else_inputs_dict, "conditional", parent,
                     "else_branch")
    ins = [cond, *t_ins, *e_ins]
    then_idx = list(range(1, 1 + len(t_ins)))
    else_idx = list(range(1 + len(t_ins), len(ins)))
    outs = [Out(f"{a.name}_or_{b.name}", a.shape, a.dtype, a.meta_shape)
            for a, b in zip(then_branch.outputs, else_branch.outputs)]
    add_op("If", "conditional", ins, outs,
           {"then_inputs": tuple(then_idx), "else_inputs": tuple(else_idx)},
           called=(then_branch.id, else_branch.id))
    return ConditionalSiteInfo(op_view(parent, parent._data.ops[-1]))


def conditional(cond: Tensor, then_branch: Graph, else_branch: Graph,
                then_inputs: Optional[Iterable] = None, else_inputs: Optional[Iterable] = None,
                then_inputs_dict: Optional[Mapping] = None,
                else_inputs_dict: Optional[Mapping] = None) -> Tuple[Tensor, ...]:
    """Run one of two graphs depending on the runtime scalar `cond`; returns its outputs."""
    return conditional_with_info(cond, then_branch, else_branch, then_inputs, else_inputs,
                                 then_inputs_dict, else_inputs_dict).outputs
