"""Data-parallel MNIST with popxl.addons: replicas, gradient accumulation, all-reduce, Adam.

The seed tutorials' network (`Net`, four `Linear` layers with GELU) is trained on
`--replicas` replicas (default 2). Each `session.run` is one optimiser step:

1. `ops.repeat` runs a micro-batch step graph `--accumulation` times (default 4). The step loads a
   micro batch from the host, runs forward, loss and a backward graph made by
   `addons.autodiff_with_accumulation`, which keeps the running mean of every weight gradient in
   accumulator variables.
2. Every accumulated gradient is averaged over the replicas with
   `ops.collectives.replicated_all_reduce_(g, op="mean")`.
3. `AdamOptimizerStep` updates each weight (the same update on every replica, so the replicas'
   weights stay identical), then the accumulators are reset.

`ir.num_host_transfers` is the accumulation count, so a run takes images laid out as
`(accumulation, replicas, micro_batch, 784)`: every replica gets its own slice of each global
batch of `accumulation * replicas * micro_batch` images. A test program with one replica then
evaluates the trained weights on the 10,000 test images.

Runs unchanged on every backend, with the same final weights (bit for bit):

    popxl-run --backend local examples/mnist_data_parallel.py
    popxl-run --backend mpi --workers 2 examples/mnist_data_parallel.py --save-weights w.npz
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from functools import partial

import numpy as np
import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons.optimizers.adam import AdamOptimizerStep
from popxl_launch.data import load_mnist, normalise
from tqdm import tqdm

IMAGE_SIZE = 28 * 28


class Linear(addons.Module):
    def __init__(self, out_features: int, bias: bool = True):
        super().__init__()
        self.out_features = out_features
        self.bias = bias

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input(
            "weight", partial(np.random.normal, 0, 0.02, (x.shape[-1], self.out_features)),
            x.dtype)
        y = x @ w
        if self.bias:
            b = self.add_variable_input("bias", partial(np.zeros, y.shape[-1]), x.dtype)
            y = y + b
        return y


class Net(addons.Module):
    """The seed tutorials' MLP: 784-512-512-512-10, GELU between the layers."""

    def __init__(self, cache: addons.GraphCache | None = None):
        super().__init__(cache=cache)
        self.fc1 = Linear(512)
        self.fc2 = Linear(512)
        self.fc3 = Linear(512)
        self.fc4 = Linear(10)

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        x = x.reshape((-1, IMAGE_SIZE))
        x = ops.gelu(self.fc1(x))
        x = ops.gelu(self.fc2(x))
        x = ops.gelu(self.fc3(x))
        return self.fc4(x)


class MicroBatchStep(addons.Module):
    """One micro batch: load it from the host, forward, loss (sent to the host), and backward
    into the gradient accumulators. Called in `ops.repeat` once per accumulation step."""

    def __init__(self, streams: tuple[popxl.HostToDeviceStream, popxl.HostToDeviceStream],
                 loss_stream: popxl.DeviceToHostStream,
                 fwd: tuple[addons.NamedVariableFactories, addons.GraphWithNamedArgs],
                 bwd: tuple[addons.NamedVariableFactories, addons.GraphWithNamedArgs]):
        super().__init__()
        self.streams = streams
        self.loss_stream = loss_stream
        self.fwd_facts, self.fwd_graph = fwd
        self.bwd_facts, self.bwd_graph = bwd

    @popxl.in_sequence()
    def build(self) -> None:
        img_stream, label_stream = self.streams
        x = ops.host_load(img_stream, "image")
        labels = ops.host_load(label_stream, "labels")
        # The weights and the accumulators live in the main graph; here they are named inputs.
        weights = self.add_variable_inputs("weights", self.fwd_facts)
        accums = self.add_variable_inputs("grads", self.bwd_facts)

        fwd_info = self.fwd_graph.bind(weights).call_with_info(x)
        logits = fwd_info.outputs[0]
        loss, dlogits = addons.ops.cross_entropy_with_grad(logits, labels)
        ops.host_store(self.loss_stream, loss)

        activations = self.bwd_graph.grad_graph_info.inputs_dict(fwd_info)
        self.bwd_graph.bind(accums).call(dlogits, args=activations)


