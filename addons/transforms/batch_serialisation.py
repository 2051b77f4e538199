"""Batch serialisation: run a graph `steps` times over micro batches that come from host streams
or remote buffers and go back to them.

`batch_serialise(graph, steps, ...)` returns a graph whose first input is a row number `n` (an
int32 scalar, e.g. the layer index in phased execution). Calling it runs `graph` once per step
i = 0..steps-1: inputs with a load handle are loaded (one host transfer per step, or remote
buffer entry `n * steps + i`, shifted by the handle's row offset), all-gathered when the handle
is replica-sharded, `graph` is called (with a fresh seed per step when `seed_input` is given),
and the tensors with store handles are stored the same way (replica-sharded slices for sharded
buffers). The numbers equal calling `graph` `steps` times in order with those values.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import popxl
from popxl import ops

from ..graph import GraphWithNamedArgs
from ..named_tensors import NamedTensors
from ..rts import gather_replica_sharded_tensor, replica_sharded_spec
from ..utils import null_context, suffix_graph_name

__all__ = ["RemoteHandle", "BatchSerialResult", "batch_serial_buffer", "batch_serialise",
           "batch_serialise_fwd_and_grad", "batch_serialise_non_overlapped",
           "batch_serialise_overlapped", "RemoteBufferWithOffset", "null_context"]

RowOffset = Union[int, None, Callable[[popxl.Tensor], Any]]
RemoteBufferWithOffset = Tuple[popxl.RemoteBuffer, Optional[int]]
IO_MODES = ("compute", "io", "io_overlapped")


@dataclass
class RemoteHandle:
    """Where a batch-serialised tensor lives: rows of `steps` entries of `buffer`.

    Args:
        buffer: the remote buffer (RTS-sharded when `shard_group` has more than one replica).
        row_offset: the row of call `n` is `n + row_offset` (int); `None` always uses row 0;
            a callable maps the row-number tensor `n` to the row (a Tensor or an int).
        shard_group: replicas the stored values are sharded over (default: not sharded).
    """

    buffer: popxl.RemoteBuffer
    row_offset: RowOffset = 0
    shard_group: Optional[popxl.ReplicaGrouping] = None

    @property
    def sharded(self) -> bool:
        return self.shard_group is not None and self.shard_group.group_size > 1


@dataclass
class BatchSerialResult:
    """The batch-serialised graph, the buffers it stores to, and the input remapping.

    Attributes:
        graph: the new graph; its args are the original named args that are passed through.
        stored_buffers: {original tensor: RemoteHandle it is stored to}.
    """

    graph: GraphWithNamedArgs
    stored_buffers: Dict[popxl.Tensor, RemoteHandle]
    _remap_dict: Dict[popxl.Tensor, popxl.Tensor]

    def remap_tensors(self, ts: NamedTensors) -> NamedTensors:
        """`ts` (tensors of the original graph) as the matching inputs of the new graph; keys
        whose tensors were not passed through are dropped."""
        return NamedTensors.from_dict({k: self._remap_dict[t] for k, t in ts.to_dict().items()
                                       if t in self._remap_dict})


def batch_serial_buffer(t: popxl.Tensor, steps: int = 1, rows: int = 1,
                        shard_group: Optional[popxl.ReplicaGrouping] = None) -> popxl.RemoteBuffer:
    """A remote buffer of `steps * rows` entries for values like `t` (each entry the RTS shard
    over `shard_group` when it has more than one replica)."""
    from ..remote import create_remote_buffer

    _check_count(steps, "steps", "batch_serial_buffer")
    _check_count(rows, "rows", "batch_serial_buffer")
    spec = t.spec if not isinstance(t, popxl.TensorSpec) else t
    if shard_group is not None and shard_group.group_size > 1:
        spec = replica_sharded_spec(spec, shard_group)
    return create_remote_buffer(spec, steps * rows)


def _check_count(v: Any, name: str, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{what}: {name} must be an int >= 1, got {v!r}")
    return v


def _as_handle(v: Any, key: popxl.Tensor, what: str) -> RemoteHandle:
    if isinstance(v, RemoteHandle):
        h = v
    elif isinstance(v, tuple) and 2 <= len(v) <= 3 and isinstance(v[0], popxl.RemoteBuffer):
        h = RemoteHandle(*v)
    else:
        raise TypeError(f"{what}: the handle of '{key.id}' must be a RemoteHandle or a tuple "
                        f"(buffer, row_offset[, shard_group]), got {v!r}")
    if not isinstance(h.buffer, popxl.RemoteBuffer):
        raise TypeError(f"{what}: the handle of '{key.id}' has no popxl.RemoteBuffer")
    if not (h.row_offset is None or callable(h.row_offset) or
            (isinstance(h.row_offset, int) and not isinstance(h.row_offset, bool))):
        raise TypeError(f"{what}: row_offset of '{key.id}' must be an int, None or a callable, "
                        f"got {h.row_offset!r}")
    return h


def _check_buffer(h: RemoteHandle, t: popxl.Tensor, what: str) -> None:
    """The buffer must hold values like `t` (or its RTS shard when the handle is sharded)."""
    buf = h.buffer
    spec = replica_sharded_spec(t, h.shard_group) if h.sharded else t.spec
    if tuple(buf.tensor_shape) != tuple(spec.shape) or buf.tensor_dtype != t.dtype:
        raise ValueError(f"{what}: remote buffer {buf.remote_buffer_id} holds "
                         f"{buf.tensor_shape} {buf.tensor_dtype.name}, but '{t.id}' needs "
                         f"{tuple(spec.shape)} {t.dtype.name}"
                         + (" (its RTS shard)" if h.sharded else ""))


class _Serialiser:
    """Builds the batch-serialised graph of one `GraphWithNamedArgs`."""

    def __init__(self, graph: GraphWithNamedArgs, steps: int, load_handles: Mapping,
                 store_streams: Mapping, store_buffers: Mapping,
                 seed_input: Optional[popxl.Tensor], rows: int, use_io_tiles: bool,
                 what: str):
        if not isinstance(graph, GraphWithNamedArgs):
            raise TypeError(f"{what}: 'graph' must be a GraphWithNamedArgs, got "
                            f"{type(graph).__name__}")
        self.what = what
        self.named = graph
        self.g = g = graph.graph
        self.steps = _check_count(steps, "steps", what)
        self.rows = _check_count(rows, "rows", what)
        self.io = use_io_tiles
        ins, outs = list(g.inputs), list(g.outputs)
        self.loads: Dict[popxl.Tensor, Union[popxl.HostToDeviceStream, RemoteHandle]] = {}
        for t, v in (load_handles or {}).items():
            if t not in ins:
                raise ValueError(f"{what}: load handle key '{getattr(t, 'id', t)}' is not an "
                                 f"input of graph '{g.id}'")
            if isinstance(v, popxl.HostToDeviceStream):
                if v.shape != t.shape or v.dtype != t.dtype:
                    raise ValueError(f"{what}: stream '{v.tensor_id}' {v.shape} {v.dtype.name} "
                                     f"does not match input '{t.id}' {t.shape} {t.dtype.name}")
                self.loads[t] = v
            else:
                h = _as_handle(v, t, what)
                _check_buffer(h, t, what)
                self.loads[t] = h
        self.host_stores: Dict[popxl.Tensor, popxl.DeviceToHostStream] = {}
        for t, s in (store_streams or {}).items():
            self._check_key(t, ins, outs, "store stream")
            if not isinstance(s, popxl.DeviceToHostStream):
                raise TypeError(f"{what}: the store stream of '{t.id}' must be a "
                                f"DeviceToHostStream, got {type(s).__name__}")
            if s.shape != t.shape or s.dtype != t.dtype:
                raise ValueError(f"{what}: stream '{s.tensor_id}' {s.shape} {s.dtype.name} does "
                                 f"not match '{t.id}' {t.shape} {t.dtype.name}")
            self.host_stores[t] = s
        self.buffer_stores: Dict[popxl.Tensor, RemoteHandle] = {}
        for t, v in (store_buffers or {}).items():
            self._check_key(t, ins, outs, "store buffer")
            h = _as_handle(v, t, what)
            _check_buffer(h, t, what)
            self.buffer_stores[t] = h
        if seed_input is not None:
            if seed_input not in ins or seed_input.shape != (2,) or \
                    seed_input.dtype != popxl.uint32:
                raise ValueError(f"{what}: seed_input must be a uint32 (2,) input of graph "
                                 f"'{g.id}', got {seed_input!r}")
            if seed_input in self.loads:
                raise ValueError(f"{what}: seed_input '{seed_input.id}' also has a load handle")
        self.seed_input = seed_input
        self.passthrough = [t for t in ins if t not in self.loads and t != seed_input]
        self.handles: List[RemoteHandle] = []
        for h in [*self.loads.values(), *self.buffer_stores.values()]:
            if isinstance(h, RemoteHandle) and not any(h is x for x in self.handles):
                self.handles.append(h)
                self._grow(h)

    def _check_key(self, t: Any, ins, outs, kind: str) -> None:
        if not isinstance(t, popxl.Tensor) or (t not in ins and t not in outs):
            raise ValueError(f"{self.what}: {kind} key '{getattr(t, 'id', t)}' is not an input "
                             f"or output of graph '{self.g.id}'")

    def _grow(self, h: RemoteHandle) -> None:
        if isinstance(h.row_offset, int):
            need = self.steps * (h.row_offset + self.rows)
        elif h.row_offset is None:
            need = self.steps
        else:
            need = self.steps * self.rows
        h.buffer.entries = max(h.buffer.entries, need)

    # --- graph pieces --------------------------------------------------------------------
    def _row_bases(self, n: popxl.Tensor) -> List[popxl.Tensor]:
        """Per handle, the first entry of this call's row: row(n) * steps (int32)."""
        bases = []
        for h in self.handles:
            if h.row_offset is None:
                row = popxl.constant(0, popxl.int32, "row")
            elif callable(h.row_offset):
                row = h.row_offset(n)
                if not isinstance(row, popxl.Tensor):
                    row = popxl.constant(int(row), popxl.int32, "row")
                elif row.dtype != popxl.int32 or row.nelms != 1:
                    raise ValueError(f"{self.what}: row_offset callable must return an int32 "
                                     f"scalar, got {row!r}")
            else:
                row = n + h.row_offset if h.row_offset else n
            bases.append(row * self.steps)
        return bases

    def _tiles(self):
        return popxl.io_tiles() if self.io else null_context()

    def _load(self, t: popxl.Tensor, index: Dict[int, popxl.Tensor]) -> popxl.Tensor:
        src = self.loads[t]
        with self._tiles():
            if isinstance(src, popxl.HostToDeviceStream):
                v = ops.host_load(src, t.name)
            else:
                v = ops.remote_load(src.buffer, index[id(src)], t.name)
            if self.io:
                v = ops.io_tile_copy(v)
        if isinstance(src, RemoteHandle) and src.sharded:
            v = gather_replica_sharded_tensor(v, replica_group=src.shard_group)
            if v.shape != t.shape:
                v = v.reshape(t.shape)
        return v

    def _store(self, t: popxl.Tensor, value: popxl.Tensor,
               index: Dict[int, popxl.Tensor]) -> None:
        if t in self.host_stores:
            with self._tiles():
                ops.host_store(self.host_stores[t], ops.io_tile_copy(value) if self.io else value)
        h = self.buffer_stores.get(t)
        if h is not None:
            if h.sharded:
                value = ops.collectives.replica_sharded_slice(value, group=h.shard_group)
            with self._tiles():
                ops.remote_store(h.buffer, index[id(h)],
                                 ops.io_tile_copy(value) if self.io else value)

    def _indices(self, i: popxl.Tensor, bases: List[popxl.Tensor]) -> Dict[int, popxl.Tensor]:
        return {id(h): b + i for h, b in zip(self.handles, bases)}

    def _loads(self, i, bases) -> List[popxl.Tensor]:
        index = self._indices(i, bases)
        return [self._load(t, index) for t in self.loads]

    def _compute(self, i, bases, loaded: List[popxl.Tensor], seed: Optional[popxl.Tensor],
                 passthrough: List[popxl.Tensor]) -> Optional[popxl.Tensor]:
        """Call the graph for step `i` and store its results; returns the next seed."""
        values = dict(zip(self.loads, loaded))
        values.update(zip(self.passthrough, passthrough))
        next_seed = None
        if self.seed_input is not None:
            step_seed, next_seed = ops.split_random_seed(seed)
            values[self.seed_input] = step_seed
        outs = ops.call(self.g, inputs_dict=values)
        values.update(zip(self.g.outputs, outs))
        index = self._indices(i, bases)
        for t in [*self.host_stores, *[t for t in self.buffer_stores
                                       if t not in self.host_stores]]:
            self._store(t, values[t], index)
        return next_seed

    def _inputs(self, with_loaded: bool):
        """Graph inputs of a step graph: carried (i, seed, loaded), then bases, passthrough."""
        i = popxl.graph_input((), popxl.int32, "batch_serial_step")
        seed = (popxl.graph_input((2,), popxl.uint32, "seed") if self.seed_input is not None
                else None)
        loaded = ([popxl.graph_input(t.shape, t.dtype, t.name) for t in self.loads]
                  if with_loaded else [])
        bases = [popxl.graph_input((), popxl.int32, f"row_base_{k}")
                 for k in range(len(self.handles))]
        by_ref = self.g._by_ref_inputs
        passthrough = [popxl.graph_input(t.shape, t.dtype, t.name, by_ref=t in by_ref,
                                         meta_shape=t.meta_shape or None)
                       for t in self.passthrough]
        return i, seed, loaded, bases, passthrough

    def build(self, overlapped: bool) -> BatchSerialResult:
        ir = self.g.ir
        outer = ir.create_empty_graph(suffix_graph_name(self.g.name, "_repeat_graph"))
        step = ir.create_empty_graph(suffix_graph_name(self.g.name, "_batch_serial_step"))
        by_ref = self.g._by_ref_inputs
        with outer, popxl.in_sequence(True):
            n = popxl.graph_input((), popxl.int32, "batch_serial_loop_index")
            seed = (popxl.graph_input((2,), popxl.uint32, "seed")
                    if self.seed_input is not None else None)
            passthrough = [popxl.graph_input(t.shape, t.dtype, t.name, by_ref=t in by_ref,
                                             meta_shape=t.meta_shape or None)
                           for t in self.passthrough]
            bases = self._row_bases(n)
        with step, popxl.in_sequence(True):
            s_i, s_seed, s_loaded, s_bases, s_pass = self._inputs(overlapped)
            if overlapped:
                nxt = self._loads(s_i + 1, s_bases)
                s_next_seed = self._compute(s_i, s_bases, s_loaded, s_seed, s_pass)
            else:
                s_next_seed = self._compute(s_i, s_bases, self._loads(s_i, s_bases), s_seed,
                                            s_pass)
                nxt = []
            popxl.graph_output(s_i + 1)
            if s_seed is not None:
                popxl.graph_output(s_next_seed)
            for t in nxt:
                popxl.graph_output(t)
        with outer, popxl.in_sequence(True):
            i0 = popxl.constant(0, popxl.int32, "batch_serial_step_0")
            carried = [i0] + ([seed] if seed is not None else [])
            count = self.steps
            if overlapped:
                carried += self._loads(i0, bases)
                count -= 1
            fixed = bases + passthrough
            n_carried = len(carried)
            inputs = {step.inputs[n_carried + k]: v for k, v in enumerate(fixed)}
            outs = ops.repeat(step, count, *carried, inputs_dict=inputs)
            if overlapped:
                last_i, rest = outs[0], list(outs[1:])
                last_seed = rest.pop(0) if seed is not None else None
                self._compute(last_i, bases, rest, last_seed, passthrough)
        remap = dict(zip(self.passthrough, passthrough))
        if self.seed_input is not None:
            remap[self.seed_input] = seed
        args = NamedTensors.from_dict({k: remap[t] for k, t in self.named.args.to_dict().items()
                                       if t in remap})
        return BatchSerialResult(GraphWithNamedArgs(outer, args), dict(self.buffer_stores), remap)


