"""Compile an IR once into Python functions that call pre-bound NumPy kernels.

Each graph becomes generated straight-line code (`run(ctx, *inputs) -> outputs`): one line per op,
locals for intermediates, `del` after last use, constants and kernels bound as globals. Calls,
loops and conditionals call the callee's compiled function. No name lookups, shape inference or
validation happen at run time.

Aliasing: NumPy views make reshape/transpose/slice free, but upstream's tensors are values. A view
is copied only where a later in-place write would be observable through it (see `_plan_copies`).
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from .._ir.records import GraphData, IrData, Op, TensorKind
from ..errors import DeviceRuntimeError, EngineError, EngineRuntimeError
from .kernels import load_all
from . import batch_collectives, memory_plan
from .instrument import Instrument
from .kernels.registry import CONTROL_FLOW_TYPES, KERNELS, KernelSpec, spec_of
from .memory_plan import MemoryPlan, plan_memory

__all__ = ["Program", "CompiledGraph", "CompileEnv", "CollectiveStep", "stream_slots"]

_CODE_IDS = itertools.count()
_FILENAME_PREFIX = "<popxl-graph "


class CompileEnv:
    """What context kernels may ask the compiler for: stream and remote-buffer slots."""

    def __init__(self, program: "Program"):
        self._program = program

    def h2d_slot(self, stream_id: str) -> int:
        return self._program.h2d_streams.index(stream_id)

    def d2h_slot(self, stream_id: str) -> int:
        return self._program.d2h_streams.index(stream_id)

    @property
    def ir(self) -> IrData:
        return self._program.ir


def stream_slots(ir: IrData) -> Tuple[List[str], List[str]]:
    """The host-to-device and device-to-host stream ids the program uses, in slot order."""
    h2d: List[str] = []
    d2h: List[str] = []
    for gd in ir.graphs.values():
        for op in gd.ops:
            if op.type == "HostLoad" and op.attrs["stream"] not in h2d:
                h2d.append(op.attrs["stream"])
            if op.type == "HostStore" and op.attrs["stream"] not in d2h:
                d2h.append(op.attrs["stream"])
    return h2d, d2h


class CollectiveStep:
    """A collective op as the executor sees it: graphs that contain collectives compile to
    generators that `yield (step, inputs)`; the executor gathers every local replica's inputs and
    calls `step.fn(comm, per_replica_inputs) -> per_replica_outputs`."""

    __slots__ = ("fn", "op", "tag", "ops")

    def __init__(self, fn: Callable, op: Op, ops: Optional[List[Op]] = None):
        self.fn = fn
        self.op = op
        self.tag = int(op.id) % 32768
        self.ops = tuple(ops) if ops else (op,)     # a batched step runs several collectives


def _reshape_sync_lines(plan: "_AliasPlan", pos: int, name_of: Callable[[str], str]
                        ) -> List[str]:
    """The generated lines after op `pos` that keep reshape_ copies equal to their inputs."""
    lines = []
    flagged = plan.reshape_flags.get(pos)
    if flagged is not None:
        flag, a, b = flagged
        lines.append(f"    {flag} = not np.may_share_memory({name_of(b)}, {name_of(a)})")
    for flag, dst, src, shape in plan.reshape_syncs.get(pos, ()):
        lines.append(f"    if {flag}: {name_of(dst)}[...] = {name_of(src)}.reshape({shape!r})")
    return lines


class CompiledGraph:
    """One graph compiled: `run(ctx, *inputs) -> tuple(outputs)` plus its aliasing summary and
    its memory plan (`memory_plan`, see engine/memory_plan.py).

    With `has_collectives`, `run` is a generator function (see `CollectiveStep`)."""

    def __init__(self, gid: str, run: Callable, modified_inputs: Set[int],
                 has_collectives: bool, ops: List[Op], line_to_op: Dict[int, Op], filename: str,
                 source: str, memory_plan: Optional[MemoryPlan] = None):
        self.gid = gid
        self.run = run
        self.modified_inputs = modified_inputs
        self.has_collectives = has_collectives
        self.ops = ops
        self.line_to_op = line_to_op
        self.filename = filename
        self.source = source
        self.memory_plan = memory_plan or MemoryPlan(graph=gid)
        self.local_names: Dict[str, str] = {}     # tensor id -> its local in the source


class Program:
    """All graphs of an IR compiled for one worker; the main graph split by execution context.

    `instrument` adds debugging lines around the ops (see `engine/instrument.py`); without it
    the generated code is the plain program."""

    def __init__(self, ir: IrData, instrument: Optional[Instrument] = None):
        load_all()
        self.ir = ir
        self.instrument = instrument if instrument is not None and instrument.active else None
        main = ir.main
        # Device state: on-chip variables, plus tensors the WeightsFromHost fragment produces
        # for the rest of the program (RTS shards). Remote variables live in remote buffers.
        self.state_ids: List[str] = [t for t, i in main.tensors.items()
                                     if i.kind == TensorKind.VARIABLE
                                     and "remote" not in (i.extra or {})]
        self._check_remote_variables_unused(main)
        used_outside = {t for op in main.ops if op.exec_ctx != "WeightsFromHostFragment"
                        for t in op.inputs}
        fragment_outs = [o for op in main.ops if op.exec_ctx == "WeightsFromHostFragment"
                         for o in op.outputs if o in used_outside]
        self.state_ids += [o for o in fragment_outs if o not in self.state_ids]
        self.state_index = {t: i for i, t in enumerate(self.state_ids)}
        self.h2d_streams, self.d2h_streams = stream_slots(ir)
        self.env = CompileEnv(self)
        self._graphs: Dict[str, CompiledGraph] = {}
        self._by_filename: Dict[str, CompiledGraph] = {}
        self.main = self._compile_main("Normal")
        self.weights_from_host = self._compile_main("WeightsFromHostFragment")
        self.weights_to_host = self._compile_main("WeightsToHostFragment")

    @staticmethod
    def _check_remote_variables_unused(main: GraphData) -> None:
        remote = {t for t, i in main.tensors.items()
                  if i.kind == TensorKind.VARIABLE and "remote" in (i.extra or {})}
        for op in main.ops:
            for t in op.inputs:
                if t in remote:
                    buf = main.tensors[t].extra["remote"][0]
                    raise ValueError(
                        f"{op.describe()} reads remote variable '{t}' directly; it lives in "
                        f"remote buffer {buf}: bring it on chip with ops.remote_load (or use "
                        f"the shard returned by popxl.replica_sharded_variable)")

    # --- public ------------------------------------------------------------------------
    def graph(self, gid: str) -> CompiledGraph:
        cg = self._graphs.get(gid)
        if cg is None:
            gd = self.ir.graphs[gid]
            cg = self._compile(gd, gd.ops, list(gd.inputs), list(gd.outputs), is_main=False)
            self._graphs[gid] = cg
        return cg

    def explain(self, exc: BaseException) -> Optional[Tuple[Op, str]]:
        """The op (and graph id) whose generated line raised `exc`, innermost first."""
        found = self.failing_frame(exc)
        return None if found is None else found[:2]

    def failing_frame(self, exc: BaseException):
        """(op, graph id, its values by tensor id) of the innermost generated line that
        `exc` passed through, or None: the values are those the op's inputs had when it
        failed (for error reports)."""
        tb = exc.__traceback__
        found = None
        while tb is not None:
            fn = tb.tb_frame.f_code.co_filename
            cg = self._by_filename.get(fn)
            if cg is not None:
                op = cg.line_to_op.get(tb.tb_lineno)
                if op is not None:
                    found = (op, cg, tb.tb_frame)
            tb = tb.tb_next
        if found is None:
            return None
        op, cg, frame = found
        local = frame.f_locals
        values = {t: local[n] for t, n in cg.local_names.items() if n in local}
        return op, cg.gid, values

    # --- compilation -------------------------------------------------------------------
    def _compile_main(self, exec_ctx: str) -> CompiledGraph:
        gd = self.ir.main
        ops = [op for op in gd.ops if op.exec_ctx == exec_ctx]
        return self._compile(gd, ops, [], [], is_main=True, tag=exec_ctx)

    def _spec(self, op: Op) -> Optional[KernelSpec]:
        if op.type in CONTROL_FLOW_TYPES:
            return None
        spec = spec_of(op)
        if spec is None:
            raise NotImplementedError(
                f"No kernel is registered for op type '{op.type}' ({op.describe()})")
        return spec

    def _ops_have_collectives(self, ops: List[Op]) -> bool:
        for op in ops:
            if op.type in CONTROL_FLOW_TYPES:
                if any(self.graph(c).has_collectives for c in op.called):
                    return True
            elif self._spec(op).collective:
                return True
        return False

    def _callee_effects(self, op: Op) -> Tuple[Set[int], Set[int], bool]:
        """For a control-flow op: (op input indices written back to the parent, input indices
        to copy on entry, whether the callee runs collectives)."""
        if op.type in ("Call", "Loop"):
            gd = self.ir.graphs[op.called[0]]
            cg = self.graph(op.called[0])
            offset = 2 if op.type == "Loop" else 0
            writes, copies = set(), set()
            for gi in cg.modified_inputs:
                pi = gi - offset
                if pi < 0:
                    continue
                if gd.inputs[gi] in gd.by_ref_inputs or pi in op.attrs.get("modified", ()):
                    writes.add(pi)
                else:
                    copies.add(pi)
            return writes, copies, cg.has_collectives
        if op.type == "If":
            writes, copies, coll = set(), set(), False
            for branch, mapping in zip(op.called, (op.attrs["then_inputs"], op.attrs["else_inputs"])):
                cg = self.graph(branch)
                coll = coll or cg.has_collectives
                for gi in cg.modified_inputs:
                    copies.add(mapping[gi])
            return writes, copies, coll
        raise AssertionError(op.type)

    def _compile(self, gd: GraphData, ops: List[Op], input_ids: List[str],
                 output_ids: List[str], is_main: bool, tag: str = "") -> CompiledGraph:
        instr = self.instrument
        plain = instr is None
        batching = plain or instr.batches_collectives
        if batching:
            ops = batch_collectives.hoist(self, gd, ops)
        plan = _AliasPlan(self, gd, ops, input_ids, output_ids, is_main)
        names: Dict[str, str] = {}
        counter = itertools.count()

        def name_of(tid: str) -> str:
            n = names.get(tid)
            if n is None:
                n = f"v{next(counter)}"
                names[tid] = n
            return n

        glob: Dict[str, Any] = {"np": np}
        lines: List[str] = []
        line_to_op: Dict[int, Op] = {}
        args = ", ".join(name_of(t) for t in input_ids)
        lines.append(f"def run(ctx{', ' + args if args else ''}):")
        body_start = len(lines)
        # Persistent state (main graph) and constants are bound at the top.
        used = {t for op in ops for t in op.inputs} | set(output_ids)
        state_used: List[str] = []
        if is_main:
            state_used = [t for t in self.state_ids if t in used]
            if state_used:
                lines.append("    S = ctx.state")
                for t in state_used:
                    lines.append(f"    {name_of(t)} = S[{self.state_index[t]}]")
        constants = []
        for t in sorted(used):
            info = gd.tensors.get(t)
            if info is not None and info.kind == TensorKind.CONSTANT:
                constants.append(t)
                cname = f"C_{name_of(t)}"
                glob[cname] = info.data
                copy = ".copy()" if t in plan.copy_constants else ""
                lines.append(f"    {name_of(t)} = {cname}{copy}")
        if not plain:
            lines.extend(instr.entry_lines(gd, [*input_ids, *state_used, *constants],
                                           name_of, glob))
        last_use = plan.last_use
        has_collectives = self._ops_have_collectives(ops)
        fns = [self._kernel_fn(gd, op) for op in ops]
        call_outs = {pos: self.graph(op.called[0]).memory_plan.output_roots
                     for pos, op in enumerate(ops) if op.type == "Call"}
        call_aliases = {pos: self.graph(op.called[0]).memory_plan.output_alias
                        for pos, op in enumerate(ops) if op.type == "Call"}
        kinds = [self._plan_kind(op, fn, plan) for op, fn in zip(ops, fns)]
        if not memory_plan.enabled() or not (plain or instr.plans_memory):
            kinds = [k if k in (memory_plan.CONTROL, memory_plan.ALIAS0) else memory_plan.OTHER
                     for k in kinds]
        in_place_inputs = {pos: KERNELS[op.type].inplace for pos, op in enumerate(ops)
                           if kinds[pos] == memory_plan.INPLACE
                           and KERNELS[op.type].inplace is not True}
        mplan = plan_memory(gd, ops, kinds,
                            self._escaping(gd, ops, input_ids, output_ids, plan, is_main),
                            plan.copy_outputs, output_ids, plan.parent, plan.copy_returns,
                            call_outs, in_place_inputs, call_aliases, gd.id,
                            uses_after=plan.last_use)
        if mplan.slot:
            glob["_views"] = _views_getter(mplan)
            lines.append("    B = _views(ctx)")
        if mplan.root_output:
            lines[0] = lines[0][:-2] + ", out=None):"
            glob["_NO_OUT"] = (None,) * len(output_ids)
            lines.append("    O = _NO_OUT if out is None else out")
        batches = batch_collectives.runs(gd, ops) if batching else {}
        batched = {id(m) for run in batches.values() for m in run[1:]}
        for pos, op in enumerate(ops):
            spec = self._spec(op)
            ins = [name_of(t) for t in op.inputs]
            outs = [name_of(t) for t in op.outputs]
            kname = f"K{pos}"
            fn = fns[pos]
            if id(op) in batched:
                call = None                      # ran with the first of its batch
            elif pos in batches:
                run = batches[pos]
                glob[kname] = CollectiveStep(
                    batch_collectives.batched_step(gd, run, fns[pos:pos + len(run)]), op, run)
                ins = [name_of(m.inputs[0]) for m in run]
                outs = [name_of(m.outputs[0]) for m in run]
                call = f"(yield ({kname}, ({''.join(a + ', ' for a in ins)})))"
            elif spec is None:
                writes, copies, coll = self._callee_effects(op)
                call_args = [f"{a}.copy()" if i in copies else a for i, a in enumerate(ins)]
                if _has_out(op, mplan):
                    call_args.append(_out_arg(op, mplan))
                glob[kname] = fn
                call = f"{kname}(ctx{''.join(', ' + a for a in call_args)})"
                if coll:
                    call = f"(yield from {call})"
            elif spec.collective:
                if not plain:
                    fn = instr.collective_fn(fn, op, gd.id, _modified(spec, op))
                glob[kname] = CollectiveStep(fn, op)
                call = f"(yield ({kname}, ({''.join(a + ', ' for a in ins)})))"
            else:
                glob[kname] = fn
                prefix = "ctx, " if spec.context else ""
                args = ins + ([_out_arg(op, mplan)] if _has_out(op, mplan) else [])
                call = f"{kname}({prefix}{', '.join(args)})"
            if call is None:
                stmt = None
            elif pos in batches:
                stmt = f"{', '.join(outs)}, = {call}"
            else:
                stmt = self._statement(gd, op, spec, call, outs, plan)
            pre, post = (((), ()) if plain or stmt is None else
                         instr.around(gd, op, pos, _modified(spec, op), ins, outs, glob,
                                      spec is None, bool(spec and spec.collective)))
            for line in pre:
                lines.append(line)
                line_to_op[len(lines)] = op
            if stmt is not None:
                lines.append(f"    {stmt}")
                line_to_op[len(lines)] = op
            for line in post:
                lines.append(line)
                line_to_op[len(lines)] = op
            lines.extend(_reshape_sync_lines(plan, pos, name_of))
            if is_main:
                for t in op.outputs:
                    if t in self.state_index:
                        lines.append(f"    ctx.state[{self.state_index[t]}] = {names[t]}")
            dead = [names[t] for t in dict.fromkeys(op.inputs + op.outputs)
                    if last_use.get(t, -1) <= pos and t not in plan.keep_alive]
            if dead:
                lines.append(f"    del {', '.join(dead)}")
        rets = []
        for t in output_ids:
            rets.append(f"{name_of(t)}.copy()" if t in plan.copy_returns else name_of(t))
        lines.append(f"    return ({', '.join(rets)}{',' if len(rets) == 1 else ''})")
        if len(lines) == body_start:
            lines.append("    pass")
        source = "\n".join(lines) + "\n"
        filename = f"{_FILENAME_PREFIX}{gd.id or 'main'}{'/' + tag if tag else ''} #{next(_CODE_IDS)}>"
        code = compile(source, filename, "exec")
        exec(code, glob)
        cg = CompiledGraph(gd.id, glob["run"], plan.modified_inputs, has_collectives, ops,
                           line_to_op, filename, source, mplan)
        cg.local_names = names
        self._by_filename[filename] = cg
        return cg

    @staticmethod
    def _statement(gd: GraphData, op: Op, spec: Optional[KernelSpec], call: str,
                   outs: List[str], plan: "_AliasPlan") -> str:
        """The line running one op's `call` and binding its outputs."""
        if (spec is not None and len(op.outputs) == 1 and not spec.collective
                and not spec.modifies and gd.tensors[op.outputs[0]].shape == ()):
            # NumPy gives scalars for 0-d results; keep arrays so in-place ops can follow.
            call = f"np.asarray({call})"
        if spec is not None and op.outputs and op.outputs[0] in plan.copy_outputs:
            call = f"{call}.copy()"
        if not outs:
            return call
        if len(outs) == 1 and spec is not None:
            return f"{outs[0]} = {call}"
        return f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = {call}"

    def _kernel_fn(self, gd: GraphData, op: Op) -> Callable:
        """The bound callable of one op: its kernel, collective step function or callee."""
        spec = self._spec(op)
        if spec is None:
            return self._control_flow_fn(op)
        ins = [gd.tensors[t] for t in op.inputs]
        outs = [gd.tensors[t] for t in op.outputs]
        try:
            if spec.collective:
                return spec.factory(op.attrs, ins, outs)
            if spec.context or spec.settings:
                return spec.factory(op.attrs, ins, outs, self.env)
            return spec.factory(op.attrs, ins, outs)
        except (NotImplementedError, ValueError, TypeError) as e:
            raise type(e)(f"{op.describe()}: {e}") from e

    def _plan_kind(self, op: Op, fn: Callable, plan: "_AliasPlan") -> str:
        spec = self._spec(op)
        if spec is None:
            return memory_plan.CONTROL
        modifying = bool(spec.modifies and spec.modified_inputs(op))
        if modifying and spec.returns_input and not spec.collective and len(op.outputs) == 1:
            return memory_plan.ALIAS0          # its output is its (modified) input 0
        if (spec.view or spec.alias) and not spec.writes_out and len(op.outputs) == 1:
            return memory_plan.ALIAS0          # a view of input 0
        if (not spec.writes_out or spec.collective or getattr(fn, "no_out", False)
                or (modifying and spec.returns_input)
                or any(t in plan.copy_outputs for t in op.outputs)):
            return memory_plan.OTHER
        if spec.view or spec.alias:
            return memory_plan.VIEW_OUT if spec.view and len(op.outputs) == 1 else memory_plan.OTHER
        return memory_plan.INPLACE if spec.inplace else memory_plan.WRITES_OUT

    def _escaping(self, gd: GraphData, ops: List[Op], input_ids: List[str],
                  output_ids: List[str], plan: "_AliasPlan", is_main: bool) -> Set[str]:
        """Tensors whose memory is not the graph run's own: inputs, outputs, state, constants."""
        esc = set(input_ids) | set(output_ids) | plan.keep_alive
        for op in ops:
            for t in op.inputs + op.outputs:
                info = gd.tensors.get(t)
                if info is not None and info.kind in (TensorKind.CONSTANT, TensorKind.VARIABLE):
                    esc.add(t)
        if is_main:
            esc |= set(self.state_ids)
        return esc

    def _control_flow_fn(self, op: Op) -> Callable:
        if op.type == "Call":
            return self.graph(op.called[0]).run
        if op.type == "Loop":
            body_cg = self.graph(op.called[0])
            body = body_cg.run
            trips = int(op.attrs["trip_count"])
            k = len(op.outputs)
            iters = [np.array(i, dtype=np.int32) for i in range(trips)]
            cond = np.array(True)

            def loop(ctx, *args):
                args = list(args)
                for it in iters:
                    res = body(ctx, it, cond, *args)
                    args[:k] = res[1:]
                return tuple(a.copy() if trips == 0 else a for a in args[:k])

            def loop_gen(ctx, *args):
                args = list(args)
                for it in iters:
                    res = yield from body(ctx, it, cond, *args)
                    args[:k] = res[1:]
                return tuple(a.copy() if trips == 0 else a for a in args[:k])

            return loop_gen if body_cg.has_collectives else loop
        if op.type == "If":
            then_cg, else_cg = self.graph(op.called[0]), self.graph(op.called[1])
            then_fn, else_fn = then_cg.run, else_cg.run
            t_idx = list(op.attrs["then_inputs"])
            e_idx = list(op.attrs["else_inputs"])

            def cond_fn(ctx, cond, *args):
                if bool(cond):
                    return then_fn(ctx, *[args[i - 1] for i in t_idx])
                return else_fn(ctx, *[args[i - 1] for i in e_idx])

            def cond_gen(ctx, cond, *args):
                if bool(cond):
                    res = then_fn(ctx, *[args[i - 1] for i in t_idx])
                    return (yield from res) if then_cg.has_collectives else res
                res = else_fn(ctx, *[args[i - 1] for i in e_idx])
                return (yield from res) if else_cg.has_collectives else res

            return cond_gen if then_cg.has_collectives or else_cg.has_collectives else cond_fn
        raise AssertionError(op.type)


