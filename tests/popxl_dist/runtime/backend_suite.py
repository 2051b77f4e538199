"""One process start per backend: the collective, tensor-parallel (1-D and 2-D), remote-buffer, float8 and
upstream-semantics and Session cases, failure scenarios and a short data-parallel MNIST run, all in
one host script.

    popxl-run --backend B --workers W backend_suite.py [--dp-weights PATH] [--gpt-losses PATH]
              [--failures a,b] [--no-cases] [--transport-stats PATH] [--debug-bundles PATH]

Prints the lines of each part; exit status = number of failed parts.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import collective_cases  # noqa: E402
import debug_cases  # noqa: E402
import failure_cases  # noqa: E402
import fp8_cases  # noqa: E402
import remote_cases  # noqa: E402
import surface_cases  # noqa: E402
import session_cases  # noqa: E402
import tp_cases  # noqa: E402
import tp2d_cases  # noqa: E402


GPT_ARGS = ["--tp", "2", "--dp", "2", "--steps", "3", "--compare"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dp-weights", default="")
    p.add_argument("--gpt-losses", default="")
    p.add_argument("--failures", default="")
    p.add_argument("--no-cases", action="store_true")
    p.add_argument("--debug-bundles", default="",
                   help="the debug cases write their replay bundles' paths here (JSON)")
    p.add_argument("--transport-stats", default="",
                   help="ray: write the pool's transport_stats() as JSON here (before failures)")
    ns = p.parse_args()
    failed = 0
    if not ns.no_cases:
        failed += collective_cases.main() != 0
        failed += remote_cases.main() != 0
        failed += surface_cases.main() != 0
        failed += tp_cases.main() != 0
        failed += tp2d_cases.main() != 0
        failed += fp8_cases.main() != 0
        failed += session_cases.main() != 0
        failed += debug_cases.main(["--bundles", ns.debug_bundles]
                                   if ns.debug_bundles else []) != 0
    if ns.dp_weights:
        import mnist_data_parallel

        failed += mnist_data_parallel.main(["--limit", "6", "--test-batches", "2",
                                            "--no-progress", "--save-weights",
                                            ns.dp_weights]) not in (0, None)
    if ns.gpt_losses:
        import gpt_tiny_tp

        failed += gpt_tiny_tp.main(GPT_ARGS + ["--save-losses", ns.gpt_losses]) != 0
    if ns.transport_stats:
        import json

        from popxl.runtime.backends.ray import ray_pool

        with open(ns.transport_stats, "w") as f:
            json.dump(ray_pool(int(os.environ["POPXL_WORKERS"])).transport_stats(), f)
    if ns.failures:
        failed += failure_cases.main(ns.failures.split(",")) != 0
    print(f"suite: {failed} failed part(s)", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