def batch_serialise_non_overlapped(graph: GraphWithNamedArgs, steps: int, load_handles: Mapping,
                                   store_streams: Mapping, store_buffers: Mapping,
                                   seed_input: Optional[popxl.Tensor] = None, rows: int = 1,
                                   use_io_tiles: bool = False) -> BatchSerialResult:
    """`batch_serialise` where each step loads, computes and stores in turn ("compute" mode,
    or "io" with `use_io_tiles`)."""
    return _Serialiser(graph, steps, load_handles, store_streams, store_buffers, seed_input,
                       rows, use_io_tiles, "batch_serialise").build(overlapped=False)


def batch_serialise_overlapped(graph: GraphWithNamedArgs, steps: int, load_handles: Mapping,
                               store_streams: Mapping, store_buffers: Mapping,
                               seed_input: Optional[popxl.Tensor] = None,
                               rows: int = 1) -> BatchSerialResult:
    """`batch_serialise` whose loads run one step ahead of the compute ("io_overlapped": the
    loads of step i + 1 are issued before step i computes, on the IO tiles).

    Equal to the non-overlapped result unless a step loads an entry an earlier step of the same
    call stores (the load now happens first)."""
    if steps < 2:
        raise ValueError(f"batch_serialise_overlapped: needs steps >= 2, got {steps}")
    return _Serialiser(graph, steps, load_handles, store_streams, store_buffers, seed_input,
                       rows, True, "batch_serialise").build(overlapped=True)


