"""Data-parallel MNIST as Graphcore's applications write it: one process per popdist instance.

The program of `examples/mnist_data_parallel.py` (its pieces are imported from there), with the
replication and the data handled the popdist way:

* `popxl.Ir(replication="popdist" if popdist.isPopdistEnvSet() else args.replicas)`: under a
  multi-instance launcher the global replica count comes from the launcher, and this process
  holds (and feeds) only its own `ir.instance_replication_factor` replicas;
* each global batch of `accumulation * R * micro_batch` images (the same seeded order in every
  instance) is sharded by replica offset: this instance takes replicas
  `[popdist.getReplicaIndexOffset(), + local)` of it;
* the weights are read by every instance (`get_tensors_data` is collective across instances)
  and only instance 0 saves them, logs, and tests the trained model.

The same script gives the same losses and weights, bit for bit, however it is launched:

    python examples/mnist_popdist.py --replicas 4                # one process, 4 replicas
    poprun --num-instances 2 --num-replicas 4 python examples/mnist_popdist.py
    mpiexec -n 4 python examples/mnist_popdist.py                # 4 instances x 1 replica
    popxl-run --backend ray --instances 2 --replicas 4 examples/mnist_popdist.py

`--save-losses DIR` writes each instance's losses as `DIR/losses_<first>-<last>.npy` (steps x
accumulation x its replicas), named by the global replicas they belong to.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import popdist

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import mnist_data_parallel as dp  # noqa: E402
from popxl_launch.data import load_mnist, normalise  # noqa: E402

IMAGE_SIZE = dp.IMAGE_SIZE


def sharded_batches(images: np.ndarray, labels: np.ndarray, program: dp.TrainProgram,
                    total_replicas: int, offset: int, epoch: int, seed: int = 0):
    """This instance's part of each global batch: the global batch k of the seeded shuffled
    epoch is laid out `[accumulation, replica, micro]` over all replicas, and the replicas
    `[offset, offset + local)` are taken (the layout of `mnist_data_parallel.train_batches`)."""
    acc, local, micro = program.accumulation, program.replicas, program.micro_batch
    n = acc * total_replicas * micro
    order = np.random.default_rng(seed + epoch).permutation(images.shape[0])
    for i in range(0, images.shape[0] - n + 1, n):
        idx = order[i:i + n].reshape(acc, total_replicas, micro)[:, offset:offset + local]
        x = normalise(images[idx]).reshape(program.host_shape(micro, IMAGE_SIZE))
        y = labels[idx].reshape(program.host_shape(micro))
        yield x, y


def main(argv: list[str] | None = None) -> int:
    p = dp.training_parser(__doc__.splitlines()[0], replicas=4)
    p.add_argument("--save-losses", metavar="DIR",
                   help="np.save each instance's losses into DIR (see the module doc)")
    args = dp.parse_checked(p, argv)

    t0 = time.perf_counter()
    distributed = popdist.isPopdistEnvSet()
    program = dp.build_train_program("popdist" if distributed else args.replicas,
                                     args.accumulation, args.micro_batch, args.lr, args.seed)
    ir = program.session.ir
    total, local = ir.replication_factor, ir.instance_replication_factor
    offset = popdist.getReplicaIndexOffset() if distributed else 0
    instance = popdist.getInstanceIndex()
    lead = instance == 0
    if lead:
        print(f"Training: {total} replicas ({popdist.getNumInstances()} instance(s) x {local}) "
              f"x {args.accumulation} accumulation steps x micro batch {args.micro_batch}")

    images, labels = load_mnist("train")
    losses = []
    with program.session:
        for epoch in range(1, args.epochs + 1):
            for x, y in sharded_batches(images, labels, program, total, offset, epoch):
                out = program.session.run(dict(zip(program.input_streams, [x, y])))
                losses.append(out[program.loss_stream].reshape(args.accumulation, local))
                if lead:
                    print(f"step {len(losses)}: loss of instance 0's replicas "
                          f"{float(np.mean(losses[-1])):0.4f}", flush=True)
                if args.limit and len(losses) >= args.limit:
                    break
            if args.limit and len(losses) >= args.limit:
                break
    weights = dp.trained_weights(program)       # every instance: collective across instances
    if args.save_losses:
        os.makedirs(args.save_losses, exist_ok=True)
        np.save(os.path.join(args.save_losses, f"losses_{offset}-{offset + local - 1}.npy"),
                np.stack(losses))
    if lead:
        if args.save_weights:
            np.savez(args.save_weights, **weights)
        acc = dp.test(weights, args.test_batch_size, args.test_batches, progress=False)
        print(f"Accuracy on test set: {acc:0.2f}%")
        print(f"Total time: {time.perf_counter() - t0:0.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