def reset_accumulators(accums: addons.NamedTensors) -> None:
    """Restart the running means of `autodiff_with_accumulation`'s accumulators: with the
    counter at 0 the next accumulation overwrites them; zeroing them as well keeps them tidy."""
    ops.var_updates.accumulator_scale_(accums.mean_accum_counter, 0.0)
    for g in accums.accum.to_dict().values():
        ops.var_updates.accumulator_scale_(g, 0.0)


def init_variables(facts: addons.NamedVariableFactories,
                   retrieval_mode: str = "one_per_group") -> addons.NamedTensors:
    """`facts.init()` (same order, same draws) with a chosen retrieval mode: "all_replicas"
    makes `get_tensors_data` return every replica's copy, shaped `(replicas, *shape)`."""
    if retrieval_mode == "one_per_group":
        return facts.init()
    return addons.NamedTensors.from_dict({
        key: popxl.variable(f.next_data(), f.dtype, key, retrieval_mode=retrieval_mode)
        for key, f in sorted(facts.to_dict().items())})


def optimiser_step(variables: addons.NamedTensors, grads: Mapping[popxl.Tensor, popxl.Tensor],
                   optimiser: addons.Module, learning_rate: float) -> addons.NamedTensors:
    """One Adam update per variable (tutorial 2's pattern; state variables per weight).
    Returns the optimiser state, keyed `<variable key>.<first_order|second_order|step>`."""
    states = {}
    for name, var in variables.named_tensors.items():
        opt_facts, opt_graph = optimiser.create_graph(
            var, var.spec, lr=learning_rate, weight_decay=0.0,
            first_order_dtype=popxl.float32, bias_correction=True)
        state = opt_facts.init(prefix=f"adam.{name}")
        opt_graph.bind(state).call(var, grads[var])
        states.update({f"{name}.{k}": t for k, t in state.named_tensors.items()})
    return addons.NamedTensors.from_dict(states)


class TrainProgram:
    """The training Session and the handles a caller needs."""

    def __init__(self, session: popxl.Session, input_streams: list[popxl.HostToDeviceStream],
                 loss_stream: popxl.DeviceToHostStream, variables: addons.NamedTensors,
                 optimiser_state: addons.NamedTensors, accumulation: int, replicas: int,
                 micro_batch: int):
        self.session = session
        self.input_streams = input_streams
        self.loss_stream = loss_stream
        self.variables = variables
        self.optimiser_state = optimiser_state
        self.accumulation = accumulation
        self.replicas = replicas          # the replicas this process feeds (its instance's)
        self.micro_batch = micro_batch

    @property
    def global_batch(self) -> int:
        return self.accumulation * self.replicas * self.micro_batch

    def host_shape(self, *shape: int) -> tuple[int, ...]:
        """Host layout of one run's stream data: (accumulation, replicas, *shape), with the
        size-1 leading axes left out as popxl expects."""
        lead = tuple(d for d in (self.accumulation, self.replicas) if d > 1)
        return lead + tuple(shape)


