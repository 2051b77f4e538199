"""Which values are the same on every replica of a group, and which variables the program would
let drift apart: the static pass a Session runs when it is created (with more than one replica).

Every value gets a partition of the replicas (see `replica_rules.py`): variables start as their
replica grouping says (one value per group), constants and `init` are the same everywhere, host
data is not, and collectives make their outputs the same within their groups. A variable that is
not replica-sharded (and not read back per replica, `retrieval_mode="all_replicas"`) must hold
the same value within each of its groups when a run ends; one that can differ then is reported,
naming the variable, the op that last updated it from a differing value and where that value
came from. Variables keep their values from run to run, so the main program is analysed until
nothing changes. Called graphs are analysed per call, loops until their carried values settle.

Only updates count, not stores: a variable written with a value that does not depend on its
own (a pipeline stash, an activation buffer: `copy_var_update_`, `dynamic_update_`,
`remote_store` of fresh data) is scratch memory whose replicas may differ, as upstream lets
them; one written from its own value (`w -= lr * g`, an accumulator, `copy_var_update_(w,
w - lr * g)`) carries its difference into every later run. Each value therefore also records
which variables and buffers (or, in a called graph, which of its inputs) it was computed from.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .._ir.partitions import (Partition, canonical as _canonical, coarser_or_equal, meet,
                              variable_partition)
from .._ir.records import GraphData, IrData, Op, TensorKind
from ..engine.comm import members
from ..errors import ReplicaDivergenceWarning
from . import replica_rules as rules

__all__ = ["Divergence", "Report", "analyse", "find_divergences", "warn_divergences",
           "variable_partition"]

@dataclass(frozen=True)
class Value:
    """What is known of a value: its partition, where a difference between replicas came from
    (an op's description), and what it was computed from (`deps`: a bit mask of the frame's
    variables, buffers and graph inputs; see `_Analysis`)."""

    part: Partition
    source: str = ""
    deps: int = 0


@dataclass
class Divergence:
    """A variable updated from a value that can differ between replicas that must agree."""

    variable: str
    op: Op
    required: Partition
    got: Partition
    source: str

    def message(self) -> str:
        groups: Dict[int, List[int]] = {}
        for r, q in enumerate(self.required):
            groups.setdefault(q, []).append(r)
        must = "; ".join(", ".join(map(str, g)) for g in groups.values() if len(g) > 1)
        came = f" (it depends on {self.source})" if self.source else ""
        return (f"variable '{self.variable}' is updated by {self.op.describe()} from a value "
                f"that can differ between replicas that must hold the same value (replicas "
                f"{must}){came}, and nothing makes it equal again before the run ends: the "
                f"replicas will diverge. (All-reduce the update first, e.g. with "
                f"ops.collectives.replicated_all_reduce, or give the variable a replica "
                f"grouping or retrieval_mode='all_replicas' if its replicas may differ.)")


class _Analysis:
    """The pass over one Ir. Dependency bits: variable k of the main graph is bit k, remote
    buffer b is bit `n_vars + index of b`, and input i of a called graph is bit `base + i`
    while that graph is analysed (mapped back to the caller's bits at the call)."""

    def __init__(self, ir: IrData):
        self.ir = ir
        self.R = ir.replication_factor
        self.same: Partition = (0,) * self.R
        self.distinct: Partition = tuple(range(self.R))
        main = ir.main
        self.required: Dict[str, Partition] = {}
        self.state: Dict[str, Value] = {}
        self.var_bit: Dict[str, int] = {}
        for t, info in main.tensors.items():
            if info.kind != TensorKind.VARIABLE:
                continue
            part = variable_partition(info, self.R)
            if part is not None:
                self.required[t] = part
            self.var_bit[t] = 1 << len(self.var_bit)
            self.state[t] = Value(part if part is not None else self.distinct)
        # Remote buffers: what their entries hold, and which variables live in them.
        self.buffer_bit = {b: 1 << (len(self.var_bit) + k)
                           for k, b in enumerate(sorted(ir.remote_buffers))}
        self.base = len(self.var_bit) + len(self.buffer_bit)
        self.buffers: Dict[int, Value] = {b: Value(self.same) for b in ir.remote_buffers}
        self.buffer_vars: Dict[int, List[str]] = {}
        for t, info in main.tensors.items():
            remote = (info.extra or {}).get("remote")
            if remote is not None and info.kind == TensorKind.VARIABLE:
                self.buffer_vars.setdefault(remote[0], []).append(t)
                if t not in self.required:
                    self.buffers[remote[0]] = Value(self.distinct)
        self.culprit: Dict[str, Op] = {}     # variable -> last op that made it differ
        self.scratch: set = set()      # variables last written by stores of differing data
        self._cache: Dict[tuple, tuple] = {}
        self._grouped: Dict[tuple, Partition] = {}
        self._buffers_changed = 0          # part of the cache key: loads read the buffers

    # --- values ------------------------------------------------------------------------
    def join(self, values: Sequence[Value]) -> Value:
        part, source, deps = self.same, "", 0
        for v in values:
            part = meet(part, v.part)
            deps |= v.deps
            if not source and v.source and v.part != self.same:
                source = v.source
        return Value(part, source if part != self.same else "", deps)

    def combined(self, v: Value, stride: int, size: int, scatter: bool = False) -> Partition:
        """The partition of a collective's result over groups (stride, size) of input `v`."""
        key = (v.part, stride, size, scatter)
        got = self._grouped.get(key)
        if got is None:
            keys: List = [None] * self.R
            for g in range(self.R // max(size, 1)):
                mem = members(g, stride, size)
                labels = tuple(v.part[m] for m in mem)
                for i, m in enumerate(mem):
                    keys[m] = (labels, i) if scatter else labels
            if any(k is None for k in keys):
                return self.distinct             # a grouping that does not cover R: unknown
            got = self._grouped[key] = _canonical(keys)
        return got

    # --- variables and buffers -----------------------------------------------------------
    def written(self, var: Optional[str], value: Value, op: Op, update: bool) -> None:
        """Variable `var` takes `value`, written by `op`: an update (computed from the
        variable's own value) or a store."""
        if var is None:
            return
        self.state[var] = value
        self._check(var, value, op, update)

    def stored(self, buffer: int, value: Value, op: Op) -> None:
        old = self.buffers.get(buffer, Value(self.same))
        new = self.join([old, value])
        if new.part != old.part:
            self.buffers[buffer] = Value(new.part, new.source)
            self._buffers_changed += 1
        update = bool(value.deps & self.buffer_bit.get(buffer, 0))
        for var in self.buffer_vars.get(buffer, ()):
            self._check(var, value, op, update)

    def _check(self, var: str, value: Value, op: Op, update: bool) -> None:
        """`var` now holds `value`: an update from values that differ where they must not is a
        culprit; a plain store of such values makes the variable scratch space."""
        need = self.required.get(var)
        if need is not None and not coarser_or_equal(value.part, need):
            if update:
                self.culprit[var] = op
                self.scratch.discard(var)
            else:
                self.culprit.pop(var, None)
                self.scratch.add(var)

    def divergences(self) -> List[Divergence]:
        """The variables that can differ where they must agree at the end of a run (a
        variable may differ in the middle of one, as gradient accumulators do until they are
        all-reduced), each with the last op that updated it from such a value."""
        found = []
        for var, need in self.required.items():
            remote = (self.ir.main.tensors[var].extra or {}).get("remote")
            value = self.buffers.get(remote[0]) if remote is not None else self.state[var]
            if value is not None and not coarser_or_equal(value.part, need) \
                    and var in self.culprit:
                found.append(Divergence(var, self.culprit[var], need, value.part, value.source))
        return found

    # --- graphs ------------------------------------------------------------------------
    def main(self) -> None:
        gd = self.ir.main
        ops = [op for op in gd.ops if op.exec_ctx == "Normal"]
        for _ in range(self.R + 2):            # partitions only get finer: this settles
            before = {t: v.part for t, v in self.state.items()}
            env: Dict[str, Value] = {}
            bind: Dict[str, str] = {}
            own: Dict[str, int] = {}
            for t, info in gd.tensors.items():
                if info.kind == TensorKind.VARIABLE:
                    v = self.state[t]
                    env[t] = Value(v.part, v.source, self.var_bit[t])
                    bind[t], own[t] = t, self.var_bit[t]
            self._ops(gd, ops, env, bind, own)
            if {t: v.part for t, v in self.state.items()} == before:
                return

    def call(self, gid: str, args: Sequence[Value], binds: Sequence[Optional[str]]
             ) -> Tuple[List[Value], List[Value]]:
        """Analyse graph `gid` called with `args` (bound to variables `binds`): the values of
        its outputs and the final values of its inputs, in the caller's dependency bits."""
        key = (gid, tuple((a.part, a.source) for a in args), tuple(binds),
               self._buffers_changed)
        got = self._cache.get(key)
        if got is None:
            gd = self.ir.graphs[gid]
            env = {t: Value(a.part, a.source, 1 << (self.base + i))
                   for i, (t, a) in enumerate(zip(gd.inputs, args))}
            bind = {t: b for t, b in zip(gd.inputs, binds) if b is not None}
            own = {t: 1 << (self.base + i) for i, t in enumerate(gd.inputs) if t in bind}
            self._ops(gd, gd.ops, env, bind, own)
            got = ([env.get(t, Value(self.distinct)) for t in gd.outputs],
                   [env.get(t, Value(a.part, a.source, 1 << (self.base + i)))
                    for i, (t, a) in enumerate(zip(gd.inputs, args))])
            self._cache[key] = got
        outs, finals = got
        return ([self._in_caller(v, args) for v in outs],
                [self._in_caller(v, args) for v in finals])

    def _in_caller(self, v: Value, args: Sequence[Value]) -> Value:
        """A called graph's value with its input bits replaced by the caller's."""
        deps, inputs = v.deps & ((1 << self.base) - 1), v.deps >> self.base
        i = 0
        while inputs:
            if inputs & 1 and i < len(args):
                deps |= args[i].deps
            inputs >>= 1
            i += 1
        return Value(v.part, v.source, deps)

    def _value(self, gd: GraphData, env: Dict[str, Value], t: str) -> Value:
        v = env.get(t)
        if v is None:
            info = gd.tensors.get(t)
            kind = info.kind if info is not None else None
            v = Value(self.same) if kind in (TensorKind.CONSTANT, TensorKind.VARIABLE) \
                else Value(self.distinct)
            env[t] = v
        return v

    def _ops(self, gd: GraphData, ops: Sequence[Op], env: Dict[str, Value],
             bind: Dict[str, str], own: Dict[str, int]) -> None:
        from ..engine.kernels import load_all
        from ..engine.kernels.registry import spec_of

        load_all()
        for op in ops:
            ins = [self._value(gd, env, t) for t in op.inputs]
            if op.type in ("Call", "Loop", "If"):
                self._control_flow(op, ins, env, bind)
                continue
            spec = spec_of(op)
            outs = self._rule(op, ins)
            written = spec.modified_inputs(op) if spec is not None and spec.modifies else ()
            for i in written:
                t = op.inputs[i]
                new = ins[i] if op.type in rules.SELF_UPDATES else outs[0]
                env[t] = new
                store = rules.STORES.get(op.type)
                update = store is None or bool(ins[store].deps & own.get(t, 0))
                self.written(bind.get(t), new, op, update)
            for k, t in enumerate(op.outputs):
                env[t] = outs[min(k, len(outs) - 1)] if outs else Value(self.same)
            if op.outputs and op.inputs and spec is not None and (
                    spec.alias or (written and spec.returns_input)) and op.inputs[0] in bind:
                bind[op.outputs[0]] = bind[op.inputs[0]]
                own[op.outputs[0]] = own.get(op.inputs[0], 0)
            if op.type in rules.REMOTE_STORES:
                vi, oi = rules.REMOTE_STORES[op.type]
                self.stored(op.attrs["buffer"], self.join([ins[vi], ins[oi]]), op)

    def _rule(self, op: Op, ins: List[Value]) -> List[Value]:
        t, n = op.type, max(len(op.outputs), 1)
        constant = rules.CONSTANT_RESULT.get(t)
        if constant is not None and constant(op.attrs):
            return [Value(self.same)] * n
        if t in rules.HOST_DATA:
            return [Value(self.distinct, f"{op.describe()}: host data")] * n
        if t in rules.REMOTE_LOADS:
            b = op.attrs["buffer"]
            buf = self.buffers.get(b, Value(self.distinct))
            loaded = Value(buf.part, buf.source, self.buffer_bit.get(b, 0))
            return [self.join([loaded, ins[rules.REMOTE_LOADS[t]]])] * n
        stride, size = op.attrs.get("stride"), op.attrs.get("group_size")
        v = self.join(ins)
        if stride is None or size is None:
            return [v] * n
        if op.attrs.get("op") == "local" or (t in rules.IDENTITY_WHEN_IDENTICAL
                                             and op.attrs.get("identical_inputs")):
            if t in rules.GROUP_SCATTERING:
                return [Value(meet(v.part, self.combined(Value(self.distinct), int(stride),
                                                          int(size), True)), v.source,
                              v.deps)] * n
            return [v] * n
        if t in rules.GROUP_COMBINING:
            return [Value(self.combined(v, int(stride), int(size)), v.source, v.deps)] * n
        if t in rules.GROUP_SCATTERING:
            return [Value(self.combined(v, int(stride), int(size), True), v.source,
                          v.deps)] * n
        if t in rules.GROUP_STATISTICS:
            comb = Value(self.combined(v, int(stride), int(size)), v.source, v.deps)
            own = self.join([v, comb])
            stats = rules.GROUP_STATISTICS[t]
            return [comb if k in stats else own for k in range(n)]
        return [v] * n

    def _control_flow(self, op: Op, ins: List[Value], env: Dict[str, Value],
                      bind: Dict[str, str]) -> None:
        binds = [bind.get(t) for t in op.inputs]
        if op.type == "Call":
            callee = self.ir.graphs[op.called[0]]
            by_ref = self._by_ref(op, callee, 0)
            outs, finals = self.call(op.called[0], ins,
                                     [b if i in by_ref else None for i, b in enumerate(binds)])
            for i in by_ref:
                t = op.inputs[i]
                env[t] = finals[i]
                if bind.get(t) is not None:
                    self.state[bind[t]] = finals[i]
        elif op.type == "Loop":
            callee = self.ir.graphs[op.called[0]]
            by_ref = self._by_ref(op, callee, 2)
            k = len(op.outputs)
            carried = list(ins)
            for _ in range(self.R + 2):
                args = [Value(self.same), Value(self.same)] + carried
                res, finals = self.call(op.called[0], args,
                                        [None, None] + [b if i in by_ref else None
                                                        for i, b in enumerate(binds)])
                new = [self.join([c, r]) for c, r in zip(carried[:k], res[1:])] + carried[k:]
                for i in by_ref:
                    new[i] = self.join([new[i], finals[i + 2]])
                if [v.part for v in new] == [v.part for v in carried]:
                    carried = new
                    break
                carried = new
            for i in by_ref:
                t = op.inputs[i]
                env[t] = carried[i]
                if bind.get(t) is not None:
                    self.state[bind[t]] = carried[i]
            outs = carried[:k]
        else:                                   # If: either branch, chosen by the condition
            branches = []
            for gid, mapping in zip(op.called, (op.attrs["then_inputs"], op.attrs["else_inputs"])):
                args = [ins[i] for i in mapping]
                res, _ = self.call(gid, args, [None] * len(args))
                branches.append(res)
            outs = [self.join([a, b, ins[0]]) for a, b in zip(*branches)]
        for t, v in zip(op.outputs, outs):
            env[t] = v

    @staticmethod
    def _by_ref(op: Op, callee: GraphData, offset: int) -> List[int]:
        """The op inputs the callee writes back (by-reference graph inputs)."""
        modified = set(op.attrs.get("modified", ()))
        return [i for i in range(len(op.inputs))
                if i + offset < len(callee.inputs)
                and (callee.inputs[i + offset] in callee.by_ref_inputs or i in modified)]


@dataclass
class Report:
    """The pass's findings: `divergences`, and the `scratch` variables (written only by
    stores of data that can differ between replicas, e.g. pipeline stashes: their replicas may
    differ, as upstream lets them)."""

    divergences: List[Divergence]
    scratch: Tuple[str, ...]


def analyse(ir: IrData) -> Report:
    """Run the pass (nothing to find with one replica)."""
    if ir.replication_factor <= 1:
        return Report([], ())
    analysis = _Analysis(ir)
    analysis.main()
    return Report(analysis.divergences(), tuple(sorted(analysis.scratch)))


def find_divergences(ir: IrData) -> List[Divergence]:
    """The variables the program updates from values that can differ between replicas that
    must agree."""
    return analyse(ir).divergences


def warn_divergences(ir: IrData) -> Report:
    """`analyse`, each divergence reported as a ReplicaDivergenceWarning attributed to the
    user's line that called into popxl (the Session's creation)."""
    from ..ops._builder import debug_location

    report = analyse(ir)
    found = report.divergences
    where = debug_location()
    filename, _, line = where.rpartition(":")
    for d in found:
        if filename and line.isdigit():
            warnings.warn_explicit(d.message(), ReplicaDivergenceWarning, filename, int(line))
        else:
            warnings.warn(d.message(), ReplicaDivergenceWarning, stacklevel=2)
    return report
