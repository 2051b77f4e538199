"""The memory plan of a compiled graph: which values live in preallocated buffers, and where.

A static graph knows every value before its first run. Values produced by kernels that accept a
preallocated output (`@kernel(..., writes_out=True)`) are assigned to buffers by liveness, as
XLA's and TVM's buffer assignment do: each value lives from the op that defines it to the last op
that reads it (or reads a view of it), and a buffer whose value is dead is reused by a later value
of any size that fits (best fit; a too-small free buffer grows). Each replica context allocates the
buffers once, on its first run of the graph; the steady state then allocates nothing for planned
values.

Values that escape the graph are never planned: graph outputs, device state (variables, RTS
shards), graph inputs, constants and host memory, and anything that may be a view of one of them.
A kernel that does not accept preallocated outputs may return a view of an input (e.g. `Sum` of
one tensor returns it), so its outputs count as views of all its inputs for liveness.

A value may also take the buffer of an input that dies at its op (in place) when the kernel says
that is safe (`inplace=True`: element-wise kernels whose output element i depends only on input
elements i), the shapes and dtypes agree and the input is not read through a view afterwards.

A called graph's outputs escape it, but their caller knows how long they live: a graph reports
which outputs it can write into memory its caller provides (`MemoryPlan.output_roots`), and the
caller plans that memory as its own values (`run(ctx, *inputs, out=...)`), so activations passed
from a forward graph to its gradient graph, and gradients passed on to the optimiser, are not
allocated in the steady state either.

`POPXL_MEMORY_PLAN=0` turns the plan off (every kernel allocates its results, as before): for
debugging and for comparing; the results are the same bits either way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import os

import numpy as np

from .._ir.records import GraphData, Op

__all__ = ["MemoryPlan", "plan_memory", "enabled", "aligned_copy", "ALIGN", "CONTROL",
           "WRITES_OUT", "INPLACE", "VIEW_OUT", "ALIAS0", "OTHER"]

ALIGN = 64                 # byte alignment of every buffer (a cache line; SIMD loads)


def _aligned_bytes(n: int) -> np.ndarray:
    b = np.empty(n + ALIGN, np.uint8)
    off = (-b.ctypes.data) % ALIGN
    return b[off:off + n]


def aligned_copy(src, dtype) -> np.ndarray:
    """A copy of `src` as a C-contiguous `dtype` array starting on an ALIGN-byte boundary (a
    variable's storage: NumPy aligns to 16 bytes, and a vector load across two cache lines
    costs the compiled kernels up to 1.5x)."""
    src = np.asarray(src)
    dt = np.dtype(dtype)
    out = _aligned_bytes(src.size * dt.itemsize).view(dt).reshape(src.shape)
    out[...] = src
    return out


def enabled() -> bool:
    """Whether compiled graphs plan their memory (`POPXL_MEMORY_PLAN=0` turns it off)."""
    return os.environ.get("POPXL_MEMORY_PLAN", "").strip() != "0"


@dataclass
class MemoryPlan:
    """Buffer assignment of one compiled graph (data: print it, test it).

    Attributes:
        buffer_bytes: size of each buffer, in allocation order.
        assignment: tensor id -> (buffer index, dtype, shape) of every planned value.
        slot: tensor id -> index into the per-context list of views (`views()`).
        unplanned: number of op outputs left to their kernels (escaping values, kernels
            without preallocated outputs, 0-d results).
        in_place: tensor ids that reuse the buffer of an input dying at their op.
        output_roots: per graph output, the (dtype, shape) of the memory a caller may provide
            for it (`run(..., out=...)`), or None (the graph allocates it).
        root_output: tensor id -> the output index whose provided memory it is written into.
        output_alias: output index -> the output index whose provided memory it views (the
            caller keeps that memory while either is alive).
    """

    graph: str = ""
    buffer_bytes: List[int] = field(default_factory=list)
    assignment: Dict[str, Tuple[int, np.dtype, Tuple[int, ...]]] = field(default_factory=dict)
    slot: Dict[str, int] = field(default_factory=dict)
    unplanned: int = 0
    in_place: Set[str] = field(default_factory=set)
    output_roots: List[Optional[Tuple[np.dtype, Tuple[int, ...]]]] = field(default_factory=list)
    root_output: Dict[str, int] = field(default_factory=dict)
    output_alias: Dict[int, int] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        """Bytes held by the buffers (the plan's peak, allocated once per replica context)."""
        return sum(self.buffer_bytes)

    @property
    def num_buffers(self) -> int:
        """Allocations the plan makes per replica context (once, on the first run)."""
        return len(self.buffer_bytes)

    @property
    def value_bytes(self) -> int:
        """Bytes a plan-less run allocates for the same values (every value its own array)."""
        return sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize
                   for _, d, s in self.assignment.values())

    def views(self) -> List[np.ndarray]:
        """Allocate the buffers and return one array per planned value, in slot order."""
        raw = [_aligned_bytes(n) for n in self.buffer_bytes]
        out: List[Optional[np.ndarray]] = [None] * len(self.slot)
        for tid, i in self.slot.items():
            buf, dt, shape = self.assignment[tid]
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
            out[i] = raw[buf][:n].view(dt).reshape(shape)
        return out

    def __str__(self) -> str:
        lines = [f"MemoryPlan of graph '{self.graph or 'main'}': {len(self.assignment)} values in "
                 f"{self.num_buffers} buffers, {self.peak_bytes} bytes (without the plan: "
                 f"{self.value_bytes}); {self.unplanned} values unplanned; "
                 f"{len(self.in_place)} in place"]
        for i, n in enumerate(self.buffer_bytes):
            users = [t for t, a in self.assignment.items() if a[0] == i]
            lines.append(f"  buffer {i}: {n} bytes: {', '.join(users)}")
        return "\n".join(lines)


