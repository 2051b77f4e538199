"""Training-step time of the seed tutorial 2 program (MLP 784-512-512-512-10, batch 8, the
tutorial's hand-written Adam) with float16 first-order state against float32 first-order state,
measured alternately in one run so the ratio survives a busy machine.

Prints per configuration the median step time over rounds (ms, wall clock and this process's
CPU time) and the float16 / float32 ratios.

    python benchmarks/bench_adam_f16.py [--steps 50] [--rounds 5] [--batch-size 8] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from functools import partial
from typing import Dict, List, Tuple, Union

import numpy as np

import popxl
import popxl.ops as ops
import popxl_addons as addons

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from mnist_data_parallel import Net  # noqa: E402  (the seed tutorials' MLP)


class Adam(addons.Module):
    """The seed tutorial's Adam (tutorial 2), unchanged."""

    @popxl.in_sequence()
    def build(self, weight: popxl.TensorByRef, grad: popxl.Tensor, *,
              lr: Union[float, popxl.Tensor], beta1: Union[float, popxl.Tensor] = 0.9,
              beta2: Union[float, popxl.Tensor] = 0.999, eps: Union[float, popxl.Tensor] = 1e-5,
              weight_decay: Union[float, popxl.Tensor] = 0.0,
              first_order_dtype: popxl.dtype = popxl.float16, bias_correction: bool = True):
        first_order = self.add_variable_input("first_order", partial(np.zeros, weight.shape),
                                              first_order_dtype, by_ref=True)
        ops.var_updates.accumulate_moving_average_(first_order, grad, f=beta1)
        second_order = self.add_variable_input("second_order", partial(np.zeros, weight.shape),
                                               popxl.float32, by_ref=True)
        ops.var_updates.accumulate_moving_average_square_(second_order, grad, f=beta2)
        step = None
        if bias_correction:
            step = self.add_variable_input("step", partial(np.zeros, ()), popxl.float32,
                                           by_ref=True)
        dw = ops.var_updates.adam_updater(first_order, second_order, weight=weight,
                                          weight_decay=weight_decay, time_step=step, beta1=beta1,
                                          beta2=beta2, epsilon=eps)
        ops.scaled_add_(weight, dw, b=-lr)


def train_session(batch_size: int, first_order_dtype: popxl.dtype, lr: float = 1e-3
                  ) -> Tuple[popxl.Session, List[popxl.HostToDeviceStream]]:
    """The tutorial's train_program with the given first-order dtype."""
    np.random.seed(0)
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        img_stream = popxl.h2d_stream((batch_size, 28, 28), popxl.float32, "image")
        img_t = ops.host_load(img_stream)
        label_stream = popxl.h2d_stream((batch_size,), popxl.int32, "labels")
        labels = ops.host_load(label_stream, "labels")
        facts, fwd_graph = Net().create_graph(img_t)
        bwd_graph = addons.autodiff(fwd_graph)
        variables = facts.init()
        fwd_info = fwd_graph.bind(variables).call_with_info(img_t)
        loss, dx = addons.ops.cross_entropy_with_grad(fwd_info.outputs[0], labels)
        ops.host_store(popxl.d2h_stream(loss.shape, loss.dtype, "loss"), loss)
        activations = bwd_graph.grad_graph_info.inputs_dict(fwd_info)
        bwd_info = bwd_graph.call_with_info(dx, args=activations)
        grads: Dict = bwd_graph.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(fwd_info,
                                                                                   bwd_info)
        optimiser = Adam(cache=True)
        for var in variables.named_tensors.values():
            opt_facts, opt_graph = optimiser.create_graph(
                var, var.spec, lr=lr, weight_decay=0.0, bias_correction=False,
                first_order_dtype=first_order_dtype)
            opt_graph.bind(opt_facts.init()).call(var, grads[var])
    return popxl.Session(ir, "ipu_hw"), [img_stream, label_stream]


def time_steps(session: popxl.Session, inputs: Dict, steps: int) -> Tuple[float, float]:
    """(wall, CPU) seconds per step over `steps` runs. The CPU time of this process is the
    steadier figure on a shared machine (it excludes time spent waiting for a core)."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        session.run(inputs)
    return (time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the float16 steps and print the top functions")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    configs = {"float32": popxl.float32, "float16": popxl.float16}
    sessions = {}
    for name, dt in configs.items():
        sess, (img, lab) = train_session(args.batch_size, dt)
        inputs = {img: rng.random((args.batch_size, 28, 28), np.float32),
                  lab: rng.integers(0, 10, args.batch_size).astype(np.int32)}
        sess.__enter__()
        time_steps(sess, inputs, 3)                              # warm-up
        sessions[name] = (sess, inputs)
    if args.profile:
        sess, inputs = sessions["float16"]
        prof = cProfile.Profile()
        prof.enable()
        time_steps(sess, inputs, args.steps)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    times: Dict[str, List[Tuple[float, float]]] = {n: [] for n in configs}
    for _ in range(args.rounds):
        for name, (sess, inputs) in sessions.items():           # alternate: same machine load
            times[name].append(time_steps(sess, inputs, args.steps))
    wall = {n: statistics.median(t[0] for t in v) for n, v in times.items()}
    cpu = {n: statistics.median(t[1] for t in v) for n, v in times.items()}
    print(f"Adam step, MLP 784-512-512-512-10, batch {args.batch_size}, median of "
          f"{args.rounds} rounds x {args.steps} steps:")
    for name in configs:
        print(f"  first_order {name}: {wall[name] * 1e3:7.2f} ms/step wall, "
              f"{cpu[name] * 1e3:7.2f} ms/step CPU")
    print(f"  float16 / float32 = {wall['float16'] / wall['float32']:.2f}x wall, "
          f"{cpu['float16'] / cpu['float32']:.2f}x CPU")
    for sess, _ in sessions.values():
        sess.__exit__(None, None, None)


if __name__ == "__main__":
    main()
