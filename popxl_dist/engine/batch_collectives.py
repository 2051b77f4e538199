"""Batched collectives: DDP's gradient buckets for a static program.

A data-parallel step usually all-reduces every gradient on its own (`replicated_all_reduce` per
variable, each followed by that variable's optimiser step), and every all-reduce is a rendezvous
of all workers. `hoist` moves each ReplicatedAllReduce up the schedule to join the all-reduces
before it, over ops that neither produce nor write (in place, or through a view) the memory it
reads; `runs` then finds the all-reduces that have become neighbours with the same reduction,
replica grouping and dtype, and `batched_step` runs each run as one exchange: every replica's
inputs concatenated, reduced once, split. Neighbouring all-gathers and reduce-scatters (as the
applications' replica-sharded weights and gradients give them) are batched the same way. Each
element is reduced by the same tree over the same members as alone, so the bits do not change.
`POPXL_BATCH_COLLECTIVES=0` turns this off.

Not done: overlapping the exchange with the rest of the backward pass. The applications' and the
benchmark's backward pass is one `Call`; the all-reduces follow it, so program order leaves them
nothing to overlap with, and moving collectives into called graphs is not attempted.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Protocol, Set, Tuple

import numpy as np

from .._ir.records import GraphData, Op


class Program(Protocol):
    """What batching asks of the compiler (`compile.Program`): an op's kernel spec (None for
    control flow) and a called graph's effects on its inputs."""

    def _spec(self, op: Op) -> Any: ...

    def _callee_effects(self, op: Op) -> Tuple[Set[int], Set[int], bool]: ...

__all__ = ["enabled", "hoist", "runs", "batched_step"]

_KINDS = frozenset({"ReplicatedAllReduce", "ReplicatedAllGather", "ReplicatedReduceScatter"})


def enabled() -> bool:
    return os.environ.get("POPXL_BATCH_COLLECTIVES", "").strip() != "0"


def hoist(program: "Program", gd: GraphData, ops: List[Op]) -> List[Op]:
    """`ops` with each batchable collective (all-reduce, all-gather, reduce-scatter) moved up to
    join the run of its kind before it (same reduction, grouping and dtype) where every op in
    between may be passed: none writes the memory it reads (in place, through a view, or by
    producing it). The view it reads (e.g. a flattened gradient) may move with it, to just
    before the run. The first of a run stays where the program put it; collectives keep their
    order."""
    if not enabled() or not any(op.type in _KINDS for op in ops):
        return ops
    parent: Dict[str, str] = {}          # tensor -> the tensor whose memory it may share
    producer: Dict[str, Op] = {}
    for op in ops:
        spec = program._spec(op)
        for t in op.outputs:
            producer[t] = op
        if spec is not None and op.outputs and op.inputs and (
                spec.view or spec.alias or (spec.modifies and spec.returns_input)):
            parent[op.outputs[0]] = op.inputs[0]

    def root(t: str) -> str:
        while t in parent:
            t = parent[t]
        return t

    written: Dict[int, Tuple[Optional[Set[str]], bool]] = {}

    def passable(mover: Op, between: List[Op], collective: bool) -> bool:
        reads = {root(t) for t in mover.inputs}
        for op in between:
            if id(op) not in written:
                written[id(op)] = _writes(program, op, root)
            w, coll = written[id(op)]
            if w is None or (coll and collective) or w & reads:
                return False
        return True

    out: List[Op] = []
    start = end = 0                     # out[start:end]: the open run of collectives
    run_key: Optional[Tuple] = None
    for op in ops:
        key = _key(gd, op)
        if key is not None and key == run_key:
            view = producer.get(op.inputs[0])
            at = _index(out, view, end)
            spec = program._spec(view) if at is not None else None
            if (at is not None and spec is not None and spec.view and not spec.modifies
                    and passable(view, out[start:at], False)):
                out.insert(start, out.pop(at))          # the view, just before the run
                start, end = start + 1, end + 1
            if passable(op, out[end:], True):
                out.insert(end, op)
                end += 1
                continue
        out.append(op)
        if key is not None:
            start, end, run_key = len(out) - 1, len(out), key
    return out


def _index(ops: List[Op], op: Optional[Op], lo: int) -> Optional[int]:
    """Where `op` is in ops[lo:], or None."""
    if op is None:
        return None
    for i in range(len(ops) - 1, lo - 1, -1):
        if ops[i] is op:
            return i
    return None


