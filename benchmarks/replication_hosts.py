"""Part 5 of bench_replication.py: all-reduce across hosts, and a cost model of it.

On simulated hosts (tests/hosts/simhosts.py: network namespaces on a user-space switch; root
only), float32 all-reduces of 4 KiB to 64 MiB over 2 and 3 hosts (one worker, one replica per
host), on the Ray backend (a cluster with token authentication, the head on h1 running only the
driver) and on MPI (hydra over TCP, `--hosts`), with no added delay and with 20 ms on every
link: 8 all-reduces in a row per `session.run`, each reading the one before (none overlaps
another, nor the run's command: a single all-reduce per run would hide its latency in the
command's round trip), the run's own round trip (an empty program) subtracted.

The model. popxl's all-reduce over P workers (engine/comm.py) is, below 2^16 elements, one
round in which every worker sends its array to every other; from 2^16 elements up, a
reduce-scatter then an all-gather, two rounds in which every worker sends 1/P of the array to
each other worker. With a per-round latency alpha (plus gamma per peer a worker sends to) and a
per-byte time beta of one host's link:

    t(P, n) = r * (alpha + (P - 1) * gamma) + c(P) * n * beta
    r = 1, c = P - 1            (n < 256 KiB)
    r = 2, c = 2 (P - 1) / P    (n >= 256 KiB)

alpha, gamma and beta are fitted (least squares, relative error) to the measurements of each
backend and delay, and the model is evaluated for 16 and 64 hosts. On the simulated hosts every
link goes through one switch process, so beta here is that switch's, shared by all hosts
(a real network gives each host its own link); the projection says how the algorithm scales,
not what a given network delivers.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from _report import machine_line, markdown_table, text_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
import popart, popdist, popxl  # noqa: E402,F401  (first: tests/popart and tests/popdist
# would be found as namespace packages once tests/ is on sys.path)
sys.path.append(os.path.join(ROOT, "tests"))
sys.path.append(os.path.join(ROOT, "tests", "hosts"))

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
SPLIT_BYTES = 4 << 16               # engine/comm.py _SPLIT_MIN elements of float32
TAG = "BENCH_JSON "
Key = Tuple[str, int, float]        # backend, hosts, delay


def _label(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def model_terms(P: int, n: int) -> Tuple[float, float, float]:
    """(coefficient of alpha, of gamma, of beta) of one all-reduce of n bytes over P."""
    if n < SPLIT_BYTES:
        return 1.0, P - 1.0, (P - 1.0) * n
    return 2.0, 2.0 * (P - 1.0), 2.0 * (P - 1.0) / P * n


def fit(points: Sequence[Tuple[int, int, float]]) -> Tuple[float, float, float]:
    """alpha, gamma, beta (seconds, seconds, seconds per byte) from (P, n, seconds) points,
    least squares on the relative error, clipped at 0."""
    A = np.array([model_terms(P, n) for P, n, _ in points])
    t = np.array([s for _, _, s in points])
    w = 1.0 / t
    coef, *_ = np.linalg.lstsq(A * w[:, None], t * w, rcond=None)
    return tuple(float(max(c, 0.0)) for c in coef)        # type: ignore[return-value]


def predict(coef: Tuple[float, float, float], P: int, n: int) -> float:
    return float(np.dot(model_terms(P, n), coef))


def _sub_run(host, argv: List[str], env: Dict[str, str], timeout: float = 900) -> Optional[dict]:
    res = host.run(argv, env=env, timeout=timeout, cwd=ROOT)
    recs = [json.loads(line[len(TAG):]) for line in res.stdout.splitlines()
            if line.startswith(TAG)]
    if res.returncode or not recs:
        print(f"  !! {' '.join(argv[2:6])}...: exit {res.returncode}", file=sys.stderr)
        for line in (res.stdout + res.stderr).strip().splitlines()[-12:]:
            print(f"     | {line}", file=sys.stderr)
        return None
    return recs[0]


def _measure(sim, script: str, address: str, ray_env: Dict[str, str], quick: bool
             ) -> Dict[Key, Dict[int, float]]:
    """Seconds per all-reduce (run minus empty run, median of rounds) per (backend, hosts,
    delay) and size."""
    from hostjobs import clean_env

    part = [script, "--part", "allreduce_sizes", "--sizes", ",".join(map(str, SIZES)),
            "--iters", "4" if quick else "10", "--rounds", "2" if quick else "3",
            "--warmup", "2", "--empty-iters", "10", "--budget-mb", "128" if quick else "512"]
    out: Dict[Key, Dict[int, float]] = {}
    for delay in (0.0, 0.02):
        sim.shape(delay=delay)
        for P in (2, 3):
            names = ",".join(h.name for h in sim.hosts[:P])
            runs = {"mpi": ([sys.executable, "-m", "popxl_launch", "--backend", "mpi",
                             "--workers", str(P), "--hosts", names, "--remote-exec", sim.ssh,
                             *part], clean_env(POPXL_BATCH_COLLECTIVES="0")),
                    "ray": ([sys.executable, "-m", "popxl_launch", "--backend", "ray",
                             "--workers", str(P), *part],
                            clean_env(POPXL_RAY_ADDRESS=address, POPXL_BATCH_COLLECTIVES="0",
                                      **ray_env))}
            for backend, (argv, env) in runs.items():
                t0 = time.monotonic()
                rec = _sub_run(sim[0], argv, env)
                if rec is None:
                    continue
                if not rec["correct"]:
                    print(f"  !! {backend}, {P} hosts: WRONG RESULT", file=sys.stderr)
                empty = rec["empty_ms"]
                out[(backend, P, delay)] = {int(n): max(statistics.median(v), 1e-3) / 1e3
                                            for n, v in rec["allreduce_ms"].items()}
                print(f"  {backend:3s} {P} hosts, delay {delay * 1e3:2.0f} ms: done in "
                      f"{time.monotonic() - t0:.0f} s (empty run {empty:.1f} ms)", file=sys.stderr)
    sim.shape()
    return out


def _table(rows: List[List[str]], head: List[str], markdown: bool) -> str:
    return markdown_table(head, rows) if markdown else text_table(head, rows, indent="  ")


def report(got: Dict[Key, Dict[int, float]], markdown: bool) -> None:
    head = ["all-reduce", *[_label(n) for n in SIZES]]
    rows = []
    for (backend, P, delay), t in sorted(got.items(), key=lambda kv: (kv[0][2], kv[0][1],
                                                                      kv[0][0])):
        rows.append([f"{backend}, {P} hosts, +{delay * 1e3:.0f} ms"] +
                    [f"{t[n] * 1e3:.2f} ms ({n / t[n] / 1e9:.2f} GB/s)" for n in SIZES])
    print("\nmilliseconds per all-reduce (and the array's bytes / time), median of rounds:\n")
    print(_table(rows, head, markdown))
    if markdown:
        print()
    for backend in ("mpi", "ray"):
        for P in (2, 3):
            a, b = got.get((backend, P, 0.0)), got.get((backend, P, 0.02))
            if a and b:
                print(f"{'-' if markdown else ' '} {backend}, {P} hosts: 20 ms delay costs "
                      + ", ".join(f"{_label(n)} x{b[n] / a[n]:.1f}" for n in SIZES))
    mrows = []
    for backend in ("mpi", "ray"):
        for delay in (0.0, 0.02):
            pts = [(P, n, got[(backend, P, delay)][n]) for P in (2, 3)
                   if (backend, P, delay) in got for n in SIZES]
            if len(pts) < 4:
                continue
            coef = fit(pts)
            err = max(abs(predict(coef, P, n) - s) / s for P, n, s in pts)
            mrows.append([f"{backend}, +{delay * 1e3:.0f} ms", f"{coef[0] * 1e3:.2f} ms",
                          f"{coef[1] * 1e3:.2f} ms", f"{1 / coef[2] / 1e9:.2f} GB/s"
                          if coef[2] else "inf", f"{err * 100:.0f}%"] +
                         [f"{predict(coef, P, n) * 1e3:.1f} ms" for P in (16, 64)
                          for n in (4 << 10, 1 << 20, 64 << 20)])
    head = ["fit", "alpha", "gamma", "1/beta", "worst fit error",
            *[f"P={P} {_label(n)}" for P in (16, 64) for n in (4 << 10, 1 << 20, 64 << 20)]]
    print("\nalpha-beta model t = r (alpha + (P-1) gamma) + c(P) n beta (see "
          "replication_hosts.py), fitted per backend and delay, and its projection:\n")
    print(_table(mrows, head, markdown))


def run_hosts_part(script: str, quick: bool = False, markdown: bool = False) -> int:
    from simhosts import SimHosts

    why = SimHosts.unavailable()
    if why:
        print(f"bench_replication --hosts: {why}")
        return 1
    from hostjobs import clean_env, ray_token_env, start_ray_cluster

    print(f"bench_replication --hosts: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
          f" (figures count only on a quiet machine: below 1)", file=sys.stderr)
    base = os.environ.get("TMPDIR", "/tmp")
    # A SIGTERM unwinds through the `with` below, so the hosts and their processes go with us.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with SimHosts(3, base) as sim:
        ray_env = ray_token_env()
        address = start_ray_cluster(sim.hosts, clean_env(**ray_env))
        got = _measure(sim, script, address, ray_env, quick)
    if markdown:
        print(f"Measured: {machine_line()}")
    report(got, markdown)
    if not markdown:
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0