class _Classes:
    """Union-find over tensor ids: values that may share memory (views, aliases)."""

    def __init__(self):
        self.parent: Dict[str, str] = {}

    def find(self, t: str) -> str:
        root = t
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while t != root:                       # path compression
            self.parent[t], t = root, self.parent[t]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


# What the memory plan needs to know about each op's kernel.
CONTROL = "control"          # Call / Loop / If: outputs are fresh, never views of the caller's
WRITES_OUT = "writes_out"    # accepts out=, outputs never alias inputs
INPLACE = "inplace"          # writes_out, and out may be the buffer of a same-shaped input
VIEW_OUT = "view_out"        # returns a view of input 0 when it can, else writes into out=
ALIAS0 = "alias0"            # output 0 is input 0 or a view of it (in-place ops, views)
OTHER = "other"              # anything else: outputs may be views of any input

Layout = Tuple[np.dtype, Tuple[int, ...]]


def plan_memory(gd: GraphData, ops: Sequence[Op], kinds: Sequence[str], escaping: Set[str],
                copied: Set[str], outputs: Sequence[str] = (),
                view_parent: Optional[Dict[str, str]] = None, copied_returns: Set[str] = frozenset(),
                call_outs: Optional[Dict[int, Sequence[Optional[Layout]]]] = None,
                in_place_inputs: Optional[Dict[int, Sequence[int]]] = None,
                call_aliases: Optional[Dict[int, Dict[int, int]]] = None,
                gid: str = "", uses_after: Optional[Dict[str, int]] = None) -> MemoryPlan:
    """Plan the buffers of `ops` (a schedule of graph `gd`).

    Args:
        kinds: per op, one of CONTROL, WRITES_OUT, INPLACE, VIEW_OUT, ALIAS0, OTHER.
        escaping: tensor ids whose memory must outlive the graph run or is not the graph's:
            outputs, inputs, state, constants, host memory.
        copied: outputs the compiler copies after their kernel (views that became copies).
        outputs, view_parent, copied_returns: the graph's outputs, the view / alias edges
            (tensor -> the tensor it views) and the outputs returned as copies; with them the
            plan finds the outputs a caller may provide memory for (`MemoryPlan.output_roots`).
        call_outs: per control-flow op position, the (dtype, shape) of the memory each output
            can be written into by the callee (None: the callee allocates it).
        in_place_inputs: per INPLACE op position, the inputs whose buffer its output may take
            (default: all).
        call_aliases: per control-flow op position, {output index: output index whose memory
            it views} (the callee's `output_alias`).
        uses_after: tensor -> a position where generated code outside the ops touches it (the
            reshape_ syncs of the compiler); its buffer stays live until then.
    """
    plan = MemoryPlan(graph=gid)
    classes = _Classes()
    call_outs = call_outs or {}
    define: Dict[str, int] = {}
    last: Dict[str, int] = {}
    candidates: List[Tuple[int, str, Layout]] = []     # (position, tensor, layout)
    in_place_ok: Dict[str, Tuple[int, ...]] = {}
    for pos, op in enumerate(ops):
        for t in op.inputs:
            last[t] = pos
        kind = kinds[pos]
        for t in op.outputs:
            define[t] = pos
            last.setdefault(t, pos)
        if kind == CONTROL:
            # The callee's outputs are fresh (the compiler copies any that would alias its
            # inputs, constants or state) and never alias the caller's values; the callee may
            # write some of them into memory the caller provides.
            for t, lay in zip(op.outputs, call_outs.get(pos) or [None] * len(op.outputs)):
                if lay is None:
                    plan.unplanned += 1
                else:
                    candidates.append((pos, t, lay))
            for j, j0 in ((call_aliases or {}).get(pos) or {}).items():
                classes.union(op.outputs[j], op.outputs[j0])
            continue
        if kind == VIEW_OUT:
            t = op.outputs[0]
            info = gd.tensors[t]
            candidates.append((pos, t, (_np_dtype(info), tuple(info.shape))))
            classes.union(t, op.inputs[0])
            continue
        if kind in (WRITES_OUT, INPLACE):
            for t in op.outputs:
                info = gd.tensors[t]
                candidates.append((pos, t, (_np_dtype(info), tuple(info.shape))))
                if kind == INPLACE:
                    in_place_ok[t] = tuple((in_place_inputs or {}).get(
                        pos, range(len(op.inputs))))
            continue
        plan.unplanned += len(op.outputs)
        if kind == ALIAS0:
            if op.outputs and op.inputs and op.outputs[0] not in copied:
                classes.union(op.outputs[0], op.inputs[0])
            continue
        for t in op.outputs:
            if t in copied:
                continue
            for s in op.inputs:
                classes.union(t, s)

    for t, p in (uses_after or {}).items():
        if t in define or t in last:
            last[t] = max(last.get(t, -1), p)
    members: Dict[str, List[str]] = {}
    for t in set(define) | set(last):
        members.setdefault(classes.find(t), []).append(t)
    blocked = {classes.find(t) for t in escaping}
    end: Dict[str, int] = {}
    for root, ms in members.items():
        end[root] = max(max(last.get(m, -1), define.get(m, -1)) for m in ms)
    _find_output_roots(plan, classes, outputs, view_parent or {}, copied_returns, escaping,
                       {t: lay for _, t, lay in candidates}, members)

    planned: List[Tuple[int, str, Layout]] = []
    for pos, t, lay in candidates:
        if classes.find(t) in blocked or t in escaping or not lay[1]:
            plan.unplanned += 1
            continue
        planned.append((pos, t, lay))

    # Greedy assignment in schedule order; buffers free after the last use of their class.
    frees_at: Dict[int, List[str]] = {}
    by_pos: Dict[int, List[Tuple[str, Layout]]] = {}
    for pos, t, lay in planned:
        frees_at.setdefault(end[classes.find(t)] + 1, []).append(t)
        by_pos.setdefault(pos, []).append((t, lay))
    free: List[int] = []                       # buffer indices not in use
    holder: Dict[str, int] = {}
    for pos in sorted(set(by_pos) | set(frees_at)):
        for t in frees_at.get(pos, ()):
            free.append(holder[t])
        for t, (dt, shape) in by_pos.get(pos, ()):
            need = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            buf = None
            if t in in_place_ok:
                buf = _in_place_buffer(ops[pos], t, in_place_ok[t], gd, holder, classes, end,
                                       pos, frees_at)
            if buf is not None:
                plan.in_place.add(t)
            else:
                buf = _best_fit(free, plan.buffer_bytes, need)
            holder[t] = buf
            plan.assignment[t] = (buf, dt, shape)
            plan.slot[t] = len(plan.slot)
    return plan


