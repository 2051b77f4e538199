"""Self-checking `Session.copy_weights_to` cases, run unchanged under every backend.

    python copy_cases.py                               # local backend (in-process)
    popxl-run --backend mpi --workers 2 copy_cases.py
    popxl-run --backend ray --workers 2 copy_cases.py

Each case builds a source program whose variables are updated on the device with replica- or
group-specific data, and a destination program that sends every replica's copy of its variables
to the host (RTS shards all-gathered first). After `src.copy_weights_to(dst, mapping)` the
destination's host values must equal the source's, and every destination replica must hold the
value of its group (checked from the device, not from the host copy). Cases expected to run on
the workers also fail if any variable is read to the host while copying. Prints `ok <case>` or
`FAIL <case>: <details>`; `main()` returns the number of failing cases.
"""
from __future__ import annotations

import contextlib
import sys
import traceback
from typing import NamedTuple, Optional, Tuple

import numpy as np
import popxl
from popxl import ops
from popxl.runtime.base import Runtime


class Spec(NamedTuple):
    """One variable: grouping (stride, group_size) or None for all replicas, retrieval mode,
    replica-sharded (RTS) or not."""

    grouping: Optional[Tuple[int, int]] = None
    mode: str = "one_per_group"
    rts: bool = False


SHAPE = (3, 5)