def _writes(program: "Program", op: Op, root: Callable[[str], str]
            ) -> Tuple[Optional[Set[str]], bool]:
    spec = program._spec(op)
    if spec is None:
        if op.type != "Call":
            return None, False               # loops and conditionals: a barrier
        idx, _, collective = program._callee_effects(op)
        if collective:
            return None, True
    else:
        idx = spec.modified_inputs(op) if spec.modifies else ()
    roots = {root(op.inputs[i]) for i in idx} | {root(t) for t in op.outputs}
    return roots, spec is not None and spec.collective


def runs(gd: GraphData, ops: List[Op]) -> Dict[int, List[Op]]:
    """{position of the first: the ops} for each run of two or more neighbouring collectives of
    one kind with the same reduction, replica grouping and dtype."""
    if not enabled():
        return {}
    found: Dict[int, List[Op]] = {}
    start, key = 0, None
    for pos in range(len(ops) + 1):
        k = _key(gd, ops[pos]) if pos < len(ops) else None
        if k is None or k != key:
            if key is not None and pos - start > 1:
                found[start] = ops[start:pos]
            start, key = pos, k
    return found


def _key(gd: GraphData, op: Op) -> Optional[Tuple]:
    """What must be equal for collectives to share an exchange, or None: not batched."""
    if op.type not in _KINDS or len(op.inputs) != 1 or len(op.outputs) != 1:
        return None
    a = op.attrs
    reduction = a.get("op", "local")
    if op.type == "ReplicatedReduceScatter" and reduction == "local":
        return None
    if op.type == "ReplicatedAllGather":
        reduction = None
    return (op.type, reduction, int(a["stride"]), int(a["group_size"]),
            str(gd.tensors[op.inputs[0]].dtype))


class _Replay:
    """The communicator as one batched op's kernel sees it: its share of the batch's result."""

    def __init__(self, comm, results: List[np.ndarray]):
        self.replicas = comm.replicas
        self._results = results

    def all_gather(self, values, stride, group_size) -> List[np.ndarray]:
        return self._results


def batched_step(gd: GraphData, ops: List[Op], fns: List[Callable]) -> Callable:
    """`fn(comm, per_replica) -> per_replica output tuples` running all of `ops` (one run of
    `runs`, whose kernel functions are `fns`) as one exchange."""
    kind, reduction, stride, size, _ = _key(gd, ops[0])
    in_shapes = [tuple(gd.tensors[op.inputs[0]].shape) for op in ops]
    counts = [int(np.prod(s, dtype=np.int64)) for s in in_shapes]

    def flat_inputs(per_replica) -> List[np.ndarray]:
        return [np.concatenate([np.ascontiguousarray(x).reshape(-1) for x in ins])
                for ins in per_replica]

    if kind == "ReplicatedAllReduce":
        def all_reduce(comm, per_replica) -> List[tuple]:
            reduced = comm.all_reduce(flat_inputs(per_replica), reduction, stride, size)
            return [tuple(_split(r, counts, in_shapes)) for r in reduced]
        return all_reduce

    if kind == "ReplicatedAllGather":
        def all_gather(comm, per_replica) -> List[tuple]:
            stacked = comm.all_gather(flat_inputs(per_replica), stride, size)   # (k, total)
            outs, off = [], 0
            for j, (fn, shape, n) in enumerate(zip(fns, in_shapes, counts)):
                mine = [s[:, off:off + n].reshape((size,) + shape) for s in stacked]
                outs.append(fn(_Replay(comm, mine), [(ins[j],) for ins in per_replica]))
                off += n
            return [tuple(o[r] for o in outs) for r in range(len(per_replica))]
        return all_gather

    chunks = [int(gd.tensors[op.outputs[0]].shape[0]) for op in ops]

    def reduce_scatter(comm, per_replica) -> List[tuple]:
        """Each input zero-padded to k chunks as alone; member i's chunks of every input
        side by side, so the reduction hands member i all of its chunks at once."""
        rows = []
        for ins in per_replica:
            parts = []
            for x, c in zip(ins, chunks):
                flat = np.zeros(size * c, x.dtype)
                flat[:x.size] = np.ascontiguousarray(x).reshape(-1)
                parts.append(flat.reshape(size, c))
            rows.append(np.concatenate(parts, axis=1).reshape(-1))
        mine = comm.reduce_scatter(rows, reduction, stride, size)
        return [tuple(_split(m, chunks, [(c,) for c in chunks])) for m in mine]
    return reduce_scatter


def _split(flat: np.ndarray, counts: List[int], shapes: List[Tuple]) -> List[np.ndarray]:
    parts, off = [], 0
    for n, shape in zip(counts, shapes):
        parts.append(flat[off:off + n].reshape(shape))
        off += n
    return parts
