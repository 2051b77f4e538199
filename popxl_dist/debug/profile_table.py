"""The profiler's printed table: per Session, the top ops by self time (their share of the
replicas' run time, calls, average, GFLOP/s of matmuls and convolutions) and, per replica, the
time in collectives split into waiting for peers and moving data."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, List

if TYPE_CHECKING:
    from .profile_records import JobProfile, SessionProfile

__all__ = ["profile_table", "session_table", "TOP_OPS"]

TOP_OPS = 25


def short_source(source: str) -> str:
    """`file:line` relative to the working directory when the file is under it."""
    path, sep, line = source.rpartition(":")
    if not sep or not os.path.isabs(path):
        return source
    rel = os.path.relpath(path)
    return f"{rel}:{line}" if not rel.startswith("..") else source


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def session_table(sp: "SessionProfile", top: int = TOP_OPS) -> List[str]:
    """The lines of one Session's tables: the runs after the first (the first, which compiles
    and allocates, is summed apart), or the first when it is the only one."""
    t = sp.steady if sp.steady.runs else sp.first
    step = sum(t.run_time.values())
    per_replica = max(len(t.run_time), 1)
    workers = len(sp.blocks)
    lines = [f"{sp.tag}: {sp.replication_factor} replica(s) on {workers} worker(s) "
             f"({sp.backend}), {sp.first.runs + sp.steady.runs} run(s)"]
    if sp.steady.runs:
        first = sum(sp.first.run_time.values()) / max(len(sp.first.run_time), 1)
        lines.append(f"  runs 2..{sp.first.runs + sp.steady.runs}: "
                     f"{_ms(step / per_replica / t.runs)} ms per run and replica (run 1, with "
                     f"first-time compilation and allocation: {_ms(first)} ms)")
    elif sp.first.runs:
        lines.append(f"  run 1 (with first-time compilation and allocation): "
                     f"{_ms(step / per_replica)} ms per replica")
    if not t.ops:
        return lines + ["  (no op ran)"]
    rows = sorted(t.ops.items(), key=lambda kv: -kv[1].self_time)
    covered = sum(o.self_time for _, o in rows)
    lines.append(f"  top ops by self time (summed over replicas and these runs; ops cover "
                 f"{100 * covered / step if step else 0:.1f}% of the run time, the rest is the "
                 f"executor between ops):")
    head = (f"  {'self ms':>10} {'% of run':>8} {'calls':>7} {'avg us':>9} {'total ms':>10} "
            f"{'GFLOP/s':>8}  op (source)")
    lines += [head, "  " + "-" * (len(head) - 2)]
    for ids, o in rows[:top]:
        info = sp.ops.get(ids[0])
        label = info.label if info else f"op {ids[0]}"
        if len(ids) > 1:
            label += f" +{len(ids) - 1} batched"
        if info is not None and info.source:
            label += f" ({short_source(info.source)})"
        flops = info.flops if info is not None else 0
        gflops = (f"{flops * o.calls / o.self_time / 1e9:.2f}"
                  if flops and o.self_time > 0 else "")
        share = f"{100 * o.self_time / step:.1f}%" if step else ""
        lines.append(f"  {_ms(o.self_time):>10} {share:>8} {o.calls:>7} "
                     f"{o.self_time / o.calls * 1e6:>9.1f} {_ms(o.total):>10} {gflops:>8}  "
                     f"{label}")
    if len(rows) > top:
        rest = sum(o.self_time for _, o in rows[top:])
        lines.append(f"  {_ms(rest):>10} ({len(rows) - top} more ops)")
    if t.collectives:
        lines.append("  collectives per replica (wait: for the peers to arrive; transfer: "
                     "moving, reducing and copying the data):")
        head = (f"  {'replica':>7} {'worker':>6} {'steps':>6} {'total ms':>10} {'wait ms':>10} "
                f"{'transfer ms':>11} {'wait %':>7}")
        lines += [head, "  " + "-" * (len(head) - 2)]
        owner = {r: w for w, (a, b) in enumerate(sp.blocks) for r in range(a, b)}
        for r in sorted(t.collectives):
            n, total, wait, transfer = t.collectives[r]
            share = f"{100 * wait / total:.1f}" if total else ""
            lines.append(f"  {r:>7} {owner.get(r, '?'):>6} {int(n):>6} {_ms(total):>10} "
                         f"{_ms(wait):>10} {_ms(transfer):>11} {share:>7}")
    return lines


def profile_table(job: "JobProfile") -> str:
    """The whole table of a job's profile."""
    lines = [f"popxl profile (POPXL_PROFILE): trace {job.trace_path} (open it in Perfetto or "
             f"chrome://tracing)"]
    if job.dropped:
        lines.append(f"  (the trace keeps the first {len(job.events)} events; {job.dropped} "
                     f"later ones count in these tables only)")
    for sp in job.sessions:
        lines.append("")
        lines += session_table(sp)
    return "\n".join(lines) + "\n"
