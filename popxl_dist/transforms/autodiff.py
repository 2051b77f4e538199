"""`popxl.transforms.autodiff`: build the gradient graph of a graph as an IR transform.

The forward graph is walked in reverse creation order; each op's grad rule (see grad_registry)
emits ops into a new graph `<fwd id>_bwd`. Forward tensors the rules need become `Fwd` inputs of
the gradient graph; those that are not already forward inputs/outputs are added as forward outputs
and every call site of the forward graph gains the matching output (upstream's SafeAddFwdOutputs
stitching). Called graphs are differentiated recursively (once per graph, cached on the Ir) or
through `called_graphs_grad_info`.
"""
from __future__ import annotations

import enum
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

import popart._internal._types as _pb

from .._ir.records import GraphData, Op, TensorInfo, TensorKind
from .._pb_shim import op_view
from ..errors import popart_exception
from ..engine.kernels import load_all as load_kernels
from ..engine.kernels.registry import CUSTOM_OP_ATTR, spec_of
from ..graph import Graph
from ..tensor import Tensor, graph_input, graph_output
from .grad_registry import GRAD_RULES, NO_GRAD, THROWS, load_all

__all__ = ["autodiff", "GradGraphInfo", "ExpectedConnection", "ExpectedConnectionType",
           "GradContext"]


class ExpectedConnectionType(enum.Enum):
    Fwd = "Fwd"
    FwdGrad = "FwdGrad"

    @classmethod
    def _from_pb(cls, type_: _pb.ExpectedConnectionType) -> "ExpectedConnectionType":
        return cls[type_.name]

    def _to_pb(self) -> _pb.ExpectedConnectionType:
        return _pb.ExpectedConnectionType[self.name]


class ExpectedConnection:
    """One input or output of a gradient graph: a forward tensor, or the gradient of one."""

    def __init__(self, fwd_tensor: Tensor, connection_type: ExpectedConnectionType):
        self.fwd_tensor = fwd_tensor
        self.connection_type = connection_type

    @classmethod
    def _from_pb(cls, fwd_graph, pb_ec: _pb.ExpectedConnection) -> "ExpectedConnection":
        """From a `popart._internal.ir.ExpectedConnection` of forward graph `fwd_graph` (a
        popxl.Graph or its `_pb_graph`)."""
        graph = _as_graph(fwd_graph)
        return cls(graph.get_tensor(pb_ec.fwdId), ExpectedConnectionType._from_pb(pb_ec.type))

    @property
    def _pb_ec(self) -> _pb.ExpectedConnection:
        return _pb.ExpectedConnection(self.fwd_tensor.id, self.connection_type._to_pb())

    def __repr__(self) -> str:
        return f"({self.connection_type}, {self.fwd_tensor!r})"


