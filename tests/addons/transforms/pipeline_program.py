"""A small two-IPU training program written as Graphcore's pipelining tutorial is (fwd of layer 0
on IPU 0, fwd+loss+bwd of layer 1 on IPU 1, bwd of layer 0 on IPU 0 with stashed activations),
built either pipelined or plain (the same ops run `steps` times in program order)."""
from __future__ import annotations

import contextlib
from functools import partial
from typing import NamedTuple

import numpy as np

import popxl
import popxl.ops as ops
import popxl_addons as addons
from popxl_addons.transforms.repeat_graph import repeat_graph

IN, HIDDEN, CLASSES, BATCH = 6, 8, 3, 4


class Dense(addons.Module):
    def __init__(self, out: int, act: bool):
        super().__init__()
        self.out = out
        self.act = act

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input("weight", partial(np.random.normal, 0, 0.5,
                                                      (x.shape[-1], self.out)), x.dtype)
        b = self.add_variable_input("bias", partial(np.random.normal, 0, 0.1, (self.out,)),
                                    x.dtype)
        y = x @ w + b
        return ops.gelu(y) if self.act else y


class PlainStages:
    """Stand-in for the StageContext: no stages, activations used directly."""

    @staticmethod
    def stage(i):
        return contextlib.nullcontext()

    @staticmethod
    def stash_and_restore_tensor(t, from_stage=None):
        return t

    @staticmethod
    def stash_and_restore_activations(call_info, grad_info):
        return grad_info.inputs_dict(call_info)


class Program(NamedTuple):
    ir: popxl.Ir
    x: popxl.HostToDeviceStream
    labels: popxl.HostToDeviceStream
    loss: popxl.DeviceToHostStream
    hidden: popxl.DeviceToHostStream
    state: addons.NamedTensors


def build(steps: int, pipelined: bool, seed: int = 0, explicit_stash: bool = False) -> Program:
    np.random.seed(seed)
    ir = popxl.Ir()
    with ir.main_graph:
        x_stream = popxl.h2d_stream((BATCH, IN), popxl.float32, "x")
        y_stream = popxl.h2d_stream((BATCH,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        hidden_stream = popxl.d2h_stream((BATCH, HIDDEN), popxl.float32, "hidden")
        with popxl.ipu(0):
            facts0, fwd0 = Dense(HIDDEN, True).create_graph(
                popxl.TensorSpec((BATCH, IN), popxl.float32))
            dfacts0, bwd0 = addons.autodiff_with_accumulation(fwd0, fwd0.args.tensors)
        with popxl.ipu(1):
            facts1, fwd1 = Dense(CLASSES, False).create_graph(
                popxl.TensorSpec((BATCH, HIDDEN), popxl.float32))
            dfacts1, bwd1 = addons.autodiff_with_accumulation(
                fwd1, fwd1.args.tensors, grads_required=[fwd1.graph.inputs[0]])
        w0, w1 = facts0.init("layer0"), facts1.init("layer1")
        a0, a1 = dfacts0.init("grad0"), dfacts1.init("grad1")

        region = addons.pipelined_execution(steps) if pipelined else contextlib.nullcontext(
            PlainStages())
        with region as p:
            with p.stage(0), popxl.ipu(0):
                x = ops.host_load(x_stream, "x")
                info0 = fwd0.bind(w0).call_with_info(x)
                h = info0.outputs[0].copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                labels = ops.host_load(y_stream, "labels")
                ops.host_store(hidden_stream, h)
                info1 = fwd1.bind(w1).call_with_info(h)
                loss, dlogits = addons.ops.cross_entropy_with_grad(info1.outputs[0], labels)
                ops.host_store(loss_stream, loss)
                (dh,) = bwd1.bind(a1).call(dlogits, args=bwd1.grad_graph_info.inputs_dict(info1))
                dh = dh.copy_to_ipu(0)
            with p.stage(2), popxl.ipu(0):
                if explicit_stash:
                    acts = bwd0.grad_graph_info.inputs_dict(info0)
                    acts = {k: (p.stash_and_restore_tensor(v) if v.id != w0.weight.id and
                                v.id != w0.bias.id else v) for k, v in acts.items()}
                else:
                    acts = p.stash_and_restore_activations(info0, bwd0.grad_graph_info)
                bwd0.bind(a0).call(dh, args=acts)
        if not pipelined:
            repeat_graph(ir.main_graph, steps)
    ir.num_host_transfers = steps
    state = addons.NamedTensors.from_dict({"layer0": w0, "layer1": w1, "grad0": a0,
                                           "grad1": a1})
    return Program(ir, x_stream, y_stream, loss_stream, hidden_stream, state)


def data(steps: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(steps, BATCH, IN)).astype(np.float32),
            rng.integers(0, CLASSES, size=(steps, BATCH)).astype(np.int32))


def run(prog: Program, xs, ys, runs: int = 1):
    """Run `runs` times; returns (outputs of every run, final state {key: array})."""
    outs = []
    with popxl.Session(prog.ir, "ipu_hw") as s:
        for _ in range(runs):
            res = s.run({prog.x: xs, prog.labels: ys})
            outs.append((res[prog.loss].copy(), res[prog.hidden].copy()))
        data = s.get_tensors_data(prog.state.tensors)
    return outs, {k: np.array(data[t]) for k, t in prog.state.to_dict().items()}
