"""Collectives between replicas: deterministic reductions over replica groups.

A `Communicator` serves one worker, which holds a contiguous block of replicas (`Layout`). Kernels
hand it one array per local replica; it combines them with the other workers' contributions
through a `Transport` (threads, MPI ranks or Ray actors) and returns one result per local replica.

Determinism: every reduction over a group of k members follows one fixed binary tree over the
member positions 0..k-1 (`_split`), whatever the number of workers. A worker reduces the largest
subtrees it holds entirely in memory first and sends only those partial results, so the bits of
the result never depend on the backend or on W. float16 accumulates in float32 and rounds once.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Layout", "Communicator", "Transport", "group_of", "index_in_group", "members",
           "REDUCE_OPS", "reduce_values"]


def group_of(r: int, stride: int, group_size: int) -> int:
    """Group index of replica `r` in the constant-stride grouping (stride, group_size)."""
    return r % stride + stride * (r // (stride * group_size))


def index_in_group(r: int, stride: int, group_size: int) -> int:
    """Position of replica `r` among its group's members (ascending replica order)."""
    return (r % (stride * group_size)) // stride


def members(g: int, stride: int, group_size: int) -> List[int]:
    """Replica indices of group `g`, ascending."""
    first = (g // stride) * stride * group_size + g % stride
    return [first + i * stride for i in range(group_size)]


class Layout:
    """R replicas on W workers in contiguous blocks (the first R % W workers get one more), or
    in the given `blocks` (`[lo, hi)` per worker, in order, covering every replica: the
    replicas of popdist instances)."""

    def __init__(self, replication_factor: int, workers: int,
                 blocks: Optional[Sequence[Tuple[int, int]]] = None):
        self.replication_factor = replication_factor
        if blocks is not None:
            self.blocks: List[Tuple[int, int]] = [(int(a), int(b)) for a, b in blocks]
            ends = [0] + [b for _, b in self.blocks]
            if len(self.blocks) != workers or any(
                    a != ends[w] or b <= a for w, (a, b) in enumerate(self.blocks)) \
                    or ends[-1] != replication_factor:
                raise ValueError(f"replica blocks {self.blocks} do not cover the "
                                 f"{replication_factor} replicas contiguously with {workers} "
                                 f"workers")
            self.num_workers = workers
        else:
            self.num_workers = max(1, min(workers, replication_factor))
            base, extra = divmod(replication_factor, self.num_workers)
            self.blocks = []
            lo = 0
            for w in range(self.num_workers):
                hi = lo + base + (1 if w < extra else 0)
                self.blocks.append((lo, hi))
                lo = hi
        self._owner = [w for w, (a, b) in enumerate(self.blocks) for _ in range(a, b)]

    def worker_of(self, replica: int) -> int:
        return self._owner[replica]

    def replicas_of(self, worker: int) -> range:
        lo, hi = self.blocks[worker]
        return range(lo, hi)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and other.blocks == self.blocks

    def __repr__(self) -> str:
        return f"Layout(R={self.replication_factor}, blocks={self.blocks})"


class Transport:
    """Point-to-point exchange between workers during one collective.

    `exchange(sends, recvs, tag)` sends `sends[peer]` (a 1-D array) to each peer and returns
    `{peer: array}` received from each peer in `recvs` (`{peer: (size, dtype)}`). The peer sets are
    symmetric by construction. Implementations time out and honour aborts instead of hanging,
    and keep no reference to the send arrays once `exchange` returns (the caller reuses them).
    """

    def exchange(self, sends: Dict[int, np.ndarray], recvs: Dict[int, Tuple[int, np.dtype]],
                 tag: int) -> Dict[int, np.ndarray]:
        raise NotImplementedError


# --- reduction arithmetic -----------------------------------------------------------------
REDUCE_OPS = ("add", "mean", "mul", "min", "max", "and", "or", "square_add")
_COMBINE = {"add": np.add, "mean": np.add, "square_add": np.add, "mul": np.multiply,
            "min": np.minimum, "max": np.maximum, "and": np.logical_and, "or": np.logical_or}


def _acc_dtype(dtype: np.dtype, op: str) -> np.dtype:
    if op in ("and", "or"):
        return np.dtype(bool)
    if dtype == np.float16 and op in ("add", "mean", "square_add", "mul"):
        return np.dtype(np.float32)
    return dtype


_SPLIT_MIN = 1 << 16     # elements: below this one exchange round beats two


def _leaf_fn(op: str, acc: np.dtype):
    """Convert a member's value to the accumulation dtype (squared for square_add)."""
    def leaf(x: np.ndarray) -> np.ndarray:
        if x.dtype != acc:
            x = x.astype(acc)
        return np.multiply(x, x) if op == "square_add" else x
    return leaf


def _finish_mean(total: np.ndarray, op: str, k: int, acc: np.dtype,
                 inplace: bool = False) -> np.ndarray:
    """Divide by the group size for "mean" (integers truncate towards zero)."""
    if op != "mean":
        return total
    if np.issubdtype(acc, np.integer):
        res = (total / k).astype(acc)
        if inplace:
            np.copyto(total, res)
            return total
        return res
    return np.divide(total, np.asarray(k, dtype=acc), out=total if inplace else None)


def _split(lo: int, hi: int) -> int:
    """The fixed split point of tree node [lo, hi): the left child is the largest power of two
    strictly below the node size."""
    n = hi - lo
    return lo + (1 << ((n - 1).bit_length() - 1))


def _cover(lo: int, hi: int, a: int, b: int, out: List[Tuple[int, int]]) -> None:
    """Append the maximal tree nodes under [lo, hi) that lie inside [a, b), left to right."""
    if b <= lo or hi <= a:
        return
    if a <= lo and hi <= b:
        out.append((lo, hi))
        return
    mid = _split(lo, hi)
    _cover(lo, mid, a, b, out)
    _cover(mid, hi, a, b, out)


@lru_cache(maxsize=4096)
def cover(k: int, a: int, b: int) -> Tuple[Tuple[int, int], ...]:
    out: List[Tuple[int, int]] = []
    _cover(0, k, a, b, out)
    return tuple(out)


class _Tree:
    """Evaluates tree nodes from known partial values, combining left to right."""

    def __init__(self, combine, known: Dict[Tuple[int, int], np.ndarray], owned: set,
                 root: Tuple[int, int] = (0, 0)):
        self.root = root
        self.combine = combine
        self.known = known
        self.owned = owned          # ids of arrays this evaluation may overwrite

    def value(self, lo: int, hi: int) -> np.ndarray:
        v = self.known.get((lo, hi))
        if v is not None:
            return v
        if hi - lo <= 1:
            raise KeyError((lo, hi))
        mid = _split(lo, hi)
        left, right = self.value(lo, mid), self.value(mid, hi)
        if id(left) in self.owned:
            out = self.combine(left, right, out=left)
        else:
            # ufuncs return NumPy scalars for 0-d operands: keep an array (it is written to)
            out = np.asarray(self.combine(left, right))
            self.owned.add(id(out))
        self.known[(lo, hi)] = out
        return out

    def into(self, dest: np.ndarray) -> np.ndarray:
        """Evaluate the root straight into `dest` (which may be one of the leaves: the last
        combine is element-wise, and every leaf has been read by then)."""
        lo, hi = self.root
        v = self.known.get((lo, hi))
        if v is not None:
            if v is not dest:
                np.copyto(dest, v)
            return dest
        mid = _split(lo, hi)
        left, right = self.value(lo, mid), self.value(mid, hi)
        self.combine(left, right, out=dest)
        return dest


def reduce_values(values: Sequence[np.ndarray], op: str) -> np.ndarray:
    """The reduction of `values` (in member order) held in one place, with the communicator's
    fixed tree and accumulation rules: the same bits as an all-reduce over a group whose
    members hold these values. A fresh array of the values' dtype."""
    if op not in _COMBINE:
        raise ValueError(f"unknown reduction {op!r}; expected one of {REDUCE_OPS}")
    k = len(values)
    dtype = values[0].dtype
    acc = _acc_dtype(dtype, op)
    leaf = _leaf_fn(op, acc)
    known, owned = {}, set()
    for i, v in enumerate(values):
        x = leaf(v)
        if x is not v:
            owned.add(id(x))
        known[(i, i + 1)] = x
    total = _Tree(_COMBINE[op], known, owned, (0, k)).value(0, k)
    if op == "mean":
        total = _finish_mean(total, op, k, acc, inplace=id(total) in owned)
        owned.add(id(total))
    if total.dtype != dtype:
        return total.astype(dtype)
    return total if id(total) in owned else total.copy()


class _Group:
    """One group touched by this worker: its members and who holds which member positions."""

    __slots__ = ("index", "members", "local", "peers")

    def __init__(self, index: int, members_: List[int], local: Tuple[int, int],
                 peers: Dict[int, Tuple[int, int]]):
        self.index = index
        self.members = members_
        self.local = local                  # [a, b) member positions held here
        self.peers = peers                  # other worker -> [a, b) member positions it holds


class Communicator:
    """The collective operations of one worker over its local replicas (see module doc)."""

    def __init__(self, layout: Layout, worker: int, transport: Optional[Transport] = None):
        self.layout = layout
        self.worker = worker
        self.replicas: Tuple[int, ...] = tuple(layout.replicas_of(worker))
        self.replication_factor = layout.replication_factor
        self.transport = transport
        self.tag = 0               # set by the executor before each collective step
        self.run = 0               # the Session's run number (for error messages)
        self._plans: Dict[Tuple[int, int], List[_Group]] = {}
        self._pos = {r: j for j, r in enumerate(self.replicas)}

    # --- planning ----------------------------------------------------------------------
    def _plan(self, stride: int, k: int) -> List[_Group]:
        plan = self._plans.get((stride, k))
        if plan is None:
            R = self.replication_factor
            if stride < 1 or k < 1 or R % (stride * k) and not (k == 1):
                raise ValueError(f"invalid collective grouping stride={stride}, "
                                 f"group_size={k} for {R} replicas")
            seen, plan = set(), []
            for r in self.replicas:
                g = group_of(r, stride, k)
                if g in seen:
                    continue
                seen.add(g)
                mem = members(g, stride, k)
                by_worker: Dict[int, List[int]] = {}
                for i, m in enumerate(mem):
                    by_worker.setdefault(self.layout.worker_of(m), []).append(i)
                spans = {w: (p[0], p[-1] + 1) for w, p in by_worker.items()}
                local = spans.pop(self.worker)
                plan.append(_Group(g, mem, local, spans))
            plan.sort(key=lambda grp: grp.index)    # payloads are packed in group order
            self._plans[(stride, k)] = plan
        return plan

    def _exchange(self, sends: Dict[int, List[np.ndarray]],
                  recvs: Dict[int, List[Tuple[Tuple[int, ...], np.dtype]]]
                  ) -> Dict[int, List[np.ndarray]]:
        """Send each peer its list of arrays, receive the lists of known shapes back."""
        if not recvs:
            return {}
        if self.transport is None:
            raise RuntimeError("collective needs other workers but this worker has no transport")
        packed = {p: (np.concatenate([a.reshape(-1) for a in arrs]) if len(arrs) > 1
                      else np.ascontiguousarray(arrs[0]).reshape(-1))
                  for p, arrs in sends.items()}
        specs = {p: (sum(int(np.prod(s)) for s, _ in lst), lst[0][1]) for p, lst in recvs.items()}
        got = self.transport.exchange(packed, specs, self.tag)
        out: Dict[int, List[np.ndarray]] = {}
        for p, lst in recvs.items():
            flat, off, arrs = got[p], 0, []
            for shape, _ in lst:
                n = int(np.prod(shape))
                arrs.append(flat[off:off + n].reshape(shape))
                off += n
            out[p] = arrs
        return out

    # --- reductions --------------------------------------------------------------------
    def all_reduce(self, values: Sequence[np.ndarray], op: str, stride: int, group_size: int,
                   out: Optional[Sequence[np.ndarray]] = None) -> List[np.ndarray]:
        """The reduction over each local replica's group, one fresh array per local replica, or
        written into `out[j]` (which may be `values[j]`: in place) and returned."""
        if group_size == 1:
            return self._identity(values, op, out)
        if op not in _COMBINE:
            raise ValueError(f"unknown reduction {op!r}; expected one of {REDUCE_OPS}")
        plan = self._plan(stride, group_size)
        if values[0].size >= _SPLIT_MIN:      # the same choice on every worker
            return self._all_reduce_split(values, op, group_size, plan, out)
        return self._reduce(values, op, stride, group_size, chunk=None, out=out)

    def _all_reduce_split(self, values, op, k, plan, out) -> List[np.ndarray]:
        """All-reduce of large arrays across workers as reduce-scatter then all-gather between
        the workers: each worker reduces only its 1/P of the columns (the same tree per
        element, so the same bits), writes it straight into the destination, and the reduced
        column blocks are exchanged."""
        dtype = values[0].dtype
        acc = _acc_dtype(dtype, op)
        combine = _COMBINE[op]
        shape, n = values[0].shape, values[0].size
        leaf = _leaf_fn(op, acc)
        flats = [np.ascontiguousarray(v).reshape(-1) for v in values]
        dests = [out[j] if out is not None else np.empty(shape, dtype)
                 for j in range(len(values))]
        dflat = [d.reshape(-1) if d.flags.c_contiguous else np.empty(n, dtype) for d in dests]
        sends: Dict[int, List[np.ndarray]] = {}
        recvs: Dict[int, List[Tuple[Tuple[int, ...], np.dtype]]] = {}
        layout = []
        for grp in plan:
            workers = sorted([self.worker, *grp.peers])
            spans = [(i * n // len(workers), (i + 1) * n // len(workers))
                     for i in range(len(workers))]
            c0, c1 = spans[workers.index(self.worker)]
            a, b = grp.local
            mine = cover(k, a, b)
            for p, (pa, pb) in sorted(grp.peers.items()):
                p0, p1 = spans[workers.index(p)]
                sends.setdefault(p, []).extend(
                    self._node_on_cols(grp, node, flats, leaf, combine, p0, p1) for node in mine)
                recvs.setdefault(p, []).extend([((c1 - c0,), acc)] * len(cover(k, pa, pb)))
            layout.append((grp, workers, spans))
        got = self._exchange(sends, recvs)
        cursor = dict.fromkeys(got, 0)
        sends, recvs = {}, {}
        for grp, workers, spans in layout:
            c0, c1 = spans[workers.index(self.worker)]
            a, b = grp.local
            known, owned = {}, set()
            for i in range(a, b):
                src = flats[self._pos[grp.members[i]]][c0:c1]
                x = leaf(src)
                if x is not src:
                    owned.add(id(x))
                known[(i, i + 1)] = x
            for p, (pa, pb) in sorted(grp.peers.items()):
                for node in cover(k, pa, pb):
                    known[node] = got[p][cursor[p]]
                    cursor[p] += 1
            tree = _Tree(combine, known, owned, (0, k))
            target = dflat[self._pos[grp.members[a]]][c0:c1]
            if acc == dtype:
                tree.into(target)
                _finish_mean(target, op, k, acc, inplace=True)
            else:
                np.copyto(target, _finish_mean(tree.value(0, k), op, k, acc), casting="unsafe")
            for p, (pa, pb) in sorted(grp.peers.items()):
                p0, p1 = spans[workers.index(p)]
                sends.setdefault(p, []).append(target)
                recvs.setdefault(p, []).append(((p1 - p0,), dtype))
        got = self._exchange(sends, recvs)
        cursor = dict.fromkeys(got, 0)
        results: List[Optional[np.ndarray]] = [None] * len(self.replicas)
        for grp, workers, spans in layout:
            a, b = grp.local
            first = dflat[self._pos[grp.members[a]]]
            for p in sorted(grp.peers):
                p0, p1 = spans[workers.index(p)]
                first[p0:p1] = got[p][cursor[p]]
                cursor[p] += 1
            for i in range(a, b):
                j = self._pos[grp.members[i]]
                if dflat[j] is not first:
                    np.copyto(dflat[j], first)
                if dests[j].reshape(-1) is not dflat[j] and not dests[j].flags.c_contiguous:
                    np.copyto(dests[j], dflat[j].reshape(shape))
                results[j] = dests[j]
        return results  # type: ignore[return-value]

    def _node_on_cols(self, grp, node, flats, leaf, combine, c0, c1) -> np.ndarray:
        """The partial value of tree `node` on the flat columns [c0, c1)."""
        lo, hi = node
        srcs = [flats[self._pos[grp.members[i]]][c0:c1] for i in range(lo, hi)]
        sub = {(lo + m, lo + m + 1): leaf(x) for m, x in enumerate(srcs)}
        fresh = {id(v) for v, x in zip(sub.values(), srcs) if v is not x}
        return _Tree(combine, sub, fresh).value(lo, hi)

    @staticmethod
    def _identity(values, op, out) -> List[np.ndarray]:
        """A reduction over groups of one: no communication, `square_add` squares."""
        res = []
        for j, x in enumerate(values):
            y = x
            if op == "square_add":
                acc = _acc_dtype(x.dtype, op)
                xa = x.astype(acc)
                y = np.multiply(xa, xa).astype(x.dtype)
            elif op in ("and", "or"):
                y = x.astype(bool).astype(x.dtype)
            if out is not None:
                if out[j] is not y:
                    np.copyto(out[j], y)
                res.append(out[j])
            else:
                res.append(y.copy() if y is x else y)
        return res

    def reduce_scatter(self, values: Sequence[np.ndarray], op: str, stride: int,
                       group_size: int) -> List[np.ndarray]:
        """`values` are 1-D of length k*c; local replica at member position i gets chunk i of the
        group's reduction."""
        n = values[0].shape[0]
        if n % group_size:
            raise ValueError(f"reduce_scatter input length {n} is not a multiple of the group "
                             f"size {group_size}")
        return self._reduce(values, op, stride, group_size, chunk=n // group_size)

    def _reduce(self, values, op, stride, k, chunk, out=None) -> List[np.ndarray]:
        if op not in _COMBINE:
            raise ValueError(f"unknown reduction {op!r}; expected one of {REDUCE_OPS}")
        dtype = values[0].dtype
        acc = _acc_dtype(dtype, op)
        combine = _COMBINE[op]
        leaf = _leaf_fn(op, acc)

        def cols(x: np.ndarray, a: int, b: int) -> np.ndarray:
            return x if chunk is None else x[a * chunk:b * chunk]

        plan = self._plan(stride, k)
        trees: Dict[int, _Tree] = {}
        sends: Dict[int, List[np.ndarray]] = {}
        recvs: Dict[int, List[Tuple[Tuple[int, ...], np.dtype]]] = {}
        shape = values[0].shape
        for grp in plan:
            a, b = grp.local
            ca, cb = (a, b) if chunk is not None else (0, 0)
            owned: set = set()
            known = {}
            for i in range(a, b):
                src = cols(values[self._pos[grp.members[i]]], ca, cb)
                x = leaf(src)
                if x is not src:           # a converted copy: safe to accumulate into
                    owned.add(id(x))
                known[(i, i + 1)] = x
            tree = _Tree(combine, known, owned, (0, k))
            mine = cover(k, a, b)
            partials = [tree.value(*node) for node in mine] if grp.peers else []
            for p, (pa, pb) in sorted(grp.peers.items()):
                if chunk is None:
                    sends.setdefault(p, []).extend(partials)
                    rshape = shape
                else:
                    # Send the peer only the columns of the chunks its members keep.
                    full = [self._node_on_cols(grp, node, values, leaf, combine, pa * chunk,
                                               pb * chunk) for node in mine]
                    sends.setdefault(p, []).extend(full)
                    rshape = ((b - a) * chunk,)
                for _node in cover(k, pa, pb):
                    recvs.setdefault(p, []).append((rshape, acc))
            trees[grp.index] = tree
        received = self._exchange(sends, recvs)
        cursor = {p: 0 for p in received}
        results: List[Optional[np.ndarray]] = [None] * len(self.replicas)
        for grp in plan:
            tree = trees[grp.index]
            for p, (pa, pb) in sorted(grp.peers.items()):
                for node in cover(k, pa, pb):
                    tree.known[node] = received[p][cursor[p]]
                    cursor[p] += 1
            a, b = grp.local
            if out is not None and acc == dtype and chunk is None:
                first = out[self._pos[grp.members[a]]]
                _finish_mean(tree.into(first), op, k, acc, inplace=True)
                for i in range(a, b):
                    dest = out[self._pos[grp.members[i]]]
                    if dest is not first:
                        np.copyto(dest, first)
                    results[self._pos[grp.members[i]]] = dest
                continue
            total = tree.value(0, k)
            if op == "mean":         # a fresh array, or the owned total divided in place
                total = _finish_mean(total, op, k, acc, inplace=id(total) in tree.owned)
                tree.owned.add(id(total))
            if total.dtype != dtype:
                total = total.astype(dtype)
            elif id(total) not in tree.owned:      # an input or a received buffer
                total = total.copy()
            for i in range(a, b):
                if out is not None:
                    dest = out[self._pos[grp.members[i]]]
                    np.copyto(dest, total if chunk is None else
                              total[(i - a) * chunk:(i - a + 1) * chunk], casting="unsafe")
                    results[self._pos[grp.members[i]]] = dest
                    continue
                if chunk is not None:       # disjoint views of one fresh array
                    part = total[(i - a) * chunk:(i - a + 1) * chunk]
                else:
                    part = total if i == a else total.copy()
                results[self._pos[grp.members[i]]] = part
        return results  # type: ignore[return-value]

    # --- gathers -----------------------------------------------------------------------
    def all_gather(self, values: Sequence[np.ndarray], stride: int,
                   group_size: int) -> List[np.ndarray]:
        """For each local replica, its group members' values stacked `(k, *shape)` in member
        order."""
        k = group_size
        plan = self._plan(stride, k)
        shape, dtype = values[0].shape, values[0].dtype
        sends: Dict[int, List[np.ndarray]] = {}
        recvs: Dict[int, List[Tuple[Tuple[int, ...], np.dtype]]] = {}
        for grp in plan:
            a, b = grp.local
            mine = [values[self._pos[grp.members[i]]] for i in range(a, b)]
            for p, (pa, pb) in sorted(grp.peers.items()):
                sends.setdefault(p, []).extend(mine)
                recvs.setdefault(p, []).extend([(shape, dtype)] * (pb - pa))
        received = self._exchange(sends, recvs)
        cursor = {p: 0 for p in received}
        results: List[Optional[np.ndarray]] = [None] * len(self.replicas)
        for grp in plan:
            out = np.empty((k,) + shape, dtype)
            a, b = grp.local
            for i in range(a, b):
                out[i] = values[self._pos[grp.members[i]]]
            for p, (pa, pb) in sorted(grp.peers.items()):
                for i in range(pa, pb):
                    out[i] = received[p][cursor[p]]
                    cursor[p] += 1
            for n, i in enumerate(range(a, b)):
                results[self._pos[grp.members[i]]] = out if n == 0 else out.copy()
        return results  # type: ignore[return-value]