class GradGraphInfo:
    """The result of autodiff: the gradient graph and how it connects to the forward graph."""

    def __init__(self, graph: Graph, forward_graph: Graph,
                 expected_inputs: Sequence[ExpectedConnection],
                 expected_outputs: Sequence[ExpectedConnection]):
        self._ir = graph.ir
        self._graph = graph
        self._forward_graph = forward_graph
        self._expected_inputs = tuple(expected_inputs)
        self._expected_outputs = tuple(expected_outputs)

    @classmethod
    def _from_pb(cls, ir, fwd_graph, _pb_bwd_info: _pb.BwdGraphInfo) -> "GradGraphInfo":
        """From a `popart._internal.ir.BwdGraphInfo` (as popxl_addons' create_grad_graph_info
        builds it); `ir` and `fwd_graph` may be popxl objects or their `_pb_*` views."""
        fwd = _as_graph(fwd_graph)
        bwd = fwd.ir._graph(str(_pb_bwd_info.bwdGraphId))
        return cls(bwd, fwd,
                   [ExpectedConnection._from_pb(fwd, e) for e in _pb_bwd_info.expectedInputs],
                   [ExpectedConnection._from_pb(fwd, e) for e in _pb_bwd_info.expectedOutputs])

    @property
    def _pb_bwd_info(self) -> _pb.BwdGraphInfo:
        return _pb.BwdGraphInfo(self._graph.id, [e._pb_ec for e in self._expected_inputs],
                                [e._pb_ec for e in self._expected_outputs])

    graph = property(lambda self: self._graph)
    forward_graph = property(lambda self: self._forward_graph)
    expected_inputs = property(lambda self: self._expected_inputs)
    expected_outputs = property(lambda self: self._expected_outputs)

    @property
    def inputs(self) -> Tuple[Tensor, ...]:
        return tuple(e.fwd_tensor for e in self._expected_inputs)

    @property
    def outputs(self) -> Tuple[Tensor, ...]:
        return tuple(e.fwd_tensor for e in self._expected_outputs)

    def inputs_dict(self, fwd_call_info) -> Dict[Tensor, Tensor]:
        """{gradient-graph input: parent tensor at the forward call site} for the `Fwd` inputs."""
        if fwd_call_info.called_graph != self._forward_graph:
            raise TypeError(f"inputs_dict: the call site calls '{fwd_call_info.called_graph.id}', "
                            f"not the forward graph '{self._forward_graph.id}'")
        out = {}
        g_inputs = self._graph.inputs
        for i, e in enumerate(self._expected_inputs):
            if e.connection_type == ExpectedConnectionType.Fwd:
                out[g_inputs[i]] = fwd_call_info.graph_to_parent(e.fwd_tensor)
        return out

    def fwd_graph_ins_to_grad_parent_outs(self, grad_call_info) -> Dict[Tensor, Tensor]:
        """{forward-graph input: gradient output at the gradient call site}."""
        outs = grad_call_info.outputs
        return {e.fwd_tensor: outs[i] for i, e in enumerate(self._expected_outputs)
                if i < len(outs)}

    def fwd_parent_ins_to_grad_parent_outs(self, fwd_call_info, grad_call_info) -> Dict[Tensor, Tensor]:
        """{parent tensor fed to the forward call: its gradient at the gradient call site}."""
        return {fwd_call_info.graph_to_parent(t): g
                for t, g in self.fwd_graph_ins_to_grad_parent_outs(grad_call_info).items()}

    def __repr__(self) -> str:
        ins = ", ".join(map(repr, self._expected_inputs))
        outs = ", ".join(map(repr, self._expected_outputs))
        return (f"GradGraphInfo[\n  graph={self._graph.id}\n  expected_inputs=[{ins}]\n"
                f"  expected_outputs=[{outs}]\n]")


def _as_graph(g) -> Graph:
    """A popxl.Graph from itself or its `_pb_graph` view."""
    return g if isinstance(g, Graph) else g._graph


def _modifying(op: Op) -> bool:
    spec = spec_of(op)
    if spec is not None and spec.modifies and spec.modified_inputs(op):
        return True
    if op.type in ("Call", "Loop") and op.attrs.get("modified"):
        return True
    return False


def _consumers(gd: GraphData) -> Dict[str, List[Op]]:
    """tensor id -> the ops of `gd` reading it (for renames without scanning every op)."""
    out: Dict[str, List[Op]] = {}
    for o in gd.ops:
        for t in dict.fromkeys(o.inputs):
            out.setdefault(t, []).append(o)
    return out


def _rename(gd: GraphData, graph: Graph, old: str, new: str,
            consumers: Optional[Dict[str, List[Op]]] = None) -> None:
    info = gd.tensors.pop(old)
    info.id = new
    gd.tensors[new] = info
    op = gd.producer.pop(old, None)
    if op is not None:
        op.outputs = tuple(new if t == old else t for t in op.outputs)
        gd.producer[new] = op
    readers = gd.ops if consumers is None else consumers.pop(old, [])
    for o in readers:
        if old in o.inputs:
            o.inputs = tuple(new if t == old else t for t in o.inputs)
    if consumers is not None and readers:
        consumers[new] = readers
    if old in gd.outputs:
        gd.outputs = [new if t == old else t for t in gd.outputs]
    w = graph._wrappers.pop(old, None)
    if w is not None:
        graph._wrappers[new] = w


