"""How many times one run of a program loads from and stores to each host stream.

Upstream's host I/O rule (reference §2): the k-th `host_load` of a stream in a run reads transfer
`k % T` of the host array (reads wrap around), the k-th `host_store` writes transfer `k % T`
(`T` = the array's transfers, `num_host_transfers` for `Session.run`). A stream stored fewer than
`num_host_transfers` times per run leaves transfers of its output unwritten: upstream returns
them as uninitialised memory (`np.empty`). popxl-dist refuses that: `store_shortfalls` finds the
streams that are certainly (every run) or possibly (some branch of a conditional) stored too few
times, at compile time.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from .._ir.records import IrData

__all__ = ["Counts", "stream_counts", "store_shortfalls"]

# stream id -> (fewest, most) executions per run
Counts = Dict[str, Tuple[int, int]]


def _add(into: Counts, other: Counts, times: int = 1) -> None:
    for s, (lo, hi) in other.items():
        a, b = into.get(s, (0, 0))
        into[s] = (a + lo * times, b + hi * times)


def _either(a: Counts, b: Counts) -> Counts:
    """The counts of running one of two branches."""
    out: Counts = {}
    for s in set(a) | set(b):
        (alo, ahi), (blo, bhi) = a.get(s, (0, 0)), b.get(s, (0, 0))
        out[s] = (min(alo, blo), max(ahi, bhi))
    return out


def stream_counts(ir: IrData, gid: str = "") -> Tuple[Counts, Counts]:
    """`(loads, stores)`: per stream id, the fewest and most `HostLoad` / `HostStore` executions
    of one run of graph `gid` (the main graph by default), through calls, repeats and
    conditionals."""
    memo: Dict[str, Tuple[Counts, Counts]] = {}

    def visit(g: str) -> Tuple[Counts, Counts]:
        got = memo.get(g)
        if got is not None:
            return got
        loads: Counts = {}
        stores: Counts = {}
        for op in ir.graphs[g].ops:
            if op.type == "HostLoad":
                _add(loads, {op.attrs["stream"]: (1, 1)})
            elif op.type == "HostStore":
                _add(stores, {op.attrs["stream"]: (1, 1)})
            elif op.type == "If":
                (tl, ts), (el, es) = visit(op.called[0]), visit(op.called[1])
                _add(loads, _either(tl, el))
                _add(stores, _either(ts, es))
            elif op.called:
                times = int(op.attrs["trip_count"]) if op.type == "Loop" else 1
                for callee in op.called:
                    cl, cs = visit(callee)
                    _add(loads, cl, times)
                    _add(stores, cs, times)
        memo[g] = (loads, stores)
        return memo[g]

    return visit(gid)


def store_shortfalls(ir: IrData, d2h: Sequence[str]) -> Tuple[Dict[str, int], List[str]]:
    """`(certain, possible)` among the d2h streams `d2h`: the streams every run stores fewer
    than `num_host_transfers` times (with the most stores any run makes: 0 for a stream stored
    only in graphs the main graph never calls), and those some runs may (a conditional
    decides)."""
    n = ir.num_host_transfers
    _, stores = stream_counts(ir)
    counts = {s: stores.get(s, (0, 0)) for s in d2h}
    certain = {s: hi for s, (lo, hi) in counts.items() if hi < n}
    possible = [s for s, (lo, hi) in counts.items() if lo < n <= hi]
    return certain, possible
