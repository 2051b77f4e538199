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

from ..module import Module

__all__ = ["pipelined_execution", "StageContext", "Stash", "Restore", "Pipelining",
           "get_op_pipeline_stage"]

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

    def __init__(self, graph: Optional[popxl.Graph] = None):
        self.ops: Dict[OpId, int] = {}
        self._graph = graph
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
    context = StageContext(graph)
    handle = graph.register_op_created_hook(context.hook)
    try:
        yield context
    finally:
        graph.remove_op_created_hook(handle)
    Pipelining(graph, steps).apply(context.ops)


class _StageGraph:
    """A graph made of some of the pipelined ops: which original tensors (keys) it reads and
    which it provides."""

    def __init__(self, graph: popxl.Graph):
        self.graph = graph
        self.input_keys: List[str] = []
        self.output_keys: List[str] = []
        self.tmap: Dict[str, str] = {}


class Pipelining:
    """Turns the stage-tagged ops of `graph` into a pipeline (see the module docstring)."""

    def __init__(self, graph: popxl.Graph, steps: int):
        self.ir = graph.ir
        self.graph = graph
        self.original_graph = graph
        self.steps = steps
        self.stages: Dict[int, _StageGraph] = {}
        self.loads: Dict[int, _StageGraph] = {}
        self.stores: Dict[int, _StageGraph] = {}
        self.ipu_copies: Optional[_StageGraph] = None
        self.external_inputs: List[str] = []

    # --- analysis ------------------------------------------------------------------------
    def apply(self, include_ops: Dict[OpId, int]) -> None:
        """Move the ops with ids in `include_ops` (op id -> stage) into the pipeline."""
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

    def required_for_host_load(self, op: Op, users: Optional[Dict[str, List[Op]]] = None
                               ) -> bool:
        """Whether `op` only makes the buffer host loads of its own stage fill (an Init)."""
        if op.type != "Init" or not op.outputs:
            return False
        users = users if users is not None else surgery.consumers(self.graph._data)
        readers = users.get(op.outputs[0], [])
        return bool(readers) and all(u.type == "HostLoad" and self.stage_of.get(u.id) ==
                                     self.stage_of.get(op.id) for u in readers)

    def _classify(self, gd: GraphData, tagged: List[Op]) -> None:
        """Kinds of ops (load / compute / store / copy), the stage where each tensor is usable,
        and the checks that values only cross stages through copies and stashes."""
        produced = {t: op for op in tagged for t in op.outputs}
        users = surgery.consumers(gd)
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
                if self.required_for_host_load(op, users):
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
    def construct_graphs(self, tagged: List[Op]) -> None:
        """Per stage a load, compute and store graph (when the stage has such ops) and one graph
        of all IPU copies."""
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

    def _all_graphs(self) -> List[_StageGraph]:
        gs = [*self.loads.values(), *self.stages.values(), *self.stores.values()]
        return gs + ([self.ipu_copies] if self.ipu_copies else [])

    def _graph_of(self, name: str, gd: GraphData, op_list: List[Op],
                  snapshots: List[Tuple[int, str, str]] = (),
                  inputs_only: bool = False) -> _StageGraph:
        """A new graph holding copies of `op_list`; every tensor it makes is a candidate output
        (pruned to the ones other graphs read once all graphs exist). With `inputs_only` the
        ops read graph inputs only, never each other's outputs."""
        sg = _StageGraph(self.ir.create_empty_graph(name))
        snap_after: Dict[int, List[Tuple[str, str]]] = {}
        positions = {op.id: i for i, op in enumerate(gd.ops)}
        for op_id, t, key in snapshots:
            # Taken right after the last compute op created before the store / copy.
            before = [c for c in op_list if positions[c.id] < positions[op_id]]
            snap_after.setdefault(before[-1].id if before else -1, []).append((t, key))
        self._snapshot(sg, gd, snap_after.get(-1, []))
        in_map: Dict[str, str] = {}
        for op in op_list:
            reads = {t: self.reads.get((op.id, t), t) for t in op.inputs}
            source = in_map if inputs_only else sg.tmap
            for t in op.inputs:
                key = reads[t]
                if key not in source:
                    source[key] = self._input(sg, gd, t, key)
            ins = {t: source[reads[t]] for t in op.inputs}
            surgery.clone_op(sg.graph, gd, op, ins)
            for t in op.outputs:
                sg.tmap[t] = ins[t]
                sg.output_keys.append(t)
            self._snapshot(sg, gd, snap_after.get(op.id, []))
        return sg

    def _snapshot(self, sg: _StageGraph, gd: GraphData, items: List[Tuple[str, str]]) -> None:
        for t, key in items:
            if t not in sg.tmap:
                sg.tmap[t] = self._input(sg, gd, t, t)
            with sg.graph:
                copy = ops.identity(sg.graph._tensor(sg.tmap[t]), f"{surgery.tensor_name(gd, t)}"
                                                                  f"_snapshot")
            sg.tmap[key] = copy.id
            sg.output_keys.append(key)

    def _input(self, sg: _StageGraph, gd: GraphData, t: str, key: str) -> str:
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
        return surgery.add_input(sg.graph, info, name, by_ref=external)

    # --- the pipeline program ------------------------------------------------------------
    def build(self) -> popxl.Graph:
        """The `pipeline_graph`: ramp-up, a repeat of the main cycle, ramp-down."""
        gd = self.graph._data
        pipeline = self.ir.create_empty_graph("pipeline_graph")
        latest: Dict[str, popxl.Tensor] = {}
        with pipeline:
            for t in self.external_inputs:
                latest[t] = self._graph_input(gd.tensors[t], surgery.tensor_name(gd, t), True)
            n = self.num_stages
            for i in range(n - 1):
                self.cycle(0, i + 1, latest)
            self.main_cycle(latest)
            for i in range(n - 1):
                self.cycle(i + 1, n, latest)
        return pipeline

    @staticmethod
    def _graph_input(info, name: str, by_ref: bool = False) -> popxl.Tensor:
        return popxl.graph_input(info.shape, info.dtype, name, by_ref=by_ref,
                                 meta_shape=info.meta_shape or None)

    def _carried(self) -> List[str]:
        return list(self.ipu_copies.output_keys) if self.ipu_copies else []

    def main_cycle(self, latest: Dict[str, popxl.Tensor]) -> None:
        """`steps - (stages - 1)` cycles of every stage, as a repeat whose loop-carried values
        are the tensors the IPU copies hand to the next cycle."""
        gd = self.graph._data
        carried = self._carried()
        cycle = self.ir.create_empty_graph("pipeline_main_cycle")
        inner: Dict[str, popxl.Tensor] = {}
        with cycle:
            for k in carried:
                inner[k] = self._graph_input(self._info(k), f"{k}_carried")
            for t in self.external_inputs:
                inner[t] = self._graph_input(gd.tensors[t], surgery.tensor_name(gd, t), True)
            self.cycle(0, self.num_stages, inner)
            for k in carried:
                popxl.graph_output(inner[k])
        initial = [self._latest(latest, k) for k in carried]
        outs = ops.repeat(cycle, self.steps - (self.num_stages - 1), *initial,
                          inputs_dict={cycle.inputs[len(carried) + i]: latest[t]
                                       for i, t in enumerate(self.external_inputs)})
        latest.update(zip(carried, outs))

    def _info(self, key: str):
        """The TensorInfo of an original tensor or snapshot key."""
        return self.graph._data.tensors[key.split("@")[0]]

    def _latest(self, latest: Dict[str, popxl.Tensor], key: str) -> popxl.Tensor:
        """The current value of `key`, or zeros if no cycle has made it yet (ramp-up)."""
        t = latest.get(key)
        if t is None:
            info = self._info(key)
            t = ops.init(info.shape, info.dtype, "pipeline_ramp_up", "zero",
                         meta_shape=info.meta_shape or None)
            latest[key] = t
        return t

    def _call(self, sg: Optional[_StageGraph], latest: Dict[str, popxl.Tensor]) -> None:
        if sg is None:
            return
        outs = ops.call(sg.graph, *[self._latest(latest, k) for k in sg.input_keys])
        latest.update(zip(sg.output_keys, outs))

    def cycle(self, start: int, end: int, latest: Dict[str, popxl.Tensor]) -> None:
        """One pipeline cycle of stages [start, end): loads, compute, stores, then the copies."""
        self.load(start, end, latest)
        self.compute(start, end, latest)
        self.store(start, end, latest)
        self.copy(latest)

    def load(self, start: int, end: int, latest: Dict[str, popxl.Tensor]) -> None:
        for s in range(start, end):
            self._call(self.loads.get(s), latest)

    def compute(self, start: int, end: int, latest: Dict[str, popxl.Tensor]) -> None:
        for s in range(start, end):
            self._call(self.stages.get(s), latest)

    def store(self, start: int, end: int, latest: Dict[str, popxl.Tensor]) -> None:
        for s in range(start, end):
            self._call(self.stores.get(s), latest)

    def copy(self, latest: Dict[str, popxl.Tensor]) -> None:
        self._call(self.ipu_copies, latest)
