"""Pipelined execution: ops tagged with pipeline stages become a real pipeline program.

Inside `with pipelined_execution(steps) as p:` every op created in the current graph must be in
a `with p.stage(i):` block. On exit the tagged ops are moved into per-stage graphs (host loads,
compute, host stores) plus one graph of the IPU copies that carry tensors to the next stage,
and called as a pipeline: ramp-up cycles, `steps - (stages - 1)` main cycles in a `repeat`, and
ramp-down cycles. In cycle c stage s works on micro batch c - s, and the copies made at the end
of a cycle are what the next stage reads in the next cycle, so each stage sees its micro batches
in order. The numbers therefore equal running the tagged ops `steps` times in program order,
provided stages only exchange values through `copy_to_ipu` (to the next stage) and
`stash_and_restore_tensor` (to any later stage), and do not write state another stage reads
(as on the IPU, where that would race).
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

import popxl
from popxl import ops
from popxl._ir import surgery
from popxl._ir.records import GraphData, Op, TensorKind

from ..graph import BoundGraph
from ..module import Module

__all__ = ["pipelined_execution", "StageContext", "Stash", "Restore", "Pipelining",
           "PipelineBoundGraph", "get_op_pipeline_stage"]

OpId = int


class Stash(Module):
    """A FIFO of `stash_size` copies of `t`: each call writes `t` at the counter's slot."""

    @popxl.in_sequence()
    def build(self, t: popxl.Tensor, stash_size: int) -> None:
        counter = self.add_variable_input("counter", partial(np.zeros, (1,)), popxl.uint32,
                                          by_ref=True)
        stash = self.add_variable_input("stash", partial(np.zeros, (stash_size, *t.shape)),
                                        t.dtype, by_ref=True)
        ops.dynamic_update_(stash, counter, t.reshape((1, *t.shape)), axes=[0], sizes=[1],
                            no_overlap=True)
        ops.increment_mod_(counter, 1, stash_size)


class Restore(Module):
    """Reads a `Stash` FIFO in the order it was written."""

    @popxl.in_sequence()
    def build(self, stash: popxl.TensorByRef) -> popxl.Tensor:
        counter = self.add_variable_input("counter", partial(np.zeros, (1,)), popxl.uint32,
                                          by_ref=True)
        t = ops.dynamic_slice(stash, counter, axes=[0], sizes=[1], no_overlap=True)
        ops.increment_mod_(counter, 1, stash.shape[0])
        return t.reshape(stash.shape[1:])


class StageContext:
    """What `pipelined_execution` yields: stage contexts and stash / restore helpers.

    Attributes:
        ops: {op id: stage} of every op created in the pipelined region.
    """

    def __init__(self):
        self.ops: Dict[OpId, int] = {}
        self._stage: Optional[int] = None
        self._stashes = 0

    def hook(self, op: Op) -> None:
        """Called for every op created in the pipelined graph: records its stage."""
        if self._stage is None:
            raise RuntimeError("Operation must be created in a stage context.")
        self.ops[op.id] = self._stage

    @contextmanager
    def stage(self, i: int) -> Iterator[None]:
        """Ops created inside belong to pipeline stage `i` (0, 1, ...)."""
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"stage: the pipeline stage must be a non-negative int, got {i!r}")
        prev = self._stage
        self._stage = i
        try:
            yield
        finally:
            self._stage = prev

    def _stage_of(self, t: popxl.Tensor) -> Optional[int]:
        op = t._graph._data.producer.get(t.id)
        return None if op is None else get_op_pipeline_stage(op, self.ops)

    def stash_and_restore_tensor(self, t: popxl.Tensor,
                                 from_stage: Optional[int] = None) -> popxl.Tensor:
        """`t`'s value for use in the current stage, kept in a FIFO since the stage that made it.

        Stage `from_stage` (default: the stage of `t`'s producer) pushes `t` into a stash of
        depth `current - from_stage + 1`; the current stage pops it, so it gets the value of
        the micro batch it is working on.
        """
        if self._stage is None:
            raise RuntimeError("stash_and_restore_tensor must be called inside a stage context "
                               "(`with p.stage(i):`).")
        if not isinstance(t, popxl.Tensor):
            raise TypeError(f"stash_and_restore_tensor: 't' must be a popxl.Tensor, got "
                            f"{type(t).__name__}")
        to_stage = self._stage
        if from_stage is None:
            from_stage = self._stage_of(t)
            if from_stage is None:
                raise ValueError(f"stash_and_restore_tensor: tensor '{t.id}' was not made in "
                                 f"the pipeline; pass `from_stage`")
        if from_stage > to_stage:
            raise ValueError(f"stash_and_restore_tensor: cannot stash tensor '{t.id}' from stage "
                             f"{from_stage} for the earlier stage {to_stage}")
        stash_facts, stash_graph = Stash().create_graph(t, to_stage - from_stage + 1)
        restore_facts, restore_graph = Restore().create_graph(
            popxl.TensorSpec(stash_facts.stash.shape, t.dtype))
        prefix = f"pipeline_stash_{self._stashes}"
        self._stashes += 1
        stash_vars = stash_facts.init(prefix)
        with self.stage(from_stage):
            stash_graph.bind(stash_vars).call(t)
        restore_vars = restore_facts.init(f"{prefix}.restore")
        (out,) = restore_graph.bind(restore_vars).call(stash_vars.stash)
        return out

    def stash_and_restore_activations(self, call_info, grad_info) -> Dict[popxl.Tensor,
                                                                            popxl.Tensor]:
        """A drop-in for `grad_info.inputs_dict(call_info)` in a later stage: every activation
        made in the pipeline is stashed and restored (tensors from outside pass as they are)."""
        activations = grad_info.inputs_dict(call_info)
        for sub, act in activations.items():
            stage = self._stage_of(act)
            if stage is not None:
                activations[sub] = self.stash_and_restore_tensor(act, from_stage=stage)
        return activations