def build_train_program(replicas: int | str = 2, accumulation: int = 4, micro_batch: int = 8,
                        lr: float = 1e-3, seed: int = 42,
                        retrieval_mode: str = "one_per_group") -> TrainProgram:
    """Build the data-parallel training program and its Session (not yet attached).

    Args:
        replicas: replication factor R, or "popdist" (the launcher's instances: the
            program's `replicas` is then this instance's share).
        accumulation: micro batches accumulated per optimiser step (= num_host_transfers).
        micro_batch: images per replica per micro batch.
        lr: Adam learning rate.
        seed: NumPy seed for the weight initialisation.
        retrieval_mode: of the weight variables ("all_replicas" to read every replica's copy).
    """
    np.random.seed(seed)
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        img_stream = popxl.h2d_stream((micro_batch, IMAGE_SIZE), popxl.float32, "image")
        label_stream = popxl.h2d_stream((micro_batch,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")

        # Forward graph, and a backward graph that accumulates the mean of every weight grad.
        facts, fwd_graph = Net().create_graph(popxl.TensorSpec((micro_batch, IMAGE_SIZE),
                                                               popxl.float32))
        bwd_facts, bwd_graph = addons.autodiff_with_accumulation(
            fwd_graph, tensors_to_accumulate_grads=fwd_graph.args.tensors)

        variables = init_variables(facts, retrieval_mode)
        accums = bwd_facts.init()

        _, step_graph = MicroBatchStep(
            (img_stream, label_stream), loss_stream, (facts, fwd_graph),
            (bwd_facts, bwd_graph)).create_graph()
        step_inputs = {**step_graph.args.weights.to_mapping(variables),
                       **step_graph.args.grads.to_mapping(accums)}

        with popxl.in_sequence(True):
            # Gradient accumulation: one host transfer (micro batch) per iteration.
            ops.repeat(step_graph.graph, accumulation, inputs_dict=step_inputs)

            # Data parallelism: every replica gets the mean gradient over all replicas.
            grads = variables.to_mapping(accums.accum)
            if ir.replication_factor > 1:
                for g in grads.values():
                    ops.collectives.replicated_all_reduce_(g, op="mean")

            adam_state = optimiser_step(variables, grads, AdamOptimizerStep(cache=True), lr)

            reset_accumulators(accums)

    ir.num_host_transfers = accumulation
    session = popxl.Session(ir, "ipu_hw")
    return TrainProgram(session, [img_stream, label_stream], loss_stream, variables,
                        adam_state, accumulation, ir.instance_replication_factor, micro_batch)


def train_batches(images: np.ndarray, labels: np.ndarray, program: TrainProgram, epoch: int,
                  seed: int = 0):
    """Yield one run's (images, labels) per optimiser step, in the program's host layout.
    Global batch k of the (seeded) shuffled epoch is split as [accumulation, replica, micro]."""
    n = program.global_batch
    order = np.random.default_rng(seed + epoch).permutation(images.shape[0])
    for i in range(0, images.shape[0] - n + 1, n):
        idx = order[i:i + n]
        x = normalise(images[idx]).reshape(program.host_shape(program.micro_batch, IMAGE_SIZE))
        y = labels[idx].reshape(program.host_shape(program.micro_batch))
        yield x, y


def bars_off(progress: bool):
    """tqdm's `disable`: None shows the bars only on a terminal (a log file gets none)."""
    return None if progress else True


def train(program: TrainProgram, epochs: int = 1, limit: int = 0, data_seed: int = 0,
          progress: bool = True, verbose: bool = True) -> list[float]:
    """Train; returns the mean loss of every optimiser step (over its micro batches and
    replicas). `limit` > 0 stops after that many steps."""
    images, labels = load_mnist("train")
    steps_per_epoch = images.shape[0] // program.global_batch
    losses: list[float] = []
    with program.session:
        for epoch in range(1, epochs + 1):
            bar = tqdm(train_batches(images, labels, program, epoch, data_seed),
                       total=steps_per_epoch, disable=bars_off(progress),
                       desc=f"Epoch {epoch}/{epochs}")
            epoch_losses = []
            for x, y in bar:
                out = program.session.run(dict(zip(program.input_streams, [x, y])))
                epoch_losses.append(float(np.mean(out[program.loss_stream])))
                bar.set_postfix_str(f"loss {epoch_losses[-1]:0.4f}")
                if limit and len(losses) + len(epoch_losses) >= limit:
                    break
            losses += epoch_losses
            if verbose:
                print(f"Epoch {epoch}/{epochs}: mean loss {np.mean(epoch_losses):0.4f} "
                      f"({len(epoch_losses)} steps)")
            if limit and len(losses) >= limit:
                break
    return losses


def trained_weights(program: TrainProgram) -> dict[str, np.ndarray]:
    """{variable name: data} of the model weights (copies)."""
    data = program.session.get_tensors_data(program.variables.tensors)
    return {t.name: np.array(a, copy=True) for t, a in data.items()}


def test(weights: Mapping[str, np.ndarray], batch_size: int = 80, max_batches: int = 0,
         progress: bool = True) -> float:
    """Accuracy (%) of `weights` (keyed by variable name) on the MNIST test set, with a
    one-replica inference program."""
    images, labels = load_mnist("test")
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        in_stream = popxl.h2d_stream((batch_size, IMAGE_SIZE), popxl.float32, "image")
        x = ops.host_load(in_stream)
        facts, graph = Net().create_graph(x)
        variables = facts.init()
        (logits,) = graph.bind(variables).call(x)
        out_stream = popxl.d2h_stream(logits.shape, logits.dtype, "outputs")
        ops.host_store(out_stream, logits)
    ir.num_host_transfers = 1
    session = popxl.Session(ir, "ipu_hw")
    session.write_variables_data({v: weights[v.name] for v in variables.tensors})

    n_batches = images.shape[0] // batch_size
    if max_batches:
        n_batches = min(n_batches, max_batches)
    correct = 0
    with session:
        for i in tqdm(range(n_batches), disable=bars_off(progress), desc="Test"):
            sl = slice(i * batch_size, (i + 1) * batch_size)
            data = normalise(images[sl]).reshape(batch_size, IMAGE_SIZE)
            out = session.run({in_stream: data})[out_stream]
            correct += int(np.sum(np.argmax(out, axis=-1) == labels[sl]))
    return 100.0 * correct / (n_batches * batch_size)


def training_parser(description: str, replicas: int) -> argparse.ArgumentParser:
    """The command line shared with the RTS twin (`mnist_rts.py`)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--replicas", type=int, default=replicas,
                   help=f"replication factor (default {replicas})")
    p.add_argument("--accumulation", type=int, default=4,
                   help="gradient accumulation steps per optimiser step (default 4)")
    p.add_argument("--micro-batch", type=int, default=8,
                   help="images per replica per micro batch (default 8)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--limit", type=int, default=0,
                   help="stop after this many optimiser steps (default: all)")
    p.add_argument("--test-batch-size", type=int, default=80)
    p.add_argument("--test-batches", type=int, default=0,
                   help="evaluate only this many test batches (default: the whole test set)")
    p.add_argument("--seed", type=int, default=42, help="weight initialisation seed")
    p.add_argument("--save-weights", metavar="PATH",
                   help="np.savez the final weights, keyed by variable name")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def parse_checked(p: argparse.ArgumentParser, argv, positive=()) -> argparse.Namespace:
    """Parse, requiring the sizes (and `positive` extra options) to be >= 1."""
    args = p.parse_args(argv)
    for name in ("replicas", "accumulation", "micro_batch", "epochs", "test_batch_size",
                 *positive):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def finish(program: TrainProgram, args: argparse.Namespace, t0: float,
           after_training=None) -> int:
    """The end of every MNIST example's `main`: train, (`after_training()`), save the weights
    (`--save-weights`), evaluate on the test set, print the accuracy and the times."""
    t_train = time.perf_counter()
    losses = train(program, args.epochs, args.limit, progress=not args.no_progress)
    t_train = time.perf_counter() - t_train
    if after_training is not None:
        after_training()
    weights = trained_weights(program)
    if args.save_weights:
        np.savez(args.save_weights, **weights)
    acc = test(weights, args.test_batch_size, args.test_batches, progress=not args.no_progress)
    print(f"Accuracy on test set: {acc:0.2f}%")
    print(f"Training time: {t_train:0.1f} s ({1000 * t_train / max(len(losses), 1):0.0f} ms "
          f"per step)")
    print(f"Total time: {time.perf_counter() - t0:0.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = training_parser(__doc__.splitlines()[0], replicas=2)
    args = parse_checked(p, argv)

    t0 = time.perf_counter()
    program = build_train_program(args.replicas, args.accumulation, args.micro_batch, args.lr,
                                  args.seed)
    print(f"Training: {args.replicas} replicas x {args.accumulation} accumulation steps x "
          f"micro batch {args.micro_batch} = {program.global_batch} images per step")
    return finish(program, args, t0)


if __name__ == "__main__":
    sys.exit(main())
