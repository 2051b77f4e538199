"""Where a NaN or an infinity first appears: the per-op check of `POPXL_DEBUG_NANS=1` and of
`SessionOptions.enableFloatingPointChecks`.

An op is the origin of a NaN when its output holds a NaN and none of its inputs did (an IEEE
invalid operation: 0/0, inf - inf, log(-1) ...), and the origin of an infinity when its output
holds one and none of its inputs did (an overflow or a division by zero). A NaN or infinity
passed along from an input is not reported again, so the first op in program order that the
check stops at is where the value went wrong. Outputs and modified inputs are checked; only
floating-point arrays can hold either (float8 data, stored as its codes, is not checked).
"""
from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import numpy as np

from .._ir.records import Op
from ..errors import NonFiniteError

__all__ = ["OpCheck", "CollectiveCheck", "nonfinite_kinds", "describe_array", "call_chain",
           "floating_point_error"]


def nonfinite_kinds(a) -> Tuple[bool, bool]:
    """(holds a NaN, holds an infinity) of one array (False, False for non-float data)."""
    if not isinstance(a, np.ndarray) or a.dtype.kind != "f" or a.size == 0:
        return False, False
    if np.isfinite(a).all():
        return False, False
    return bool(np.isnan(a).any()), bool(np.isinf(a).any())


def _any_kinds(arrays) -> Tuple[bool, bool]:
    nan = inf = False
    for a in arrays:
        n, i = nonfinite_kinds(a)
        nan, inf = nan or n, inf or i
    return nan, inf


def describe_array(name: str, a) -> str:
    """`name (shape, dtype): min .., max .., k NaN, j inf` (min/max over the finite values)."""
    if not isinstance(a, np.ndarray):
        return f"{name}: {type(a).__name__}"
    head = f"{name} {tuple(a.shape)} {a.dtype}"
    if a.size == 0:
        return f"{head}: empty"
    if a.dtype.kind not in "fiub":
        return head
    if a.dtype.kind != "f":
        return f"{head}: min {a.min()}, max {a.max()}"
    finite = np.isfinite(a)
    n_nan = int(np.isnan(a).sum())
    n_inf = int(a.size - finite.sum()) - n_nan
    vals = a[finite]
    rng = (f"min {vals.min():.6g}, max {vals.max():.6g}" if vals.size
           else "no finite value")
    return f"{head}: {rng}, {n_nan} NaN, {n_inf} inf"


def call_chain(program, exc: BaseException) -> List[Tuple[Op, str]]:
    """The control-flow ops (Call, Loop, If) the traceback of `exc` passed through, outermost
    first: where a called graph's failing op was called from."""
    chain = []
    tb = exc.__traceback__
    while tb is not None:
        cg = program._by_filename.get(tb.tb_frame.f_code.co_filename)
        if cg is not None:
            op = cg.line_to_op.get(tb.tb_lineno)
            if op is not None and op.type in ("Call", "Loop", "If"):
                chain.append((op, cg.gid))
        tb = tb.tb_next
    return chain


def _where(gid: str) -> str:
    return f"graph '{gid}'" if gid else "the main graph"


def _raise(op: Op, gid: str, replica: int, run: int, fp_checks: bool, new_nan: bool,
           new_inf: bool, names_in: Sequence[str], ins: Sequence, names_out: Sequence[str],
           outs: Sequence) -> None:
    kinds = " and ".join(k for k, new in (("a NaN", new_nan), ("an infinity", new_inf)) if new)
    if fp_checks:
        events = []
        if new_nan:
            events.append("an invalid operation (NaN)")
        if new_inf:
            events.append("an overflow or a division by zero (infinity)")
        why = (f"a floating-point exception: {' and '.join(events)} (the program enabled "
               f"SessionOptions.enableFloatingPointChecks)")
    else:
        why = f"it produced {kinds} that none of its inputs held (POPXL_DEBUG_NANS)"
    in_lines = tuple(describe_array(n, a) for n, a in zip(names_in, ins))
    out_lines = tuple(describe_array(n, a) for n, a in zip(names_out, outs))
    text = [f"{op.describe()} in {_where(gid)}, replica {replica}, run {run}: {why}"]
    if op.origin:
        text.append(f"  it is a gradient op of {op.origin}")
    text.append("  inputs:" if in_lines else "  inputs: none")
    text.extend(f"    {line}" for line in in_lines)
    text.append("  outputs:")
    text.extend(f"    {line}" for line in out_lines)
    err = NonFiniteError("\n".join(text))
    err.op, err.graph, err.replica, err.run = op, gid, replica, run
    err.source, err.forward = op.debug, op.origin
    err.inputs, err.outputs = in_lines, out_lines
    raise err