class GradContext:
    """What a grad rule sees: the forward op, and access to forward tensors in the grad graph."""

    def __init__(self, builder: "_GradBuilder", op: Op):
        self._b = builder
        self.op = op
        self.attrs = op.attrs

    def fwd_in(self, i: int) -> Tensor:
        return self._b.fwd(self.op.inputs[i])

    def fwd_out(self, i: int) -> Tensor:
        return self._b.fwd(self.op.outputs[i])

    def in_info(self, i: int) -> TensorInfo:
        return self._b.fwd_gd.tensors[self.op.inputs[i]]

    def out_info(self, i: int) -> TensorInfo:
        return self._b.fwd_gd.tensors[self.op.outputs[i]]

    @property
    def num_inputs(self) -> int:
        return len(self.op.inputs)

    def needs(self, i: int) -> bool:
        """Whether input i needs a gradient (rules may skip work for the others)."""
        return self.op.inputs[i] in self._b.needed

    def consumes(self, ins: Sequence[int] = (), outs: Sequence[int] = ()) -> None:
        """Make forward inputs `ins` and outputs `outs` inputs of the gradient graph although
        this rule does not read them: upstream's grad op takes them (its gradInputInfo), so
        the gradient graph's expected inputs are upstream's set (programs index them)."""
        for i in ins:
            self.fwd_in(i)
        for j in outs:
            self.fwd_out(j)

    def unbroadcast(self, dx: Tensor, shape: Tuple[int, ...]) -> Tensor:
        """Sum `dx` over the axes that broadcasting added to reach `dx.shape` from `shape`."""
        from .. import ops

        shape = tuple(shape)
        if dx.shape == shape:
            return dx
        lead = len(dx.shape) - len(shape)
        axes = list(range(lead)) + [lead + i for i, s in enumerate(shape)
                                    if s == 1 and dx.shape[lead + i] != 1]
        if axes:
            dx = ops.sum(dx, axes, keepdims=False)
        if dx.shape != shape:
            dx = ops.reshape(dx, shape)
        return dx

    def autodiff_called(self, gid: str) -> "GradGraphInfo":
        return self._b.session.grad_info_for(gid)


