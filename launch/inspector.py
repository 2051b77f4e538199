"""`popxl-inspect [--backend B] [--workers W] [--instances N [--replicas R]] [--out DIR]
[--code GRAPH] TARGET [args...]`: what a program will take before it runs.

TARGET (a script, or a YAML config of the built-in job) runs unchanged up to its first device
operation (see `popxl.debug.inspection`); then, for every Ir it built, this prints the memory it
will take per replica, per worker process and on this machine for the launch given (warning
when that exceeds the memory available), writes each graph as a Graphviz file (SVG too where
Graphviz is installed) and, with `--code GRAPH`, the generated code of that graph.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import tempfile
from typing import List, Optional, Sequence, Tuple

__all__ = ["main", "report"]

BACKENDS = ("local", "mpi", "ray")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="popxl-inspect",
        description="Build a PopXL script's programs without running them: the memory they "
                    "will take per replica and worker, their graphs as Graphviz files, the "
                    "generated code of a graph.")
    p.add_argument("--backend", choices=BACKENDS,
                   default=os.environ.get("POPXL_BACKEND", "local") or "local",
                   help="the backend of the launch to estimate (default: $POPXL_BACKEND or "
                        "local)")
    p.add_argument("--workers", type=int, default=None,
                   help="workers of the launch (default 1 for local, 2 for mpi and ray)")
    p.add_argument("--instances", type=int, default=None,
                   help="estimate a launch as this many popdist instances")
    p.add_argument("--replicas", type=int, default=None,
                   help="global replicas of the instances (default: one per instance)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="where the graphs (and --code) are written (default: "
                        "popxl-inspect-<target>)")
    p.add_argument("--code", metavar="GRAPH", action="append", default=[],
                   help="also write and print the generated code of this graph ('main' or a "
                        "graph id; repeatable)")
    p.add_argument("--no-graphs", action="store_true", help="do not write the graph files")
    p.add_argument("--no-base", action="store_true",
                   help="do not measure a worker process's base memory (a child process)")
    p.add_argument("target", help="the Python script, or a YAML config of the built-in job")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the target")
    return p


def _launch_env(ns: argparse.Namespace, workers: int) -> None:
    """The environment the target would see under `popxl-run` with these options."""
    os.environ["POPXL_BACKEND"] = ns.backend
    os.environ["POPXL_WORKERS"] = str(workers)
    if ns.instances is not None:
        n = ns.instances
        total = ns.replicas if ns.replicas is not None else n
        if n < 1 or total % n:
            raise SystemExit(f"popxl-inspect: --replicas ({total}) must be a positive multiple "
                             f"of --instances ({n})")
        os.environ.update({"POPDIST_NUM_INSTANCES": str(n), "POPDIST_INSTANCE_INDEX": "0",
                           "POPDIST_LOCAL_INSTANCE_INDEX": "0",
                           "POPDIST_NUM_TOTAL_REPLICAS": str(total),
                           "POPDIST_NUM_LOCAL_REPLICAS": str(total // n),
                           "POPDIST_REPLICA_INDEX_OFFSET": "0",
                           "POPDIST_NUM_IPUS_PER_REPLICA": "1"})


def _run_target(target: str, args: Sequence[str], backend: str, workers: int
                ) -> Tuple[list, Optional[str], int]:
    """Run the target until its first device operation: (the Irs it built, how it ended, the
    resident set of this process then)."""
    from popxl.debug.inspection import StopInspection, inspecting
    from popxl.debug.memory import current_rss

    ended = None
    with inspecting() as seen:
        old_argv = sys.argv
        try:
            if target.endswith((".yaml", ".yml")):
                from .job.run import main as job_main

                with tempfile.TemporaryDirectory() as tmp:
                    sys.argv = ["popxl-run", target, *args]
                    job_main([target, *args, "--run-dir", os.path.join(tmp, "run")], backend,
                             workers)
            else:
                sys.argv = [target, *args]
                sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
                runpy.run_path(target, run_name="__main__")
            ended = "the script ended without a device operation"
        except StopInspection:
            ended = None
        except SystemExit as e:
            ended = f"the script exited ({e.code})"
        finally:
            sys.argv = old_argv
        rss = current_rss()
    return seen, ended, rss


def report(irs: list, backend: str, workers: int, host_base: int,
           worker_base: Optional[dict], instances: Optional[int] = None) -> Tuple[List[str], int]:
    """The memory report's lines and the bytes this machine needs for the launch (popdist
    instances: every instance is a process like this one, all on this machine)."""
    from popxl.debug.memory import available_memory, estimate, fmt_bytes, launch_shape

    lines: List[str] = []
    host_arrays = 0
    worker_arrays: dict = {}
    per_ir = []
    for k, ir in enumerate(irs):
        w, separate = launch_shape(ir)
        mem = estimate(ir, w, separate, name=ir.debug.session_tag)
        per_ir.append(mem)
        lines.append("")
        lines.append(f"Ir {k + 1} ({mem.name}): {mem.replicas} replica(s) on "
                     f"{len(mem.blocks)} worker(s) {mem.blocks}, "
                     f"{sum(g.ops for g in mem.graphs)} ops in {len(mem.graphs)} compiled graphs")
        rows = [("variables (device state)", mem.variables), ("RTS shards", mem.rts_shards),
                ("remote buffers", mem.remote_buffers),
                ("memory plan buffers (all graphs, kept)", mem.plan_buffers),
                ("peak of values kernels allocate", mem.transient),
                ("host transfer buffers, inputs", mem.stream_in),
                ("host transfer buffers, outputs", mem.stream_out)]
        lines.append("  per replica:")
        lines += [f"    {name:<40} {fmt_bytes(n):>12}" for name, n in rows]
        lines.append(f"    {'total per replica':<40} {fmt_bytes(mem.per_replica):>12}")
        lines.append(f"  the Ir's own arrays (initial values, constants; a copy in every "
                     f"worker process but the host's): {fmt_bytes(mem.ir_arrays)}")
        lines.append(f"  host weights (the host's copy after a sync): "
                     f"{fmt_bytes(mem.host_weights)}")
        lines.append("  graphs (ops, memory plan per replica, peak of other values):")
        for g in sorted(mem.graphs, key=lambda g: -(g.plan_bytes + g.transient_bytes))[:12]:
            lines.append(f"    {g.graph or 'main':<32} {g.ops:>6} ops  plan "
                         f"{fmt_bytes(g.plan_bytes):>10} in {g.plan_buffers:>4} buffers  "
                         f"values {fmt_bytes(g.transient_bytes):>10}")
        if len(mem.graphs) > 12:
            lines.append(f"    ({len(mem.graphs) - 12} more graphs)")
        host_arrays += mem.host_bytes()
        for wi in range(len(mem.blocks)):
            key = 0 if wi == 0 or not separate else wi
            worker_arrays[key] = worker_arrays.get(key, 0) + mem.worker_bytes(wi)
    lines.append("")
    launch = (f"{instances} popdist instance(s) on {backend}" if instances else
              f"{backend}, {workers} worker(s)")
    lines.append(f"Per process, for this launch ({launch}):")
    engine_extra = 0
    if worker_base is not None:
        engine_extra = max(worker_base["ran"] - worker_base["imported"], 0)
    host_total = host_base + engine_extra + host_arrays + worker_arrays.get(0, 0)
    who = "each instance (the script and its replicas)" if instances else \
        f"host (the script{', worker 0' if worker_arrays else ''})"
    lines.append(f"  {who}: "
                 f"{fmt_bytes(host_total)} = base {fmt_bytes(host_base)} (this process when "
                 f"the script stopped: Python, libraries, the script's data, its Irs) + engine "
                 f"after a first run {fmt_bytes(engine_extra)} + arrays "
                 f"{fmt_bytes(host_arrays + worker_arrays.get(0, 0))}")
    total = host_total * (instances or 1)
    for wi in sorted(k for k in worker_arrays if k):
        base = worker_base["ran"] if worker_base is not None else 0
        t = base + worker_arrays[wi]
        total += t
        lines.append(f"  worker {wi}: {fmt_bytes(t)} = base {fmt_bytes(base)} (a fresh "
                     f"{backend} worker after a first run) + arrays "
                     f"{fmt_bytes(worker_arrays[wi])}")
    have = available_memory()
    lines.append(f"  this machine: {fmt_bytes(total)} for the job"
                 + (f", {fmt_bytes(have)} available" if have is not None else ""))
    if have is not None and total > have:
        lines.append(f"WARNING: this launch needs {fmt_bytes(total)}, more than the "
                     f"{fmt_bytes(have)} this machine has available: it will swap or be killed "
                     f"(fewer replicas or workers, a smaller preset, or more machines)")
    return lines, total


def main(argv: Optional[List[str]] = None) -> int:
    ns = _parser().parse_args(argv)
    workers = ns.workers if ns.workers is not None else (1 if ns.backend == "local" else 2)
    if workers < 1:
        print(f"popxl-inspect: --workers must be >= 1, got {workers}", file=sys.stderr)
        return 2
    if not os.path.isfile(ns.target):
        print(f"popxl-inspect: no such file: {ns.target}", file=sys.stderr)
        return 2
    _launch_env(ns, workers)
    irs, ended, host_base = _run_target(ns.target, ns.args, ns.backend, workers)
    stem = os.path.splitext(os.path.basename(ns.target))[0]
    print(f"popxl-inspect {ns.target}: {len(irs)} Ir(s) built before "
          f"{ended or 'the first device operation'}")
    if not irs:
        print("popxl-inspect: the target created no popxl.Session: nothing to inspect",
              file=sys.stderr)
        return 1
    worker_base = None
    if not ns.no_base:
        from popxl.debug.memory import measure_base

        worker_base = measure_base(ns.backend)
    lines, _ = report(irs, ns.backend, workers, host_base, worker_base, ns.instances)
    print("\n".join(lines))
    out = ns.out or f"popxl-inspect-{stem}"
    if not ns.no_graphs or ns.code:
        _write_views(irs, out, ns.no_graphs, ns.code)
    return 0


def _write_views(irs: list, out: str, no_graphs: bool, code: Sequence[str]) -> None:
    from popxl.debug.graph_view import graph_file_name, write_graphs

    for gid in code:
        gid = "" if gid == "main" else gid
        if not any(gid in ir.graphs for ir in irs):
            names = sorted({g for ir in irs for g in ir.graphs if g})
            raise SystemExit(f"popxl-inspect: --code {gid!r}: no such graph (graphs: main"
                             f"{''.join(', ' + n for n in names)})")
    written: List[str] = []
    for k, ir in enumerate(irs):
        prefix = f"ir{k + 1}-" if len(irs) > 1 else ""
        if not no_graphs:
            written += write_graphs(ir, out, prefix)
        for gid in code:
            gid = "" if gid == "main" else gid
            if gid not in ir.graphs:
                continue
            from popxl.engine.compile import Program

            program = Program(ir)
            cg = program.main if not gid else program.graph(gid)
            path = os.path.join(out, f"{prefix}{graph_file_name(gid)}.py")
            os.makedirs(out, exist_ok=True)
            with open(path, "w") as f:
                f.write(cg.source)
            print(f"\n# generated code of graph {gid or 'main'} ({path}):\n{cg.source}")
    if written:
        svgs = sum(p.endswith(".svg") for p in written)
        print(f"\ngraphs: {len(written) - svgs} .dot files in {out}/"
              + (f" and {svgs} .svg" if svgs else
                 " (no .svg: Graphviz's `dot` is not installed; `dot -Tsvg FILE.dot` renders "
                 "them where it is)"))


if __name__ == "__main__":
    sys.exit(main())
