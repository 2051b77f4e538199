"""Run a program in this process with POPXL_THREADS 1, 2, 4 and unset (the default: the
machine's share of cores), and check that every result is bitwise the same and that, with
several threads, blocks really ran in parallel (the check cannot pass without the threads)."""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, Optional

import numpy as np

from popxl.engine import parallel
from popxl.engine.kernels import _blocks, _matmul_blocks

SETTINGS = ("1", "2", "4", None)          # POPXL_THREADS values; None: unset
THREAD_VARS = ("POPXL_THREADS", "POPXL_BLAS_THREADS", "POPXL_REPLICA_THREADS")


def digest(value: Any) -> str:
    """sha256 of nested lists / tuples / dicts of arrays and numbers (bits, dtypes, shapes)."""
    h = hashlib.sha256()

    def feed(v):
        if isinstance(v, dict):
            for k in sorted(v, key=str):
                h.update(str(k).encode())
                feed(v[k])
        elif isinstance(v, (list, tuple)):
            for x in v:
                feed(x)
        elif isinstance(v, str):
            h.update(v.encode())
        else:
            a = np.asarray(v)
            h.update(f"{a.dtype}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
    feed(value)
    return h.hexdigest()


def over_thread_counts(monkeypatch, run: Callable[[], Any],
                       settings=SETTINGS) -> Dict[Optional[str], Dict[str, Any]]:
    """`run()` once per setting: {setting: {"digest", "blocks": largest parallel block count}}."""
    results = {}
    real = parallel.run_blocks
    seen = []

    def counting(n, fn):
        if parallel.current_threads() > 1:
            seen.append(n)
        return real(n, fn)

    for mod in (_blocks, _matmul_blocks):
        monkeypatch.setattr(mod, "run_blocks", counting)
    # Every product whose split keeps the bits is split, however fast its blocks (the speed
    # criterion only decides where threads pay off; the bits are the same either way).
    monkeypatch.setattr(_matmul_blocks, "GAIN", 1e9)
    monkeypatch.setattr(_matmul_blocks, "_VERDICTS", {})
    for s in settings:
        for var in THREAD_VARS:
            monkeypatch.delenv(var, raising=False)
        if s is not None:
            monkeypatch.setenv("POPXL_THREADS", s)
        del seen[:]
        results[s] = {"digest": digest(run()), "blocks": max(seen, default=0)}
    return results


def assert_same_bits_and_parallel(results, parallel_in=("2", "4")) -> None:
    """Every setting gave the same digest, and the settings `parallel_in` ran blocks on several
    threads (a program of R replicas on one worker gives its threads to the replicas first)."""
    digests = {s: r["digest"] for s, r in results.items()}
    assert len(set(digests.values())) == 1, f"results differ between thread counts: {digests}"
    assert results["1"]["blocks"] == 0
    for s in parallel_in:
        assert results[s]["blocks"] >= 2, f"no blocks ran in parallel with {s} threads: {results}"