def get_op_pipeline_stage(op: Op, op_dict: Dict[OpId, int]) -> Optional[int]:
    """The pipeline stage `op` was created in (`op_dict` is `StageContext.ops`), or None."""
    return op_dict.get(op.id)


@contextmanager
def pipelined_execution(steps: int) -> Iterator[StageContext]:
    """Build a pipeline over `steps` micro batches in the current graph.

    Example:
        >>> with addons.pipelined_execution(8) as p:
        ...     with p.stage(0), popxl.ipu(0):
        ...         h = layer0.call(ops.host_load(x_stream)).copy_to_ipu(1)
        ...     with p.stage(1), popxl.ipu(1):
        ...         ops.host_store(y_stream, layer1.call(h))

    Raises:
        RuntimeError: an op is created outside a stage context.
        ValueError: `steps` is less than twice the number of stages.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"pipelined_execution: steps must be a positive int, got {steps!r}")
    graph = popxl.gcg()
    context = StageContext()
    handle = graph.register_op_created_hook(context.hook)
    try:
        yield context
    finally:
        graph.remove_op_created_hook(handle)
    Pipelining(graph, steps).apply(context.ops)


class PipelineBoundGraph(BoundGraph):
    """A graph made of some of the pipelined ops (a stage's loads, compute or stores, or the
    IPU copies), bound to the tensors that feed it at each call.

    Its tensors stand for tensors of the original graph, by original id ("key"; a snapshot of
    a tensor written in place has the key `<id>@<op id>`): `input_keys` are what its inputs
    stand for, `output_keys` (`original_output_ids`) what its outputs stand for.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.input_keys: List[str] = []
        self.output_keys: List[str] = []
        self.tmap: Dict[str, str] = {}      # key -> tensor id in this graph
        self._in_map: Dict[str, str] = {}   # key -> input id, for graphs of `inputs_only` ops
        self._input_ids: Dict[str, str] = {}    # key -> the input standing for it
        self._inputs_only = False

    def call(self, *args, inputs_dict: Optional[Dict] = None) -> Tuple[popxl.Tensor, ...]:
        """Call the graph with the bound inputs (`inputs_dict` overrides them)."""
        return ops.call(self.graph, *args, inputs_dict={**self.args, **(inputs_dict or {})})

    @property
    def original_output_ids(self) -> List[str]:
        """The keys its outputs stand for, in output order."""
        return list(self.output_keys)

    def add_variable_input(self, tensor: popxl.Tensor) -> popxl.Tensor:
        """A by-reference input standing for `tensor`, a tensor from outside the pipeline
        (a variable, or any tensor the pipelined graph had before), bound to it."""
        if tensor.id in self.tmap:
            return self.graph._tensor(self.tmap[tensor.id])
        gd = tensor._graph._data
        sub = surgery.add_input(self.graph, tensor._info, surgery.tensor_name(gd, tensor.id),
                                by_ref=True)
        self.tmap[tensor.id] = sub
        self._input_ids[tensor.id] = sub
        self.input_keys.append(tensor.id)
        self.args[self.graph._tensor(sub)] = tensor
        return self.graph._tensor(sub)

    def add_output_tensor(self, tensor: popxl.Tensor, original_id: str) -> None:
        """Make `tensor` (of this graph) stand for `original_id`, as a candidate output."""
        self.tmap[original_id] = tensor.id
        self.output_keys.append(original_id)

    def reconnect_input(self, original_id: str, new: popxl.Tensor) -> None:
        """Feed the input standing for `original_id` with `new` at the next calls."""
        tid = self._input_ids.get(original_id)
        if tid is None:
            raise KeyError(f"reconnect_input: graph '{self.graph.id}' has no input for "
                           f"'{original_id}'")
        self.args[self.graph._tensor(tid)] = new

    def __contains__(self, value) -> bool:
        """Whether this graph has a tensor standing for `value` (an original tensor or id)."""
        key = value.id if isinstance(value, popxl.Tensor) else value
        return key in self.tmap or key in self._input_ids