# In-place alias kernels that return a copy when NumPy cannot make the view (see
# `_AliasPlan._plan_reshape_syncs`); the other alias kernels (transpose_, slice_) always view.
_ALIASES_THAT_MAY_COPY = frozenset({"ReshapeInplace"})


def _modified(spec: Optional[KernelSpec], op: Op) -> Tuple[int, ...]:
    """The input indices op writes in place (none for control-flow ops)."""
    return spec.modified_inputs(op) if spec is not None and spec.modifies else ()


def _has_out(op: Op, mplan: MemoryPlan) -> bool:
    return any(t in mplan.slot or t in mplan.root_output for t in op.outputs)


def _out_arg(op: Op, mplan: MemoryPlan) -> str:
    """The `out=` argument of an op with planned outputs: its buffer in the plan (`B[i]`), the
    memory the caller provides for a graph output (`O[j]`, None when the caller gives none)."""
    where = []
    for t in op.outputs:
        if t in mplan.slot:
            where.append(f"B[{mplan.slot[t]}]")
        elif t in mplan.root_output:
            where.append(f"O[{mplan.root_output[t]}]")
        else:
            where.append("None")
    if len(where) == 1 and op.type not in CONTROL_FLOW_TYPES:
        return f"out={where[0]}"
    return "out=(" + "".join(w + ", " for w in where) + ")"


