"""Stress test, run only when asked (`POPXL_STRESS=N`, N launches): the user guide's 8-instance
RTS program (`poprun --num-instances 8 --num-replicas 128 examples/rts_popdist.py --groupings`)
under CPU contention (one busy process per core beside it), N times. Every launch must pass:
an instance's goodbye must never be taken for an exit while its last data is still on the way
(it was: `InstanceFailed: instance 3 ended its script without joining this collective` in about
1 launch in 10). Prints the tally.

    POPXL_STRESS=30 python -m pytest tests/popxl_dist/runtime/test_instance_stress.py -s
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from test_instances import HAVE_MPI, RTS, lines_of, poprun

RUNS = int(os.environ.get("POPXL_STRESS", "0") or 0)

pytestmark = [pytest.mark.skipif(not RUNS, reason="stress test: set POPXL_STRESS=N to run it"),
              pytest.mark.skipif(not HAVE_MPI, reason="mpi4py / mpich not installed"),
              pytest.mark.timeout(0)]


def _busy() -> list:
    """One busy-looping process per core (killed by the caller)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]


def test_eight_instances_of_rts_under_cpu_contention():
    failures = []
    t0 = time.monotonic()
    busy = _busy()
    try:
        for k in range(RUNS):
            res = poprun("--num-instances", "8", "--num-replicas", "128", sys.executable, RTS,
                         "--groupings", timeout=900, OPENBLAS_NUM_THREADS="1")
            ok = res.returncode == 0 and all(
                len([x for x in lines_of(res.stdout, f"[1,{i}]<stdout>: ")
                     if x.startswith("ok R128 rts[")]) == 5 for i in range(8))
            if not ok:
                failures.append((k, res.returncode, [x for x in res.text.splitlines()
                                                     if "Error" in x or "Failed" in x][:5]))
            print(f"stress run {k + 1}/{RUNS}: {'ok' if ok else 'FAILED'} "
                  f"(exit {res.returncode}, load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"\nstress: {RUNS - len(failures)}/{RUNS} launches passed in "
          f"{time.monotonic() - t0:.0f} s; failures: {failures}")
    assert not failures, failures
