"""The extra lines a compiled graph runs when a Session debugs: NaN / infinity checks after every
op, taps that keep intermediate tensors, the call sites of called graphs, and the profiler's
clock reads around every op (`engine/profiler.py`).

`Program(ir, instrument)` asks `Instrument` for the lines to put around each op; without an
Instrument (the default) the generated code is exactly the plain program's. The checks need
every op's inputs intact after it ran, so a checking program neither plans its memory (no
output written over an input) nor batches collectives; neither changes the bits. Profiling alone changes neither: it times the
program that runs without it.
"""
from __future__ import annotations

from typing import Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from .._ir.records import GraphData, Op
from .nonfinite import CollectiveCheck, OpCheck
from .profiler import clock

__all__ = ["Instrument", "record_tap"]


def record_tap(ctx, gid: str, tid: str, value) -> None:
    """Keep a copy of `value` (tensor `tid` of graph `gid`) for the replica of `ctx`, with the
    control-flow ops it was called through."""
    ctx.taps.append((gid, tid, tuple(ctx.sites), value.copy()))


class Instrument:
    """What to add to a compiled program.

    Args:
        checks: check every op's outputs for a new NaN / infinity (`nonfinite.OpCheck`).
        fp_checks: word the checks' errors as upstream's floating-point checks.
        taps: `{graph id: tensor ids}` to keep (see `popxl.debug.capture`).
        profile: time every op into its replica's `ctx.prof` (see `engine/profiler.py`).
    """

    def __init__(self, checks: bool = False, fp_checks: bool = False,
                 taps: Optional[Mapping[str, Sequence[str]]] = None, profile: bool = False):
        self.checks = checks
        self.fp_checks = fp_checks
        self.taps: Dict[str, FrozenSet[str]] = {g: frozenset(ts) for g, ts in (taps or {}).items()
                                                if ts}
        self.profile = profile

    @property
    def active(self) -> bool:
        return self.checks or bool(self.taps) or self.profile

    @property
    def plans_memory(self) -> bool:
        return not self.checks

    @property
    def batches_collectives(self) -> bool:
        """Whether neighbouring collectives still run as one exchange: only when nothing needs
        their outputs one by one (checks, taps)."""
        return not self.checks and not self.taps

    def _tapped(self, gd: GraphData) -> FrozenSet[str]:
        return self.taps.get(gd.id, frozenset())

    def entry_lines(self, gd: GraphData, bound: Sequence[str], name_of: Callable[[str], str],
                    glob: Dict) -> List[str]:
        """Lines after the graph's inputs, state and constants are bound: their taps."""
        tapped = self._tapped(gd)
        if not tapped:
            return []
        glob["_TAP"] = record_tap
        return [f"    _TAP(ctx, {gd.id!r}, {t!r}, {name_of(t)})" for t in bound if t in tapped]

    def around(self, gd: GraphData, op: Op, pos: int, modified: Sequence[int],
               ins: Sequence[str], outs: Sequence[str], glob: Dict,
               control_flow: bool, collective: bool) -> Tuple[List[str], List[str]]:
        """(lines before, lines after) the statement of op `pos`."""
        pre: List[str] = []
        post: List[str] = []
        if control_flow and self.taps:
            pre.append(f"    ctx.sites.append({op.id})")
            post.append("    ctx.sites.pop()")
        if self.checks and not control_flow and not collective and op.type not in _FROM_OUTSIDE:
            name = f"_CHK{pos}"
            glob[name] = OpCheck(op, gd.id, modified, self.fp_checks)
            args = f"({''.join(a + ', ' for a in ins)})"
            results = f"({''.join(a + ', ' for a in outs)})"
            if modified:
                pre.append(f"    _B{pos} = {name}.kinds({', '.join(ins[i] for i in modified)})")
                post.append(f"    {name}(ctx, {args}, {results}, _B{pos})")
            else:
                post.append(f"    {name}(ctx, {args}, {results})")
        tapped = self._tapped(gd)
        if tapped:
            for t, n in zip(op.outputs, outs):
                if t in tapped:
                    glob["_TAP"] = record_tap
                    post.append(f"    _TAP(ctx, {gd.id!r}, {t!r}, {n})")
        if self.profile:        # innermost: the clock reads bracket the op's statement only
            glob["_clk"] = clock
            if collective:      # the executor times the step; this is the replica's arrival
                pre.append(f"    ctx.prof.append(({op.id}, _clk(), None))")
            else:
                pre.append("    _t = _clk()")
                post.insert(0, f"    ctx.prof.append(({op.id}, _t, _clk()))")
        return pre, post

    def collective_fn(self, fn: Callable, op: Op, gid: str, modified: Sequence[int]) -> Callable:
        """A collective step's function, checked when the checks are on."""
        if not self.checks:
            return fn
        return CollectiveCheck(fn, op, gid, modified, self.fp_checks)


# Ops whose outputs come from outside the program's values (host data, remote memory): a NaN
# they bring in was held by their input, the host array or the buffer. `Init` of undefined
# values (upstream's uninitialised memory) is not checked either: its bits are undefined.
_FROM_OUTSIDE = frozenset({"HostLoad", "RemoteLoad", "RemoteLoadInplace", "Init"})