def batch_serialise(graph: GraphWithNamedArgs, steps: int, load_handles: Mapping,
                    store_streams: Mapping, store_buffers: Mapping,
                    seed_input: Optional[popxl.Tensor] = None, rows: int = 1,
                    io_mode: str = "io") -> BatchSerialResult:
    """Run `graph` over `steps` micro batches per call (see the module docstring).

    Args:
        graph: the graph to serialise.
        steps: micro batches per call.
        load_handles: {graph input: HostToDeviceStream | RemoteHandle |
            (buffer, row_offset[, shard_group])}.
        store_streams: {graph input or output: DeviceToHostStream}.
        store_buffers: {graph input or output: RemoteHandle | tuple}.
        seed_input: a uint32 (2,) input that gets a fresh seed (split from the new graph's
            `seed` input) every step.
        rows: rows each buffer must hold (buffers grow to `steps * (row_offset + rows)`).
        io_mode: "compute", "io" (loads and stores on the IO tiles) or "io_overlapped" (also
            loads one step ahead). The IO modes need `numIOTiles > 0` in the session options;
            tiles do not change the numbers.

    Returns:
        A BatchSerialResult. Its graph's inputs are the row number `n` (int32 scalar), the seed
        (if any) and the inputs without a load handle. Usage:
        `result.graph.bind(args).call(n)`.
    """
    if io_mode not in IO_MODES:
        raise ValueError(f"batch_serialise: io_mode must be one of {IO_MODES}, got {io_mode!r}")
    if io_mode != "compute":
        ir = graph.graph.ir if isinstance(graph, GraphWithNamedArgs) else popxl.gcg().ir
        if ir._pb_ir.getSessionOptions().numIOTiles <= 0:
            raise ValueError(f"batch_serialise: io_mode '{io_mode}' uses IO tiles, but the "
                             f"session options have numIOTiles = 0. Set "
                             f"`ir._pb_ir.getSessionOptions().numIOTiles` (e.g. 32) or use "
                             f"io_mode='compute'")
    if io_mode == "io_overlapped" and isinstance(steps, int) and steps < 2:
        warnings.warn("batch_serialise: io_mode 'io_overlapped' needs steps >= 2; using 'io'")
        io_mode = "io"
    if io_mode == "io_overlapped":
        return batch_serialise_overlapped(graph, steps, load_handles, store_streams,
                                          store_buffers, seed_input, rows)
    return batch_serialise_non_overlapped(graph, steps, load_handles, store_streams,
                                          store_buffers, seed_input, rows,
                                          use_io_tiles=io_mode == "io")