def _np_dtype(info) -> np.dtype:
    from .kernels._util import np_dtype

    return np_dtype(info)


def _find_output_roots(plan: MemoryPlan, classes: _Classes, outputs: Sequence[str],
                       view_parent: Dict[str, str], copied_returns: Set[str], escaping: Set[str],
                       layouts: Dict[str, Layout], members: Dict[str, List[str]]) -> None:
    """Outputs whose memory a caller may provide: the output is (a view of) a value a
    `writes_out` kernel of this graph makes, and nothing else that escapes shares its memory."""
    plan.output_roots = [None] * len(outputs)
    by_root: Dict[str, List[int]] = {}
    for j, t in enumerate(outputs):
        if t in copied_returns:
            continue
        r = t
        while r in view_parent:
            r = view_parent[r]
        lay = layouts.get(r)
        if lay is not None and lay[1]:
            by_root.setdefault(r, []).append(j)
    for r, js in by_root.items():
        views = {outputs[j] for j in js}
        if any(m in escaping and m not in views for m in members[classes.find(r)]):
            continue
        plan.output_roots[js[0]] = layouts[r]
        plan.root_output[r] = js[0]
        for j in js[1:]:                   # other outputs viewing the same memory
            plan.output_alias[j] = js[0]


def _best_fit(free: List[int], sizes: List[int], need: int) -> int:
    """Take the smallest free buffer that fits, else grow the largest free one, else a new one."""
    fits = [b for b in free if sizes[b] >= need]
    if fits:
        b = min(fits, key=lambda k: sizes[k])
    elif free:
        b = max(free, key=lambda k: sizes[k])
        sizes[b] = need
    else:
        sizes.append(need)
        return len(sizes) - 1
    free.remove(b)
    return b


def _in_place_buffer(op: Op, t: str, allowed: Sequence[int], gd: GraphData,
                     holder: Dict[str, int], classes: _Classes, end: Dict[str, int], pos: int,
                     frees_at: Dict[int, List[str]]) -> Optional[int]:
    """The buffer of an input of `op` (one of the `allowed` indices) that `t` may take over
    (in place), or None."""
    info = gd.tensors[t]
    for i in allowed:
        s = op.inputs[i]
        if s not in holder:
            continue
        sinfo = gd.tensors[s]
        if sinfo.shape != info.shape or sinfo.dtype != info.dtype:
            continue
        root = classes.find(s)
        if end[root] != pos or classes.find(t) == root:
            continue
        # another operand that is a view of s (e.g. s.T) would be overwritten while read
        if any(classes.find(o) == root and o != s for o in op.inputs):
            continue
        # s dies here: hand its buffer to t instead of freeing it after this op.
        frees_at[pos + 1].remove(s)
        return holder.pop(s)
    return None
