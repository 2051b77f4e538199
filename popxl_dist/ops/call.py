"""Builders: call / call_with_info, repeat / repeat_with_info, conditional(_with_info)."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from .. import dtypes
from .._ir.records import Op
from ..context import gcg
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
             parent: Graph) -> List[Tensor]:
    """Parent tensors for each input of `graph`, from positional inputs and inputs_dict."""
    if not isinstance(graph, Graph):
        raise TypeError(f"{opname}: expected a popxl.Graph, got {type(graph).__name__}")
    if graph.ir is not parent.ir:
        raise ValueError(f"{opname}: graph '{graph.id}' belongs to another Ir")
    g_inputs = graph.inputs
    flat = _flatten(inputs)
    if len(flat) > len(g_inputs):
        raise ValueError(f"{opname}: too many inputs for graph '{graph.id}': it has "
                         f"{len(g_inputs)} inputs, got {len(flat)} positional inputs")
    conn: Dict[int, Any] = {i: v for i, v in enumerate(flat)}
    index = {t.id: i for i, t in enumerate(g_inputs)}
    for sub_t, parent_t in (inputs_dict or {}).items():
        if not isinstance(sub_t, Tensor) or sub_t.id not in index or sub_t._graph is not graph:
            raise ValueError(f"{opname}: inputs_dict key {sub_t!r} is not an input of graph "
                             f"'{graph.id}'")
        i = index[sub_t.id]
        if i in conn:
            raise ValueError(f"{opname}: input '{sub_t.id}' of graph '{graph.id}' is given "
                             f"twice (positionally and in inputs_dict)")
        conn[i] = parent_t
    missing = [g_inputs[i] for i in range(len(g_inputs)) if i not in conn]
    if missing:
        rows = "\n".join(f"  {i:3d}  {t.id}  {t.shape}  {t.dtype.name}"
                         for i, t in enumerate(g_inputs) if i not in conn)
        raise ValueError(f"{opname}: graph '{graph.id}' inputs are missing:\n  idx  id  shape  "
                         f"dtype\n{rows}")
    result = []
    for i, sub_t in enumerate(g_inputs):
        v = conn[i]
        if not isinstance(v, Tensor):
            try:
                v = constant(v, sub_t.dtype, f"{sub_t.name}_const")
            except Exception:
                raise TypeError(f"{opname}: input {i} ('{sub_t.id}') must be a Tensor or a "
                                f"Python number, got {v!r}") from None
        check_in_graph(parent, v, opname)
        if v.shape != sub_t.shape or v.dtype != sub_t.dtype:
            raise ValueError(f"{opname}: input {i} of graph '{graph.id}' ('{sub_t.name}') expects "
                             f"{sub_t.shape} {sub_t.dtype.name}, got '{v.id}' {v.shape} "
                             f"{v.dtype.name}")
        result.append(v)
    return result


class CallSiteInfo:
    """Information about one call (or repeat) site: the op and its input/output mapping.

    Args:
        subgraph_op: the Call / Loop / If op, as an `_ir.Op` view (`op_view`).
    """

    def __init__(self, subgraph_op):
        self._op: Op = subgraph_op._op
        self._parent: Graph = subgraph_op._graph

    @property
    def called_graph(self) -> Graph:
        return self._parent.ir._graph(self._op.called[0])

    def _offset(self) -> int:
        return 2 if self._op.type == "Loop" else 0

    def graph_to_parent_input_index(self, idx: int) -> int:
        return idx - self._offset()

    def parent_to_graph_input_index(self, idx: int) -> int:
        return idx + self._offset()

    def graph_to_parent_output_index(self, idx: int) -> int:
        return idx - (1 if self._op.type == "Loop" else 0)

    def parent_to_graph_output_index(self, idx: int) -> int:
        return idx + (1 if self._op.type == "Loop" else 0)

    def graph_to_parent(self, graph_tensor: Tensor) -> Tensor:
        g = self.called_graph._data
        if graph_tensor.id in g.inputs:
            i = self.graph_to_parent_input_index(g.inputs.index(graph_tensor.id))
            return self._parent._tensor(self._op.inputs[i])
        if graph_tensor.id in g.outputs:
            i = self.graph_to_parent_output_index(g.outputs.index(graph_tensor.id))
            return self._parent._tensor(self._op.outputs[i])
        raise ValueError(f"Tensor '{graph_tensor.id}' is not an input or output of graph "
                         f"'{g.id}'")

    def parent_to_graph(self, parent_tensor: Tensor) -> Tensor:
        if parent_tensor.id not in self._op.inputs:
            raise ValueError(f"Tensor '{parent_tensor.id}' is not an input of this call site")
        i = self.parent_to_graph_input_index(self._op.inputs.index(parent_tensor.id))
        return self.called_graph._tensor(self.called_graph._data.inputs[i])

    def parent_input(self, idx: int) -> Tensor:
        return self._parent._tensor(self._op.inputs[idx])

    def parent_output(self, idx: int) -> Tensor:
        return self._parent._tensor(self._op.outputs[idx])

    @property
    def inputs(self) -> Tuple[Tensor, ...]:
        return tuple(self._parent._tensor(t) for t in self._op.inputs)

    @property
    def outputs(self) -> Tuple[Tensor, ...]:
        return tuple(self._parent._tensor(t) for t in self._op.outputs)

    def set_parent_input_modified(self, parent_tensor: Tensor, infer_modified_regions: bool = False):
        """Write the subgraph's final value of this input back to `parent_tensor`."""
        if parent_tensor.id not in self._op.inputs:
            raise ValueError(f"Tensor '{parent_tensor.id}' is not an input of this call site")
        mod = set(self._op.attrs.get("modified", ()))
        mod.add(self._op.inputs.index(parent_tensor.id))
        self._op.attrs["modified"] = tuple(sorted(mod))