def batch_serialise_fwd_and_grad(forward_graph: GraphWithNamedArgs,
                                 gradient_graph: GraphWithNamedArgs,
                                 named_inputs_for_grad_graph: NamedTensors, steps: int,
                                 load_handles: Mapping, store_streams: Mapping,
                                 store_buffers: Mapping,
                                 seed_input: Optional[popxl.Tensor] = None, rows: int = 1,
                                 io_mode: str = "io"
                                 ) -> Tuple[BatchSerialResult, BatchSerialResult]:
    """Batch-serialise a forward graph and its gradient graph together.

    The activations the gradient graph needs (its `Fwd` inputs) travel through remote buffers:
    those in `named_inputs_for_grad_graph` (usually the forward graph's named args: weights)
    are passed to the gradient graph directly instead; a forward input loaded from a remote
    buffer is loaded again from the same handle; every other one gets a buffer of
    `steps * rows` entries (`batch_serial_buffer`; a `store_buffers` value that is a
    ReplicaGrouping shards it over that group) that the forward loop stores to and the
    gradient loop loads from. The seed each forward step used (`seed_input`, when the gradient
    needs it, e.g. a `recompute_graph` gradient or a dropout mask) is such an activation too,
    so the gradient graph takes no seed input. The gradient's `FwdGrad` inputs must have load
    handles.

    The dicts may mix tensors of both graphs; each is used for the graph it belongs to.
    `gradient_graph.args` is replaced by the named forward inputs (keys of
    `named_inputs_for_grad_graph`) followed by its previous args, e.g.
    `grad_vars = dargs.init(); grad_vars.update(weights); bs_grad.graph.bind(grad_vars)`.

    Returns:
        (forward result, gradient result); the gradient result's graph has a `grad_graph_info`
        connecting it to the forward result's graph.
    """
    from popxl.transforms import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

    what = "batch_serialise_fwd_and_grad"
    for name, g in (("forward_graph", forward_graph), ("gradient_graph", gradient_graph)):
        if not isinstance(g, GraphWithNamedArgs):
            raise TypeError(f"{what}: '{name}' must be a GraphWithNamedArgs, got "
                            f"{type(g).__name__}")
    info = gradient_graph.grad_graph_info
    fwd, bwd = forward_graph.graph, gradient_graph.graph
    if info.forward_graph != fwd:
        raise ValueError(f"{what}: '{bwd.id}' is not the gradient graph of '{fwd.id}'")

    def of(graph, d: Mapping) -> Dict:
        return {t: v for t, v in (d or {}).items()
                if isinstance(t, popxl.Tensor) and t._graph == graph}

    fwd_loads, bwd_loads = of(fwd, load_handles), of(bwd, load_handles)
    fwd_streams, bwd_streams = of(fwd, store_streams), of(bwd, store_streams)
    fwd_buffers, bwd_buffers = {}, of(bwd, store_buffers)
    shard_for: Dict[popxl.Tensor, popxl.ReplicaGrouping] = {}
    for t, v in of(fwd, store_buffers).items():
        if isinstance(v, popxl.ReplicaGrouping):
            shard_for[t] = v
        else:
            fwd_buffers[t] = v
    named = {t: k for k, t in (named_inputs_for_grad_graph or NamedTensors()).to_dict().items()}
    bwd_ins = bwd.inputs
    new_args: Dict[str, popxl.Tensor] = {}
    for i, ec in enumerate(info.expected_inputs):
        g_in, a = bwd_ins[i], ec.fwd_tensor
        if ec.connection_type == ExpectedConnectionType.FwdGrad:
            if g_in not in bwd_loads:
                raise ValueError(f"{what}: gradient input '{g_in.id}' (the gradient of "
                                 f"'{a.id}') needs a load handle")
            continue
        # The seed (`seed_input`) is an activation like any other: the forward loop stores
        # the seed each step used and the gradient loop loads it, so the gradient graph
        # (e.g. a recomputed one) sees the same seed without taking one itself.
        if a in named:
            new_args[named[a]] = g_in
        elif g_in in bwd_loads:
            continue
        elif a in fwd_loads and isinstance(fwd_loads[a], (RemoteHandle, tuple)):
            bwd_loads[g_in] = fwd_loads[a]
        else:
            if a not in fwd_buffers:
                group = shard_for.get(a)
                fwd_buffers[a] = RemoteHandle(batch_serial_buffer(a, steps, rows, group), 0,
                                              group)
            bwd_loads[g_in] = fwd_buffers[a]
    fwd_result = batch_serialise(forward_graph, steps, fwd_loads, fwd_streams, fwd_buffers,
                                 seed_input, rows, io_mode)
    args = NamedTensors.from_dict(new_args)
    args.update(gradient_graph.args)
    gradient_graph.args = args
    grad_result = batch_serialise(gradient_graph, steps, bwd_loads, bwd_streams, bwd_buffers,
                                  None, rows, io_mode)
    # Inputs that stand for forward values: the row number, the named fwd inputs.
    f_remap = fwd_result._remap_dict
    g_outer, f_outer = grad_result.graph.graph, fwd_result.graph.graph
    conns = [ExpectedConnection(f_outer.inputs[0], ExpectedConnectionType.Fwd)]
    g_remap = grad_result._remap_dict
    fwd_of = {g_remap[bwd_ins[i]]: ec.fwd_tensor for i, ec in enumerate(info.expected_inputs)
              if bwd_ins[i] in g_remap}
    for t in g_outer.inputs[len(conns):]:
        a = fwd_of.get(t)
        if a is None or a not in f_remap:
            break
        conns.append(ExpectedConnection(f_remap[a], ExpectedConnectionType.Fwd))
    grad_result.graph.grad_graph_info = GradGraphInfo(g_outer, f_outer, conns, [])
    return fwd_result, grad_result
