"""MNIST pipelined over two IPUs with popxl.addons, as in Graphcore's pipelining tutorial.

The network of the data-parallel example (784-512-512-512-10, GELU) is split in two: `fc1` runs
on IPU 0, `fc2`..`fc4` and the loss on IPU 1. One `session.run` is one optimiser step over
`--accumulation` micro batches (gradient accumulation), in three pipeline stages:

* stage 0, IPU 0: load the images, forward `fc1`, copy the activations to IPU 1;
* stage 1, IPU 1: load the labels, forward `fc2`..`fc4`, the loss (sent to the host), backward
  through `fc4`..`fc2` into their gradient accumulators, copy the input gradient to IPU 0;
* stage 2, IPU 0: backward through `fc1` into its accumulators, with the activations stage 0
  made for the same micro batch (`stash_and_restore_activations`).

`addons.pipelined_execution(accumulation)` turns the stages into a real pipeline: per stage a
load, compute and store graph, a graph of the IPU copies, and the program of ramp-up cycles, a
`repeat` of `accumulation - 2` main cycles in which all three stages work on different micro
batches, and ramp-down cycles. After the pipeline, Adam updates the weights on the IPU that holds
them (after a replica all-reduce when `--replicas` > 1) and the accumulators are reset.

`--no-pipeline` builds the same ops without the pipeline (`repeat_graph` runs them
`accumulation` times in program order): it trains to the same weights, bit for bit.

    popxl-run --backend local examples/mnist_pipelined.py
    popxl-run --backend mpi --workers 2 examples/mnist_pipelined.py --replicas 2
"""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import numpy as np
import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons.optimizers.adam import AdamOptimizerStep
from popxl_addons.transforms.repeat_graph import repeat_graph

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import mnist_data_parallel as dp

IMAGE_SIZE = dp.IMAGE_SIZE
STAGES = 3


class FirstPart(addons.Module):
    """fc1 and its GELU: pipeline stage 0 (and its backward, stage 2) on IPU 0."""

    def __init__(self):
        super().__init__()
        self.fc1 = dp.Linear(512)

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        return ops.gelu(self.fc1(x))


class SecondPart(addons.Module):
    """fc2..fc4: pipeline stage 1 on IPU 1 (the loss is computed after it)."""

    def __init__(self):
        super().__init__()
        self.fc2 = dp.Linear(512)
        self.fc3 = dp.Linear(512)
        self.fc4 = dp.Linear(10)

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        x = ops.gelu(self.fc2(x))
        x = ops.gelu(self.fc3(x))
        return self.fc4(x)


class NoPipeline:
    """The `--no-pipeline` stand-in for the StageContext: stages are plain program order."""

    @staticmethod
    def stage(i: int):
        return contextlib.nullcontext()

    @staticmethod
    def stash_and_restore_activations(call_info, grad_info):
        return grad_info.inputs_dict(call_info)