class Pipelining:
    """Turns the stage-tagged ops of `graph` into a pipeline (see the module docstring).

    Attributes:
        stages / loads / stores: {stage: PipelineBoundGraph} of its compute, host load and
            host store ops; `ipu_copies` the graph of all IPU copies (or None).
        external_inputs: ids of the tensors from outside the pipeline that it reads.
        original_tid_to_graph / original_tid_to_cloned_tensor: for each tensor the pipelined
            ops made, the graph that makes it now and its tensor there.
        ipu_copy_dummy_inputs: {key: zeros} standing for values no cycle has made yet in the
            ramp-up (what the IPU copies and later stages read before their stage has run).
    """

    def __init__(self, graph: popxl.Graph, steps: int):
        self.ir = graph.ir
        self.graph = graph
        self.original_graph = graph
        self.steps = steps
        self.original_tid_to_cloned_tensor: Dict[str, popxl.Tensor] = {}
        self.original_tid_to_graph: Dict[str, PipelineBoundGraph] = {}
        self.external_inputs: List[str] = []
        self.stages: Dict[int, PipelineBoundGraph] = {}
        self.loads: Dict[int, PipelineBoundGraph] = {}
        self.stores: Dict[int, PipelineBoundGraph] = {}
        self.ipu_copies: Optional[PipelineBoundGraph] = None
        self.ipu_copy_dummy_inputs: Dict[str, popxl.Tensor] = {}
        self._values: Dict[str, popxl.Tensor] = {}   # key -> its latest value while building
        self._users: Optional[Dict[str, List[Op]]] = None

    # --- analysis ------------------------------------------------------------------------
    def apply(self, include_ops: Optional[Dict[OpId, int]] = None) -> None:
        """Move the ops with ids in `include_ops` ({op id: stage}, what `StageContext.ops`
        records) into the pipeline."""
        if include_ops is None:
            raise NotImplementedError(
                "Pipelining.apply: pass include_ops, the {op id: stage} map StageContext.ops "
                "records (the emulator's ops carry no pipeline stage of their own)")
        gd = self.graph._data
        tagged = [op for op in gd.ops if op.id in include_ops]
        if not tagged:
            return
        self.stage_of = {op.id: include_ops[op.id] for op in tagged}
        self.num_stages = max(self.stage_of.values()) + 1
        if self.steps < 2 * self.num_stages:
            raise ValueError(f"Pipelining requires the steps at least 2x the number of stages "
                             f"in the pipeline. steps: {self.steps}, stages: {self.num_stages}")
        self._classify(gd, tagged)
        self.construct_graphs(tagged)
        pipeline = self.build()
        surgery.remove_ops(self.graph, tagged)
        with self.graph:
            ops.call(pipeline, *[self.graph._tensor(t) for t in self.external_inputs])

    def required_for_host_load(self, op: Op) -> bool:
        """Whether `op` only makes the buffer host loads of its own stage fill (an Init)."""
        if op.type != "Init" or not op.outputs:
            return False
        if self._users is None:
            self._users = surgery.consumers(self.graph._data)
        readers = self._users.get(op.outputs[0], [])
        return bool(readers) and all(u.type == "HostLoad" and self.stage_of.get(u.id) ==
                                     self.stage_of.get(op.id) for u in readers)

    def _classify(self, gd: GraphData, tagged: List[Op]) -> None:
        """Kinds of ops (load / compute / store / copy), the stage where each tensor is usable,
        and the checks that values only cross stages through copies and stashes."""
        produced = {t: op for op in tagged for t in op.outputs}
        self._users = surgery.consumers(gd)
        outputs = set(gd.outputs)
        self.kind: Dict[int, str] = {}
        self.copy_source_stage: Dict[int, int] = {}
        self.usable_in: Dict[str, int] = {}
        for op in tagged:
            s = self.stage_of[op.id]
            if op.type == "IpuCopy" and op.inputs[0] in produced:
                kind = "copy"
                src = self.usable_in[op.inputs[0]]
                self.copy_source_stage[op.id] = src
                self.usable_in[op.outputs[0]] = src + 1
            else:
                kind = {"HostLoad": "load", "HostStore": "store"}.get(op.type, "compute")
                if self.required_for_host_load(op):
                    kind = "load"
                self.usable_in.update({t: s for t in op.outputs})
            self.kind[op.id] = kind
            for t in op.outputs:
                if t in outputs:
                    raise NotImplementedError(
                        f"pipelined_execution: tensor '{t}' made in the pipeline is an output of "
                        f"graph '{gd.id}'; pipeline results leave through host streams, remote "
                        f"buffers or variables")
        for op in tagged:
            if self.kind[op.id] == "copy":
                continue
            s = self.stage_of[op.id]
            for t in op.inputs:
                if t in produced and self.usable_in[t] != s:
                    raise ValueError(
                        f"pipelined_execution: {op.describe()} in stage {s} reads tensor '{t}', "
                        f"which belongs to stage {self.usable_in[t]}. Pass values to the next "
                        f"stage with `copy_to_ipu` and to later stages with "
                        f"`stash_and_restore_tensor`")
        for kind, what in (("load", "HostLoad"), ("store", "HostStore")):
            stream_stage: Dict[str, int] = {}
            for op in tagged:
                if op.type == what:
                    s = stream_stage.setdefault(op.attrs["stream"], self.stage_of[op.id])
                    if s != self.stage_of[op.id]:
                        raise ValueError(
                            f"pipelined_execution: stream '{op.attrs['stream']}' is used by "
                            f"stages {s} and {self.stage_of[op.id]}; each stream must belong to "
                            f"one stage (the micro batches would be transferred out of order)")
        self.produced = produced

    # --- graphs --------------------------------------------------------------------------
    def construct_graphs(self, include_ops: List[Op]) -> None:
        """Per stage a load, compute and store graph (when the stage has such ops) and one graph
        of all IPU copies, from the pipelined ops `include_ops` (classified first)."""
        tagged = include_ops
        gd = self.graph._data
        graphs = self.ir._data.graphs
        by_stage: Dict[int, List[Op]] = {}
        for op in tagged:
            if self.kind[op.id] != "copy":
                by_stage.setdefault(self.stage_of[op.id], []).append(op)
        # Stores and copies run after the stage's compute: read a snapshot of a tensor that the
        # stage's compute ops write in place (its value at the point of the store / copy).
        self.reads: Dict[Tuple[int, str], str] = {}
        snapshots: Dict[int, List[Tuple[int, str, str]]] = {}
        for s, stage_ops in by_stage.items():
            written = {op.inputs[i] for op in stage_ops if self.kind[op.id] == "compute"
                       for i in surgery.modified_inputs(graphs, op)}
            for op in tagged:
                if self.kind[op.id] not in ("store", "copy"):
                    continue
                src_stage = (self.copy_source_stage[op.id] if self.kind[op.id] == "copy"
                             else self.stage_of[op.id])
                if src_stage != s:
                    continue
                for t in op.inputs:
                    if t in written:
                        key = f"{t}@{op.id}"
                        self.reads[(op.id, t)] = key
                        snapshots.setdefault(s, []).append((op.id, t, key))
        for s in sorted(by_stage):
            stage_ops = by_stage[s]
            loads = [op for op in stage_ops if self.kind[op.id] == "load"]
            computes = [op for op in stage_ops if self.kind[op.id] == "compute"]
            stores = [op for op in stage_ops if self.kind[op.id] == "store"]
            if loads:
                self.loads[s] = self._graph_of(f"pipeline_stage_{s}_load", gd, loads)
            self.stages[s] = self._graph_of(f"pipeline_stage_{s}_compute", gd, computes,
                                            snapshots.get(s, []))
            if stores:
                self.stores[s] = self._graph_of(f"pipeline_stage_{s}_store", gd, stores)
        copies = [op for op in tagged if self.kind[op.id] == "copy"]
        if copies:
            # All copies read the previous cycle's values, even where one copies another's output.
            self.ipu_copies = self._graph_of("pipeline_ipu_copy", gd, copies, inputs_only=True)
        needed = set()
        for sg in self._all_graphs():
            needed.update(sg.input_keys)
        for sg in self._all_graphs():
            sg.output_keys = [k for k in sg.output_keys if k in needed]
            sg.graph._data.outputs = [sg.tmap[k] for k in sg.output_keys]

    def _all_graphs(self) -> List[PipelineBoundGraph]:
        gs = [*self.loads.values(), *self.stages.values(), *self.stores.values()]
        return gs + ([self.ipu_copies] if self.ipu_copies else [])

    def _graph_of(self, name: str, gd: GraphData, op_list: List[Op],
                  snapshots: List[Tuple[int, str, str]] = (),
                  inputs_only: bool = False) -> PipelineBoundGraph:
        """A new graph holding copies of `op_list`; every tensor it makes is a candidate output
        (pruned to the ones other graphs read once all graphs exist). With `inputs_only` the
        ops read graph inputs only, never each other's outputs."""
        sg = PipelineBoundGraph(self.ir.create_empty_graph(name))
        sg._inputs_only = inputs_only
        snap_after: Dict[int, List[Tuple[str, str]]] = {}
        positions = {op.id: i for i, op in enumerate(gd.ops)}
        for op_id, t, key in snapshots:
            # Taken right after the last compute op created before the store / copy.
            before = [c for c in op_list if positions[c.id] < positions[op_id]]
            snap_after.setdefault(before[-1].id if before else -1, []).append((t, key))
        self._snapshot(sg, gd, snap_after.get(-1, []))
        for op in op_list:
            self.move_op_into_graph(sg, op)
            self._snapshot(sg, gd, snap_after.get(op.id, []))
        return sg

    def move_op_into_graph(self, graph: PipelineBoundGraph, op: Op) -> Op:
        """Append a copy of pipelined op `op` to `graph`, its inputs read from the tensors
        standing for them there (new inputs where there are none yet); its outputs become
        candidate outputs of `graph`. (`apply` removes the originals once every graph is
        built.) Returns the copy."""
        gd = self.graph._data
        reads = {t: self.reads.get((op.id, t), t) for t in op.inputs}
        source = graph._in_map if graph._inputs_only else graph.tmap
        for t in op.inputs:
            key = reads[t]
            if key not in source:
                source[key] = self._input(graph, gd, t, key)
        ins = {t: source[reads[t]] for t in op.inputs}
        copy = surgery.clone_op(graph.graph, gd, op, ins)
        for t in op.outputs:
            cloned = graph.graph._tensor(ins[t])
            graph.add_output_tensor(cloned, t)
            self.original_tid_to_cloned_tensor[t] = cloned
            self.original_tid_to_graph[t] = graph
        return copy

    def _snapshot(self, sg: PipelineBoundGraph, gd: GraphData,
                  items: List[Tuple[str, str]]) -> None:
        for t, key in items:
            if t not in sg.tmap:
                sg.tmap[t] = self._input(sg, gd, t, t)
            with sg.graph:
                copy = ops.identity(sg.graph._tensor(sg.tmap[t]), f"{surgery.tensor_name(gd, t)}"
                                                                  f"_snapshot")
            sg.add_output_tensor(copy, key)

    def _input(self, sg: PipelineBoundGraph, gd: GraphData, t: str, key: str) -> str:
        """The tensor of `sg.graph` standing for original tensor `t`: a copied constant, or a
        new input (by reference for tensors from outside the pipeline)."""
        info = gd.tensors[t]
        name = surgery.tensor_name(gd, t)
        if info.kind == TensorKind.CONSTANT:
            return surgery.new_tensor(sg.graph, info, name, TensorKind.CONSTANT)
        external = t not in self.produced
        if external and t not in self.external_inputs:
            self.external_inputs.append(t)
        sg.input_keys.append(key)
        tid = surgery.add_input(sg.graph, info, name, by_ref=external)
        sg._input_ids[key] = tid
        return tid

    # --- the pipeline program ------------------------------------------------------------
    def build(self) -> popxl.Graph:
        """The `pipeline_graph`: ramp-up, a repeat of the main cycle, ramp-down."""
        gd = self.graph._data
        pipeline = self.ir.create_empty_graph("pipeline_graph")
        self._values = {}
        with pipeline:
            for t in self.external_inputs:
                self._values[t] = self._graph_input(gd.tensors[t], surgery.tensor_name(gd, t),
                                                    True)
            n = self.num_stages
            for i in range(n - 1):
                self.cycle(0, i + 1)
            self.main_cycle()
            for i in range(n - 1):
                self.cycle(i + 1, n)
        return pipeline

    @staticmethod
    def _graph_input(info, name: str, by_ref: bool = False) -> popxl.Tensor:
        return popxl.graph_input(info.shape, info.dtype, name, by_ref=by_ref,
                                 meta_shape=info.meta_shape or None)

    def _carried(self) -> List[str]:
        return list(self.ipu_copies.output_keys) if self.ipu_copies else []

    def repeat_graph(self) -> popxl.Graph:
        """The main cycle's graph: every stage once; its inputs are the values the IPU copies
        carry from the previous cycle (which it returns, updated) and the external inputs."""
        gd = self.graph._data
        carried = self._carried()
        cycle = self.ir.create_empty_graph("pipeline_main_cycle")
        outer, self._values = self._values, {}
        try:
            with cycle:
                for k in carried:
                    self._values[k] = self._graph_input(self._info(k), f"{k}_carried")
                for t in self.external_inputs:
                    self._values[t] = self._graph_input(gd.tensors[t], surgery.tensor_name(gd, t),
                                                        True)
                self.cycle(0, self.num_stages)
                for k in carried:
                    popxl.graph_output(self._values[k])
        finally:
            self._values = outer
        return cycle

    def main_cycle(self) -> None:
        """`steps - (stages - 1)` cycles of every stage, as a repeat whose loop-carried values
        are the tensors the IPU copies hand to the next cycle."""
        carried = self._carried()
        cycle = self.repeat_graph()
        initial = [self._latest(k) for k in carried]
        outs = ops.repeat(cycle, self.steps - (self.num_stages - 1), *initial,
                          inputs_dict={cycle.inputs[len(carried) + i]: self._values[t]
                                       for i, t in enumerate(self.external_inputs)})
        self.remap_tensors(carried, outs)

    def remap_tensors(self, original_ids: List[str], new_outputs) -> None:
        """From here on, the tensors standing for `original_ids` are `new_outputs`."""
        self._values.update(zip(original_ids, new_outputs))

    def move_copied_tensor_out_of_nested_repeat_graph(self, op_in_index, original, repeat_op):
        """Not used here: the values the IPU copies carry leave the main cycle's repeat as its
        loop-carried outputs (`main_cycle`), so nothing needs moving out of it."""
        raise NotImplementedError(
            "Pipelining.move_copied_tensor_out_of_nested_repeat_graph: this pipeline carries the "
            "IPU-copied values out of the main cycle as loop-carried outputs (see main_cycle); "
            "there is no nested repeat graph to move them out of")

    def _info(self, key: str):
        """The TensorInfo of an original tensor or snapshot key."""
        return self.graph._data.tensors[key.split("@")[0]]

    def _latest(self, key: str) -> popxl.Tensor:
        """The current value of `key`, or zeros if no cycle has made it yet (ramp-up)."""
        t = self._values.get(key)
        if t is None:
            info = self._info(key)
            t = ops.init(info.shape, info.dtype, "pipeline_ramp_up", "zero",
                         meta_shape=info.meta_shape or None)
            self._values[key] = t
            self.ipu_copy_dummy_inputs[key] = t
        return t

    def _call(self, sg: Optional[PipelineBoundGraph]) -> None:
        if sg is None:
            return
        for k in sg.input_keys:
            sg.reconnect_input(k, self._latest(k))
        self.remap_tensors(sg.output_keys, sg.call())

    def cycle(self, start: int, end: int) -> None:
        """One pipeline cycle of stages [start, end): loads, compute, stores, then the copies."""
        self.load(start, end)
        self.compute(start, end)
        self.store(start, end)
        self.copy()

    def load(self, start: int, end: int) -> None:
        for s in range(start, end):
            self._call(self.loads.get(s))

    def compute(self, start: int, end: int) -> None:
        for s in range(start, end):
            self._call(self.stages.get(s))

    def store(self, start: int, end: int) -> None:
        for s in range(start, end):
            self._call(self.stores.get(s))

    def copy(self) -> None:
        self._call(self.ipu_copies)