def floating_point_error(op: Op, gid: str, replica: int, run: int, exc: BaseException,
                         inputs: Sequence) -> NonFiniteError:
    """The NonFiniteError for a floating-point exception NumPy raised inside `op`'s kernel
    (SessionOptions.enableFloatingPointChecks), naming the op as the output check does."""
    in_lines = tuple(describe_array(n, a) for n, a in zip(op.inputs, inputs))
    text = [f"{op.describe()} in {_where(gid)}, replica {replica}, run {run}: a "
            f"floating-point exception: {exc} (the program enabled "
            f"SessionOptions.enableFloatingPointChecks)"]
    if op.origin:
        text.append(f"  it is a gradient op of {op.origin}")
    text.append("  inputs:" if in_lines else "  inputs: none")
    text.extend(f"    {line}" for line in in_lines)
    err = NonFiniteError("\n".join(text))
    err.op, err.graph, err.replica, err.run = op, gid, replica, run
    err.source, err.forward, err.inputs = op.debug, op.origin, in_lines
    return err


class OpCheck:
    """The check after one op: `check(ctx, inputs, outputs, before)`, where `before` is the
    (NaN, inf) state of the inputs the op modifies, taken just before it ran (`kinds`)."""

    __slots__ = ("op", "gid", "fp_checks", "modified", "names_in", "names_out")

    def __init__(self, op: Op, gid: str, modified: Sequence[int], fp_checks: bool):
        self.op = op
        self.gid = gid
        self.fp_checks = fp_checks
        self.modified = tuple(modified)
        self.names_in = op.inputs
        # A modified input is an output too (its new value).
        self.names_out = tuple(op.outputs) + tuple(f"{op.inputs[i]} (modified)"
                                                   for i in self.modified)

    def kinds(self, *arrays) -> Tuple[bool, bool]:
        """The (NaN, inf) state of the modified inputs before the op runs."""
        return _any_kinds(arrays)

    def __call__(self, ctx, ins: Sequence, outs: Sequence, before=(False, False)) -> None:
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        changed = tuple(ins[i] for i in self.modified)
        out_nan, out_inf = _any_kinds(tuple(outs) + changed)
        if not (out_nan or out_inf):
            return
        untouched = [a for i, a in enumerate(ins) if i not in self.modified]
        in_nan, in_inf = _any_kinds(untouched)
        in_nan, in_inf = in_nan or before[0], in_inf or before[1]
        new_nan, new_inf = out_nan and not in_nan, out_inf and not in_inf
        if new_nan or new_inf:
            _raise(self.op, self.gid, ctx.replica, ctx.run, self.fp_checks, new_nan, new_inf,
                   self.names_in, ins, self.names_out, tuple(outs) + changed)


class CollectiveCheck:
    """A collective step's function, checked: a collective is the origin of a NaN or infinity
    only when no replica of the whole program fed it one (one extra exchange of two flags per
    collective; a float16 sum that overflows is such an origin)."""

    def __init__(self, fn: Callable, op: Op, gid: str, modified: Sequence[int],
                 fp_checks: bool):
        self.fn = fn
        self.check = OpCheck(op, gid, modified, fp_checks)

    def __call__(self, comm, per_replica):
        flags = [np.array(_any_kinds(ins), dtype=bool) for ins in per_replica]
        fed = comm.all_reduce(flags, "or", 1, comm.replication_factor)
        results = self.fn(comm, per_replica)
        for j, (ins, outs) in enumerate(zip(per_replica, results)):
            self.check(_Replica(comm.replicas[j], comm.run), ins, outs,
                       (bool(fed[j][0]), bool(fed[j][1])))
        return results


class _Replica:
    """What an OpCheck needs of a replica context, for collectives (run by the worker)."""

    __slots__ = ("replica", "run")

    def __init__(self, replica: int, run: int):
        self.replica, self.run = replica, run