def _views_getter(mplan: MemoryPlan) -> Callable:
    """`views(ctx)`: the plan's buffers of replica context `ctx`, allocated on first use."""
    key = object()

    def views(ctx):
        bufs = ctx.buffers
        v = bufs.get(key)
        if v is None:
            v = bufs[key] = mplan.views()
        return v

    return views


class _AliasPlan:
    """Decide where views must become copies, and which graph inputs the graph modifies."""

    def __init__(self, program: Program, gd: GraphData, ops: List[Op], input_ids: List[str],
                 output_ids: List[str], is_main: bool):
        self.copy_outputs: Set[str] = set()
        self.copy_constants: Set[str] = set()
        self.copy_returns: Set[str] = set()
        self.keep_alive: Set[str] = set(output_ids)
        parent: Dict[str, str] = {}          # tensor -> tensor it is a view / alias of
        view_edge: Dict[str, int] = {}       # out-of-place view tensor -> position created
        reads: Dict[str, List[int]] = defaultdict(list)
        mods: List[Tuple[int, str]] = []     # (position, tensor modified)
        last_use: Dict[str, int] = {}
        external: Set[str] = set()           # tensors whose memory the program does not own
        may_copy: List[Tuple[int, str, str]] = []   # (position, input, output) of reshape_
        for pos, op in enumerate(ops):
            for t in op.inputs:
                reads[t].append(pos)
                last_use[t] = pos
            for t in op.outputs:
                last_use.setdefault(t, pos)
            spec = program._spec(op)
            if spec is None:
                writes, _, _ = program._callee_effects(op)
                for i in writes:
                    mods.append((pos, op.inputs[i]))
                continue
            written = spec.modified_inputs(op) if spec.modifies else ()
            if written:
                for i in written:
                    mods.append((pos, op.inputs[i]))
                if op.outputs and spec.returns_input:
                    parent[op.outputs[0]] = op.inputs[0]
            elif spec.alias and op.outputs:
                parent[op.outputs[0]] = op.inputs[0]
                if op.type in _ALIASES_THAT_MAY_COPY:
                    may_copy.append((pos, op.inputs[0], op.outputs[0]))
            elif spec.external and op.outputs:
                external.add(op.outputs[0])       # e.g. HostLoad returns host memory
            elif spec.view and op.outputs:
                parent[op.outputs[0]] = op.inputs[0]
                view_edge[op.outputs[0]] = pos
        self.last_use = last_use

        infinite_reads: Set[str] = set(output_ids)
        for t in input_ids:
            if t in gd.by_ref_inputs:
                infinite_reads.add(t)
        if is_main:
            infinite_reads |= {t for t, i in gd.tensors.items() if i.kind == TensorKind.VARIABLE}
            infinite_reads |= set(program.state_ids)

        def root(t: str) -> str:
            while t in parent:
                t = parent[t]
            return t

        children: Dict[str, Set[str]] = defaultdict(set)
        for c, p in parent.items():
            children[p].add(c)

        def subtree(v: str) -> Set[str]:
            """v and every tensor that views it, directly or through other views."""
            side, todo = {v}, [v]
            while todo:
                for c in children.get(todo.pop(), ()):
                    if c not in side:
                        side.add(c)
                        todo.append(c)
            return side

        last_read = {t: max(ps) for t, ps in reads.items()}
        mods_of: Dict[str, List[int]] = defaultdict(list)
        for p, mt in mods:
            mods_of[mt].append(p)

        def read_after(side: Set[str], p: int) -> bool:
            return any(m in infinite_reads or last_read.get(m, -1) > p for m in side)

        # Out-of-place views, in creation order: copy when a later write to one side of the
        # view (the view and its own views, or the rest of its tree) is observable on the other.
        for v in sorted(view_edge, key=view_edge.get):
            i = view_edge[v]
            members = subtree(root(v))
            v_side = subtree(v)
            u_side = members - v_side
            if any(p > i and read_after(u_side if mt in v_side else v_side, p)
                   for mt in members for p in mods_of.get(mt, ())):
                self.copy_outputs.add(v)
                children[parent.pop(v)].discard(v)     # v now owns its memory

        roots: Dict[str, str] = {}

        def root(t: str) -> str:                      # noqa: F811 - parent is final now
            r = roots.get(t)
            if r is None:
                path = []
                r = t
                while r in parent and r not in roots:
                    path.append(r)
                    r = parent[r]
                r = roots.get(r, r)
                for m in path:
                    roots[m] = r
            return r

        self.parent = parent
        self._plan_reshape_syncs(may_copy, mods, root, subtree, gd)

        modified_roots = {root(t) for _, t in mods}
        for t in external:
            if t in modified_roots:
                self.copy_outputs.add(t)
        for t, info in gd.tensors.items():
            if info.kind == TensorKind.CONSTANT and t in modified_roots:
                self.copy_constants.add(t)
        self.modified_inputs = {i for i, t in enumerate(input_ids) if t in modified_roots}
        # Outputs must not alias inputs, constants, state or each other.
        seen_roots: Set[str] = set()
        for t in output_ids:
            r = root(t)
            info = gd.tensors[r]
            if (r in input_ids or info.kind in (TensorKind.CONSTANT, TensorKind.VARIABLE)
                    or r in seen_roots or r in external):
                self.copy_returns.add(t)
            seen_roots.add(r)

    def _plan_reshape_syncs(self, may_copy, mods, root, subtree, gd) -> None:
        """`reshape_` of an array NumPy cannot view (non-contiguous) gives a copy, yet upstream's
        output aliases its input. Where a later write to either side could be observed, the
        program keeps the two equal: after each write it copies the written side into the other
        (only when the kernel had to copy), through chains of reshape_ in order.

        `self.reshape_flags[pos] = (flag, input, output)`: at the reshape_ op, whether it copied;
        `self.reshape_syncs[p] = [(flag, dst, src, dst shape)]`: the copies after op `p`."""
        self.reshape_flags: Dict[int, Tuple[str, str, str]] = {}
        self.reshape_syncs: Dict[int, List[Tuple[str, str, str, Tuple[int, ...]]]] = {}
        edges = []
        for r, a, b in may_copy:
            later = [(p, m) for p, m in mods if p > r and root(m) == root(a)]
            if not later:
                continue                       # nothing can observe whether it is a copy
            flag = f"copied_{len(self.reshape_flags)}"
            self.reshape_flags[r] = (flag, a, b)
            b_side = subtree(b)
            edges.append((r, a, b, flag, b_side, later))
        for p in sorted({p for *_, later in edges for p, _ in later}):
            up, down = [], []
            for r, a, b, flag, b_side, later in edges:
                for q, m in later:
                    if q != p:
                        continue
                    if m in b_side:    # written through the output: write the input back
                        up.append((r, (flag, a, b, gd.tensors[a].shape)))
                    else:              # written on the input's side: refresh the output
                        down.append((r, (flag, b, a, gd.tensors[b].shape)))
                    self.last_use[a] = max(self.last_use.get(a, p), p)
                    self.last_use[b] = max(self.last_use.get(b, p), p)
                    break
            # Deepest reshape_ first on the way up, then outward from the root on the way down.
            self.reshape_syncs[p] = ([s for _, s in sorted(up, key=lambda e: -e[0])] +
                                     [s for _, s in sorted(down, key=lambda e: e[0])])


def explain_error(program: Program, exc: BaseException) -> BaseException:
    """Wrap an exception raised inside generated code in an EngineError naming the op."""
    found = program.explain(exc)
    if found is None:
        return exc
    op, gid = found
    graph = f"graph '{gid}'" if gid else "the main graph"
    cls = EngineRuntimeError if isinstance(exc, DeviceRuntimeError) else EngineError
    err = cls(f"{op.describe()} in {graph} failed: {type(exc).__name__}: {exc}")
    err.op = op
    return err
