"""The main job's train-to-test weight copy: `Session.copy_weights_to` (on the workers) against
the upstream way through the host (`get_tensors_data` + `write_variables_data`), each measured
after a training step, beside the training step itself (all in the same run; medians).

    popxl-run benchmarks/bench_weight_copy.py
    popxl-run --backend mpi --workers 2 benchmarks/bench_weight_copy.py
    popxl-run --backend ray --workers 2 benchmarks/bench_weight_copy.py [--config CONFIG]

Prints figures, never asserts.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from popxl_launch.job.config import load_config, resolve
from popxl_launch.job.data import EpochLoader, load_data
from popxl_launch.job.programs import build_test_program, build_train_program


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/mnist.yaml")
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    _, data_cfg = load_config(args.config)
    cfg = resolve(data_cfg)
    data = load_data(cfg)
    train = build_train_program(cfg)
    test = build_test_program(cfg, train.sharded_keys)
    session = train.session
    loader = EpochLoader(data.train_images, data.train_labels, cfg.train.global_batch,
                         train.lead, cfg.seed)
    pairs = {train.weights[k]: test.weights[k] for k in train.weights.keys_flat()}
    times = {"training step": [], "copy_weights_to": [], "via the host": []}

    def step() -> None:
        x, y = next(loader)
        t0 = time.perf_counter()
        session.run({session.inputs.images: x, session.inputs.labels: y})
        times["training step"].append(time.perf_counter() - t0)

    def via_host() -> None:
        data = session.get_tensors_data(list(pairs))
        test.session.write_variables_data({d: data[s] for s, d in pairs.items()})

    with session, test.session:
        for _ in range(3):                      # warm up every path
            step()
            session.copy_weights_to(test.session, pairs)
            via_host()
        for v in times.values():
            v.clear()
        for _ in range(args.repeats):
            for name, copy in (("copy_weights_to",
                                lambda: session.copy_weights_to(test.session, pairs)),
                               ("via the host", via_host)):
                step()                          # the device weights are newer than the host's
                t0 = time.perf_counter()
                copy()
                times[name].append(time.perf_counter() - t0)
    nbytes = sum(int(np.prod(t.shape)) * np.dtype(t.dtype.as_numpy()).itemsize
                 for t in pairs)
    backend = os.environ.get("POPXL_BACKEND", "local")
    print(f"backend {backend}, {os.environ.get('POPXL_WORKERS', '1')} worker(s), "
          f"{cfg.train.replicas} replicas, {len(pairs)} weight tensors"
          f" ({nbytes / 1e6:.1f} MB)")
    ref = statistics.median(times["training step"])
    for name, v in times.items():
        med = statistics.median(v)
        print(f"  {name:<16} median {med * 1e3:8.2f} ms over {len(v):3d}  "
              f"({med / ref:5.2f} x a training step)")


if __name__ == "__main__":
    main()