def _groups(R: int, spec: Spec) -> Tuple[int, list]:
    stride, size = spec.grouping or (1, R)
    group = [r % stride + stride * (r // (stride * size)) for r in range(R)]
    return R // size, group


def _build(R: int, specs, init_value: float, with_outputs: bool):
    """An Ir with one variable per spec: each replica adds its streamed input to it (to its
    shard for RTS); with `with_outputs`, each replica's full value is sent to the host first."""
    ir = popxl.Ir(replication=R)
    built = []
    with ir.main_graph, popxl.in_sequence(True):
        for i, spec in enumerate(specs):
            G, _ = _groups(R, spec)
            rg = ir.replica_grouping(*spec.grouping) if spec.grouping else None
            init = init_value + np.arange(G * np.prod(SHAPE), dtype=np.float32).reshape(
                (G,) + SHAPE)
            data = init if G > 1 else init[0]
            if spec.rts:
                var, on_chip = popxl.replica_sharded_variable(data, popxl.float32, f"v{i}",
                                                              replica_grouping=rg)
                stride, size = spec.grouping or (1, R)
                full = ops.collectives.replicated_all_gather(
                    on_chip, group=ir.replica_grouping(stride, size))
                full = full[:int(np.prod(SHAPE))].reshape(SHAPE)
            else:
                var = popxl.variable(data, popxl.float32, f"v{i}", replica_grouping=rg,
                                     retrieval_mode=spec.mode)
                on_chip = full = var
            out = None
            if with_outputs:
                out = popxl.d2h_stream(SHAPE, popxl.float32, f"out{i}")
                ops.host_store(out, ops.identity(full))
            inp = popxl.h2d_stream(on_chip.shape, popxl.float32, f"in{i}")
            ops.var_updates.accumulate_(on_chip, ops.host_load(inp))
            built.append((var, inp, out))
    return ir, built


def _inputs(R: int, specs, built) -> dict:
    """Per replica: 1 + its group index (one_per_group: the groups stay in sync), or 1 + its
    replica index (all_replicas: every replica differs)."""
    feeds = {}
    for spec, (_, inp, _) in zip(specs, built):
        _, group = _groups(R, spec)
        key = range(R) if spec.mode == "all_replicas" else group
        rows = [np.full(inp.shape, 1.0 + k, np.float32) for k in key]
        feeds[inp] = np.stack(rows) if R > 1 else rows[0]
    return feeds


@contextlib.contextmanager
def _no_host_reads(forbid: bool):
    """Make every runtime's `read_variables` raise while copying (when `forbid`)."""
    if not forbid:
        yield
        return
    classes = {c for c in _runtime_classes()}
    saved = {c: c.__dict__.get("read_variables") for c in classes}

    def refuse(self, tids):
        raise AssertionError(f"variables {list(tids)} were read to the host")

    for c in classes:
        c.read_variables = refuse
    try:
        yield
    finally:
        for c, f in saved.items():
            if f is None:
                del c.read_variables
            else:
                c.read_variables = f


@contextlib.contextmanager
def _count_host_reads():
    """Record (in the yielded list) every runtime `read_variables` call made meanwhile."""
    calls: list = []
    classes = [c for c in _runtime_classes() if "read_variables" in c.__dict__]
    saved = {c: c.__dict__["read_variables"] for c in classes}

    def wrap(f):
        def counted(self, tids):
            calls.append(list(tids))
            return f(self, tids)
        return counted

    for c in classes:
        c.read_variables = wrap(saved[c])
    try:
        yield calls
    finally:
        for c, f in saved.items():
            c.read_variables = f


def _runtime_classes():
    todo, seen = [Runtime], []
    while todo:
        c = todo.pop()
        seen.append(c)
        todo.extend(c.__subclasses__())
    return seen


def run_case(name: str, R_src: int, R_dst: int, src_specs, dst_specs,
             on_workers: Optional[bool], attach_dst: bool = True) -> Optional[str]:
    """None if the case passes, else what went wrong. `on_workers`: True if the copy must not
    read variables to the host, False if it must (None: either)."""
    src_ir, src_built = _build(R_src, src_specs, 0.0, False)
    dst_ir, dst_built = _build(R_dst, dst_specs, 1000.0, True)
    src = popxl.Session(src_ir, "ipu_hw")
    dst = popxl.Session(dst_ir, "ipu_hw")
    mapping = {s[0]: d[0] for s, d in zip(src_built, dst_built)}
    zeros = {inp: np.zeros((R_dst, *inp.shape) if R_dst > 1 else inp.shape, np.float32)
             for _, inp, _ in dst_built}
    with src:
        src.run(_inputs(R_src, src_specs, src_built))
        with dst if attach_dst else contextlib.nullcontext():
            with _count_host_reads() as reads, _no_host_reads(bool(on_workers)):
                src.copy_weights_to(dst, mapping)
            if on_workers is False and not reads:
                return "expected the copy to go through the host, but nothing was read"
            with dst:
                outs = dst.run(zeros)         # what every replica holds, before any host sync
        want = src.get_tensors_data(list(mapping))
    problems = []
    got = dst.get_tensors_data(list(mapping.values()))
    for s, d in mapping.items():
        if not np.array_equal(got[d], want[s]):
            problems.append(f"host value of {d.id}: {got[d].ravel()[:4]}... != "
                            f"{want[s].ravel()[:4]}...")
    for spec, (s, d) in zip(dst_specs, mapping.items()):
        G, group = _groups(R_dst, spec)
        host = want[s]
        for r in range(R_dst):
            expect = host[group[r]] if G > 1 else host
            value = outs[dst_built[list(mapping).index(s)][2]]
            value = value[r] if R_dst > 1 else value
            if not np.array_equal(value, expect):
                problems.append(f"replica {r} of {d.id} holds {value.ravel()[:4]}... not "
                                f"{expect.ravel()[:4]}...")
    return "; ".join(problems) or None


CASES = [
    # name, R_src, R_dst, source specs, destination specs, expected on the workers
    ("same layout", 4, 4, [Spec(), Spec()], [Spec(), Spec()], True),
    ("groups (1,2)", 4, 4, [Spec((1, 2))], [Spec((1, 2))], True),
    ("groups (2,2)", 4, 4, [Spec((2, 2))], [Spec((2, 2))], True),
    ("all_replicas -> group_size 1", 2, 2, [Spec(mode="all_replicas")], [Spec((1, 1))],
     True),
    ("rts -> rts", 4, 4, [Spec(rts=True)], [Spec(rts=True)], True),
    ("rts groups (1,2) -> rts", 4, 4, [Spec((1, 2), rts=True)], [Spec((1, 2), rts=True)],
     True),
    ("fewer destination replicas", 4, 2, [Spec()], [Spec()], True),
    ("rts -> unsharded (via host)", 4, 4, [Spec(rts=True)], [Spec()], False),
    ("unsharded -> rts (via host)", 4, 4, [Spec()], [Spec(rts=True)], False),
    # On the workers when the destination's replicas sit on the source's workers (W <= 2
    # here); a one-replica Session runs in the host process with local worker threads, on a
    # worker on mpi and ray. Either path is right, so it is not checked.
    ("more destination replicas", 2, 4, [Spec()], [Spec()], None),
    ("one destination replica", 2, 1, [Spec()], [Spec()], None),
    ("detached destination (via host)", 4, 4, [Spec()], [Spec()], False, False),
]


def main() -> int:
    failed = 0
    for case in CASES:
        name = case[0]
        try:
            err = run_case(*case)
        except Exception:  # noqa: BLE001 - reported as a failed case
            err = traceback.format_exc()
        if err:
            failed += 1
            print(f"FAIL copy {name}: {err}", flush=True)
        else:
            print(f"ok copy {name}", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
