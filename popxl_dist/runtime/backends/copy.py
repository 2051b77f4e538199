"""Planning a variable copy between two Sessions whose replicas live on the same workers.

`Session.copy_weights_to` (a popxl-dist extension) copies variables from one Session into
another. When both run on the same workers, each destination replica takes its value from a
source replica held by the same worker, so no array crosses the host. `plan_copy` decides, per
worker, which source replica feeds which destination replica, and returns the pairs that cannot
be copied that way (they go through the host).

Which source replica: the one holding the value the host copy would write. A variable's host
value has one entry per replica group (or per replica for `all_replicas` retrieval); any
member of the source group holds that entry in a program that keeps its groups in sync (as
data-parallel training does), so the copy prefers the same replica index, then any member on
the same worker. (Upstream's `get_tensor_data` reads the group's first member.) An RTS variable
is copied shard by shard, so both sides must be sharded alike.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ..._ir.records import IrData

__all__ = ["CopyPlan", "plan_copy"]

# Per worker: [(source tensor id, destination tensor id, [(destination replica, source
# replica), ...]), ...]
CopyPlan = List[Tuple[str, str, List[Tuple[int, int]]]]


def _value_index(ir: IrData, tid: str, r: int) -> int:
    """Which entry of the variable's host value replica `r` holds."""
    info = ir.main.tensors[tid]
    rg = info.extra.get("replica_grouping")
    R = ir.replication_factor
    group_size = rg.group_size if rg is not None else R
    if info.extra.get("retrieval_mode") == "all_replicas" and group_size > 1 and R > 1:
        return r
    return rg.group_of(r) if rg is not None and rg.num_groups > 1 else 0


def _shard_index(ir: IrData, tid: str, r: int) -> int:
    """Which shard of its group's value an RTS variable keeps on replica `r` (0 if unsharded)."""
    info = ir.main.tensors[tid]
    if not info.extra.get("sharded"):
        return 0
    rg = info.extra.get("replica_grouping")
    i = rg.index_in_group(r) if rg is not None else r
    return i % info.extra["shard_over"]


def _same_storage(src: IrData, s_tid: str, dst: IrData, d_tid: str) -> bool:
    a, b = src.main.tensors[s_tid], dst.main.tensors[d_tid]
    if bool(a.extra.get("sharded")) != bool(b.extra.get("sharded")):
        return False
    return not a.extra.get("sharded") or a.extra["shard_over"] == b.extra["shard_over"]


def _sources(src: IrData, s_tid: str, s_block: range, dst: IrData, d_tid: str,
             d_block: range) -> Optional[List[Tuple[int, int]]]:
    """[(destination replica, source replica)] for one worker, or None if some destination
    replica of the worker has no suitable source replica there."""
    pairs = []
    for r in d_block:
        want = (_value_index(dst, d_tid, r), _shard_index(dst, d_tid, r))
        found = [s for s in s_block
                 if (_value_index(src, s_tid, s), _shard_index(src, s_tid, s)) == want]
        if not found:
            return None
        pairs.append((r, r if r in found else found[0]))
    return pairs


def plan_copy(src: IrData, src_blocks: Sequence[Tuple[int, int]], dst: IrData,
              dst_blocks: Sequence[Tuple[int, int]], pairs: Sequence[Tuple[str, str]]
              ) -> Tuple[List[CopyPlan], List[Tuple[str, str]]]:
    """Split `pairs` (source id, destination id) into per-worker plans and the pairs that must
    go through the host. Worker w holds replicas `range(*src_blocks[w])` of the source and
    `range(*dst_blocks[w])` of the destination (no destination replicas past the source's
    workers can be fed on their worker)."""
    plans: List[CopyPlan] = [[] for _ in src_blocks]
    via_host: List[Tuple[str, str]] = []
    for s_tid, d_tid in pairs:
        per_worker: Dict[int, List[Tuple[int, int]]] = {}
        ok = _same_storage(src, s_tid, dst, d_tid) and len(dst_blocks) <= len(src_blocks)
        for w, d_block in enumerate(dst_blocks if ok else ()):
            found = _sources(src, s_tid, range(*src_blocks[w]), dst, d_tid, range(*d_block))
            if found is None:
                ok = False
                break
            per_worker[w] = found
        if not ok:
            via_host.append((s_tid, d_tid))
            continue
        for w, found in per_worker.items():
            plans[w].append((s_tid, d_tid, found))
    return plans, via_host