def _prep_and_validate_inputs(check_inputs: bool, parent_graph: Graph, graph: Graph,
                              graph_name: str, inputs: Iterable,
                              inputs_dict: Optional[Mapping]) -> Dict[Tensor, Tensor]:
    """{graph input: parent tensor} from positional `inputs` (nested lists flattened) and
    `inputs_dict`, every input connected once; Python numbers become constants of the input's
    dtype. Parent tensors must be in `parent_graph` and match the inputs' shapes and dtypes;
    the emulator always checks (`check_inputs=False` does not skip it: a mismatch would give
    wrong results rather than a compile error)."""
    ins = _connect(graph, tuple(inputs or ()), inputs_dict, graph_name or "call", parent_graph)
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
    if not isinstance(repeat_count, int) or repeat_count < 0:
        raise ValueError(f"repeat: repeat_count must be a non-negative int, got {repeat_count!r}")
    if len(graph.inputs) < len(graph.outputs):
        raise ValueError(f"repeat: graph '{graph.id}' has {len(graph.outputs)} outputs but only "
                         f"{len(graph.inputs)} inputs; outputs feed the first inputs of the next "
                         f"iteration, so it needs at least as many inputs as outputs")
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
    """Site info of a `conditional`: `.called_graph` is `(then_graph, else_graph)`. Parent input
    0 is the condition; the branches' inputs map to parent inputs 1.. (shared where both
    branches take the same parent tensor); outputs map one to one."""

    @property
    def called_graph(self):
        return (self._parent.ir._graph(self._op.called[0]), self._parent.ir._graph(self._op.called[1]))

    def _branch_inputs(self, then_branch: bool) -> Tuple[int, ...]:
        return self._op.attrs["then_inputs" if then_branch else "else_inputs"]

    def is_parent_index_in_then_branch(self, idx: int) -> bool:
        return idx in self._op.attrs["then_inputs"]

    def graph_to_parent_input_index(self, idx: int, then_branch: bool = True) -> int:
        return self._branch_inputs(then_branch)[idx]

    def parent_to_graph_input_index(self, idx: int) -> int:
        """The branch input fed by parent input `idx` (the then branch's if it feeds both)."""
        for then_branch in (True, False):
            ins = self._branch_inputs(then_branch)
            if idx in ins:
                return ins.index(idx)
        raise ValueError(f"Parent input {idx} of '{self._op.name}' feeds no branch input (input 0 "
                         f"is the condition)")

    def graph_to_parent_output_index(self, idx: int, then_branch: bool = True) -> int:
        return idx

    def parent_to_graph_output_index(self, idx: int, then_branch: bool = True) -> int:
        return idx

    def graph_to_parent(self, graph_tensor: Tensor) -> Tensor:
        for then_branch, graph in zip((True, False), self.called_graph):
            g = graph._data
            if graph_tensor._graph._data is not g:
                continue
            if graph_tensor.id in g.inputs:
                i = self.graph_to_parent_input_index(g.inputs.index(graph_tensor.id), then_branch)
                return self._parent._tensor(self._op.inputs[i])
            if graph_tensor.id in g.outputs:
                return self._parent._tensor(self._op.outputs[g.outputs.index(graph_tensor.id)])
        raise ValueError(f"Tensor '{graph_tensor.id}' is not an input or output of either branch "
                         f"of '{self._op.name}'")

    def parent_to_graph(self, parent_tensor: Tensor) -> Tensor:
        """The branch input `parent_tensor` feeds (the then branch's if it feeds both)."""
        if parent_tensor.id not in self._op.inputs[1:]:
            raise ValueError(f"Tensor '{parent_tensor.id}' is not a branch input of this "
                             f"conditional")
        idx = self._op.inputs.index(parent_tensor.id, 1)
        then_graph, else_graph = self.called_graph
        graph = then_graph if self.is_parent_index_in_then_branch(idx) else else_graph
        return graph._tensor(graph._data.inputs[self.parent_to_graph_input_index(idx)])

    def set_parent_input_modified(self, parent_tensor: Tensor, infer_modified_regions: bool = True):
        raise NotImplementedError("set_parent_input_modified is not supported for conditional "
                                  "(as upstream)")


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
        raise ValueError(f"conditional: branches must have the same number of outputs, got "
                         f"{len(then_branch.outputs)} and {len(else_branch.outputs)}")
    for a, b in zip(then_branch.outputs, else_branch.outputs):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"conditional: branch outputs differ: '{a.id}' {a.shape} "
                             f"{a.dtype.name} vs '{b.id}' {b.shape} {b.dtype.name}")
    t_ins = _connect(then_branch, tuple(then_inputs or ()), then_inputs_dict, "conditional", parent)
    e_ins = _connect(else_branch, tuple(else_inputs or ()), else_inputs_dict, "conditional", parent)
    ins = [cond]
    then_idx, else_idx = [], []
    for lst, idx in ((t_ins, then_idx), (e_ins, else_idx)):
        for t in lst:
            if t in ins[1:]:
                idx.append(ins.index(t, 1))
            else:
                ins.append(t)
                idx.append(len(ins) - 1)
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