class _GradBuilder:
    """Builds one gradient graph."""

    def __init__(self, session: "_AutodiffSession", fwd: Graph, provided: List[Tensor],
                 required: List[Tensor], strict: bool):
        self.session = session
        self.fwd_graph = fwd
        self.fwd_gd = fwd._data
        self.provided = provided
        self.required = required
        self.strict = strict
        self.fwd_map: Dict[str, Tensor] = {}        # fwd tensor id -> grad-graph tensor
        self.fwd_order: List[str] = []

    def fwd(self, tid: str) -> Tensor:
        t = self.fwd_map.get(tid)
        if t is None:
            info = self.fwd_gd.tensors[tid]
            name = self.fwd_graph._tensor(tid).name
            t = graph_input(info.shape, info.dtype, name, meta_shape=info.meta_shape or None)
            self.fwd_map[tid] = t
            self.fwd_order.append(tid)
        return t

    def build(self) -> GradGraphInfo:
        fwd, gd = self.fwd_graph, self.fwd_gd
        for op in gd.ops:
            if _modifying(op):
                raise popart_exception(
                    f"The graph {gd.id} contains a modifying op: "
                    f"{op_view(fwd, op).debugName()}. Autodiff cannot be used on graphs with "
                    f"inplace modifying ops. (The op is {op.describe()}.)")
        ir = fwd.ir
        name = f"{gd.id}_bwd"
        n = 0
        while name in ir._data.graphs:
            name = f"{gd.id}_bwd_{n}"
            n += 1
        gd_bwd = GraphData(name)
        ir._data.graphs[name] = gd_bwd
        bwd = ir._graph(name)
        required_ids = [t.id for t in self.required]
        # Tensors that depend on a required tensor are the ones that need gradients.
        needed: Set[str] = set(required_ids)
        for op in gd.ops:
            if any(t in needed for t in op.inputs):
                needed.update(op.outputs)
        self.needed = needed
        # Every gradient contribution of a tensor; several are summed by one `Sum` op when the
        # gradient is first read (as upstream; `popxl.transforms.decompose_sum` splits it).
        partials: Dict[str, List[Tensor]] = {}
        from ..ops._grad_sum import grad_sum

        def add_grad(tid: str, g: Tensor) -> None:
            info = gd.tensors[tid]
            if g.shape != info.shape:
                raise RuntimeError(f"autodiff: gradient of '{tid}' has shape {g.shape}, expected "
                                   f"{info.shape}")
            partials.setdefault(tid, []).append(g)

        def grad_of(tid: str) -> Optional[Tensor]:
            parts = partials.get(tid)
            if not parts:
                return None
            if len(parts) > 1:
                partials[tid] = parts = [grad_sum(parts)]
            return parts[0]

        from .. import ops

        with bwd:
            provided_inputs = []
            for t in self.provided:
                gi = graph_input(t.shape, t.dtype, f"Gradient___{t.name}",
                                 meta_shape=t.meta_shape or None)
                provided_inputs.append(gi)
                add_grad(t.id, gi)
            for op in reversed(gd.ops):
                dys = [grad_of(o) for o in op.outputs]
                if all(d is None for d in dys):
                    continue
                if not any(t in needed for t in op.inputs):
                    continue
                custom = op.attrs.get(CUSTOM_OP_ATTR)
                if custom is not None:
                    rule = custom.grad_rule(op)
                elif op.type in NO_GRAD:
                    continue
                elif op.type in THROWS:
                    raise popart_exception(f"autodiff: op {op.describe()} has no gradient and cannot "
                                           f"be differentiated through")
                else:
                    rule = GRAD_RULES.get(op.type)
                if rule is None:
                    what = ("a gradient op whose own gradient (second order) is not "
                            "implemented" if op.type.endswith("Grad") else "no grad rule")
                    raise NotImplementedError(f"autodiff: op type '{op.type}' has {what} "
                                              f"({op.describe()})")
                n_before = len(gd_bwd.ops)
                dxs = rule(GradContext(self, op), dys)
                for made in gd_bwd.ops[n_before:]:
                    made.origin = made.origin or op.describe()
                if len(dxs) != len(op.inputs):
                    raise RuntimeError(f"grad rule of '{op.type}' returned {len(dxs)} gradients "
                                       f"for {len(op.inputs)} inputs")
                for tid, dx in zip(op.inputs, dxs):
                    if dx is not None and tid in needed:
                        add_grad(tid, dx)
            out_connections = []
            used_outputs: Set[str] = set()
            consumers = _consumers(gd_bwd)
            bwd_inputs = set(gd_bwd.inputs)
            for t in self.required:
                g = grad_of(t.id)
                if g is None:
                    if self.strict:
                        raise popart_exception(f"[Autodiff] Unable to provide required gradient "
                                           f"output for fwd id '{t.id}'")
                    continue
                want = f"{name}/Gradient___{t.name}"
                if (g.id in bwd_inputs or g.id in used_outputs or g._info.kind != TensorKind.INTERMEDIATE
                        or want in gd_bwd.tensors):
                    g = ops.identity(g, f"Gradient___{t.name}")
                else:
                    _rename(gd_bwd, bwd, g.id, want, consumers)
                used_outputs.add(g.id)
                graph_output(g)
                out_connections.append(ExpectedConnection(t, ExpectedConnectionType.FwdGrad))
        # Order inputs: FwdGrad in provided order, then Fwd by forward tensor id.
        fwd_sorted = sorted(self.fwd_order)
        gd_bwd.inputs = [t.id for t in provided_inputs] + [self.fwd_map[t].id for t in fwd_sorted]
        in_connections = [ExpectedConnection(t, ExpectedConnectionType.FwdGrad) for t in self.provided]
        gd = self.fwd_gd
        stitched = set(gd.inputs) | set(gd.outputs)
        sites = [(pgd, op) for pgd in fwd.ir._data.graphs.values() for op in pgd.ops
                 if gd.id in op.called]
        for tid in fwd_sorted:
            in_connections.append(ExpectedConnection(fwd._tensor(tid), ExpectedConnectionType.Fwd))
            if tid not in stitched:
                stitched.add(tid)
                self._stitch(tid, sites)
        return GradGraphInfo(bwd, fwd, in_connections, out_connections)

    def _stitch(self, tid: str, sites: List[Tuple[GraphData, Op]]) -> None:
        """Make forward tensor `tid` (not yet an input or output) an output of the forward graph
        and of every call site `sites` (the ops calling the forward graph)."""
        gd = self.fwd_gd
        gd.outputs.append(tid)
        info = gd.tensors[tid]
        ir = self.fwd_graph.ir
        for pgd, op in sites:
            if op.type != "Call":
                raise popart_exception(f"autodiff: graph '{gd.id}' needs a new output for its "
                                       f"gradient but is called by {op.describe()}, which cannot "
                                       f"gain outputs")
            new = ir._data.unique_tensor_id(pgd, f"{pgd.id + '/' if pgd.id else ''}autodiff_output")
            pgd.tensors[new] = TensorInfo(new, info.shape, info.dtype, TensorKind.INTERMEDIATE,
                                          info.meta_shape)
            op.outputs = op.outputs + (new,)
            pgd.producer[new] = op