def build_train_program(replicas: int = 1, accumulation: int = 8, micro_batch: int = 16,
                        lr: float = 1e-3, seed: int = 42,
                        pipelined: bool = True) -> dp.TrainProgram:
    """Build the pipelined training program and its Session (not yet attached).

    Args:
        replicas: replication factor (each replica is a two-IPU pipeline).
        accumulation: micro batches per optimiser step (the pipeline's steps; at least 6).
        micro_batch: images per replica per micro batch.
        lr: Adam learning rate.
        seed: NumPy seed for the weight initialisation.
        pipelined: False runs the same ops in program order instead (the reference).
    """
    if pipelined and accumulation < 2 * STAGES:
        raise ValueError(f"the pipeline has {STAGES} stages: --accumulation must be at least "
                         f"{2 * STAGES}, got {accumulation}")
    np.random.seed(seed)
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        img_stream = popxl.h2d_stream((micro_batch, IMAGE_SIZE), popxl.float32, "image")
        label_stream = popxl.h2d_stream((micro_batch,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")

        # ----- Graphs of each part and their gradient graphs (accumulating mean grads) -----
        with popxl.ipu(0):
            facts0, fwd0 = FirstPart().create_graph(
                popxl.TensorSpec((micro_batch, IMAGE_SIZE), popxl.float32))
            dfacts0, bwd0 = addons.autodiff_with_accumulation(fwd0, fwd0.args.tensors)
        with popxl.ipu(1):
            facts1, fwd1 = SecondPart().create_graph(
                popxl.TensorSpec((micro_batch, 512), popxl.float32))
            dfacts1, bwd1 = addons.autodiff_with_accumulation(
                fwd1, fwd1.args.tensors, grads_required=[fwd1.graph.inputs[0]])
        vars0, vars1 = facts0.init(), facts1.init()
        accum0, accum1 = dfacts0.init("grad_accum_ipu0"), dfacts1.init("grad_accum_ipu1")

        # ----- The pipeline: one micro batch per stage per cycle -----
        region = (addons.pipelined_execution(accumulation) if pipelined
                  else contextlib.nullcontext(NoPipeline()))
        with region as p:
            with p.stage(0), popxl.ipu(0):
                img = ops.host_load(img_stream, "image")
                fwd0_info = fwd0.bind(vars0).call_with_info(img)
                x = fwd0_info.outputs[0].copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                labels = ops.host_load(label_stream, "labels")
                fwd1_info = fwd1.bind(vars1).call_with_info(x)
                loss, dlogits = addons.ops.cross_entropy_with_grad(fwd1_info.outputs[0], labels)
                ops.host_store(loss_stream, loss)
                (dx,) = bwd1.bind(accum1).call(
                    dlogits, args=bwd1.grad_graph_info.inputs_dict(fwd1_info))
                dx = dx.copy_to_ipu(0)
            with p.stage(2), popxl.ipu(0):
                activations = p.stash_and_restore_activations(fwd0_info, bwd0.grad_graph_info)
                bwd0.bind(accum0).call(dx, args=activations)
        if not pipelined:
            repeat_graph(ir.main_graph, accumulation)

        # ----- Optimiser: on the IPU that holds each weight -----
        optimiser = AdamOptimizerStep(cache=True)
        states = {}
        with popxl.in_sequence(True):
            for ipu, variables, accums in ((0, vars0, accum0), (1, vars1, accum1)):
                with popxl.ipu(ipu):
                    grads = variables.to_mapping(accums.accum)
                    if replicas > 1:
                        for g in grads.values():
                            ops.collectives.replicated_all_reduce_(g, op="mean")
                    states.update(dp.optimiser_step(variables, grads, optimiser, lr).to_dict())
                    dp.reset_accumulators(accums)

    ir.num_host_transfers = accumulation
    session = popxl.Session(ir, "ipu_hw")
    variables = addons.NamedTensors.from_dict({**vars0.to_dict(), **vars1.to_dict()})
    return dp.TrainProgram(session, [img_stream, label_stream], loss_stream, variables,
                           addons.NamedTensors.from_dict(states), accumulation, replicas,
                           micro_batch)


def main(argv: list[str] | None = None) -> int:
    p = dp.training_parser(__doc__.splitlines()[0], replicas=1)
    p.set_defaults(accumulation=8, micro_batch=16)
    p.add_argument("--no-pipeline", action="store_true",
                   help="run the same ops without pipelining (the reference)")
    args = dp.parse_checked(p, argv)

    t0 = time.perf_counter()
    try:
        program = build_train_program(args.replicas, args.accumulation, args.micro_batch,
                                      args.lr, args.seed, pipelined=not args.no_pipeline)
    except ValueError as e:
        p.error(str(e))
    how = "not pipelined" if args.no_pipeline else f"pipelined in {STAGES} stages over 2 IPUs"
    print(f"Training ({how}): {args.replicas} replica(s) x {args.accumulation} micro batches "
          f"x {args.micro_batch} = {program.global_batch} images per step")
    return dp.finish(program, args, t0)

if __name__ == "__main__":
    sys.exit(main())