class _AutodiffSession:
    """One autodiff call: differentiates the top graph and, recursively, called graphs."""

    def __init__(self, ir, called_graphs_grad_info: Optional[Mapping]):
        self.ir = ir
        self.user_infos: Dict[str, GradGraphInfo] = {}
        for k, v in (called_graphs_grad_info or {}).items():
            self.user_infos[k.id if isinstance(k, Graph) else k] = v
        self.all_infos: Dict[Graph, GradGraphInfo] = {}

    def grad_info_for(self, gid: str) -> GradGraphInfo:
        if gid in self.user_infos:
            return self.user_infos[gid]
        cache = self.ir.__dict__.setdefault("_autodiff_cache", {})
        info = cache.get(gid)
        if info is None:
            g = self.ir._graph(gid)
            if g._data.no_recursive_autodiff:
                raise popart_exception(
                    f"autodiff: graph '{gid}' has been marked as unsafe to autodiff. Please "
                    f"provide a gradient graph via `called_graphs_grad_info` in PopXL")
            provided = [t for t in g.outputs if t.dtype.is_floating_point]
            required = [t for t in g.inputs if t.dtype.is_floating_point]
            info = _GradBuilder(self, g, provided, required, strict=False).build()
            cache[gid] = info
        self.all_infos[info.forward_graph] = info
        return info


def autodiff(graph: Graph, grads_provided: Optional[Iterable[Tensor]] = None,
             grads_required: Optional[Iterable[Tensor]] = None,
             called_graphs_grad_info: Optional[Mapping] = None,
             return_all_grad_graphs: bool = False) -> Union[GradGraphInfo, Dict[Graph, GradGraphInfo]]:
    """Create the gradient graph of `graph`.

    Args:
        graph: the forward graph (must not contain in-place modifying ops).
        grads_provided: forward tensors whose gradients the gradient graph takes as inputs
            (default: all outputs).
        grads_required: forward tensors whose gradients it returns (default: all inputs).
        called_graphs_grad_info: gradient infos to use for called graphs.
        return_all_grad_graphs: return `{forward graph: GradGraphInfo}` for every graph
            differentiated.

    Example:
        >>> info = call_with_info(fwd, x, inputs_dict={W: W0})
        >>> bwd = autodiff(fwd)
        >>> g = call_with_info(bwd.graph, dy, inputs_dict=bwd.inputs_dict(info))
    """
    load_kernels()
    load_all()
    if not isinstance(graph, Graph):
        raise TypeError(f"autodiff: expected a popxl.Graph, got {type(graph).__name__}")
    provided = list(graph.outputs if grads_provided is None else grads_provided)
    required = list(graph.inputs if grads_required is None else grads_required)
    for t in provided + required:
        if not isinstance(t, Tensor) or t._graph is not graph:
            raise ValueError(f"autodiff: {t!r} is not a tensor of graph '{graph.id}'")
    session = _AutodiffSession(graph.ir, called_graphs_grad_info)
    info = _GradBuilder(session, graph, provided, required, strict=True).build()
    session.all_infos[graph] = info
    return dict(session.all_infos) if return_all_grad_graphs else info
