"""The main job's training and test programs, built with popxl and popxl_addons Modules only.

Training (one `session.run` = one optimiser step, `num_host_transfers` = accumulation):

1. With `train.rts`, weights of at least `train.rts_threshold` elements are RTS variables in
   remote buffers (one shard per replica), loaded and all-gathered into full weights.
2. `ops.repeat` runs `MicroBatchStep` once per micro batch: host_load images and labels,
   forward, `cross_entropy_with_grad` (gradient scaled by `train.loss_scaling`), the loss to
   the host, and the backward graph of `addons.autodiff_with_accumulation`, which keeps the
   running mean of every weight gradient.
3. Data parallelism: the mean over the replicas (all-reduce, or reduce-scatter into shards).
4. The optimiser (`AdamOptimizerStep`, or `SGDStep` below) updates each weight or shard; with
   `train.rts` its state lives in remote buffers (sharded for sharded weights).
5. The accumulators are reset.

Test: the same network on the same replicas (weights laid out as in training, so the trained
weights copy over replica by replica, shard by shard), each replica classifying its slice of a
test batch; the predicted classes go to the host.
"""
from __future__ import annotations

from functools import partial
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons.optimizers.adam import AdamOptimizerStep
from popxl_addons.layers import Linear

from .config import Config

__all__ = ["MLP", "MicroBatchStep", "SGDStep", "TrainProgram", "TestProgram",
           "build_train_program", "build_test_program", "IMAGE_SIZE", "NUM_CLASSES"]

IMAGE_SIZE = 28 * 28
NUM_CLASSES = 10
_ACTIVATIONS = {"gelu": ops.gelu, "relu": ops.relu}


class MLP(addons.Module):
    """`fc1 .. fcN` `Linear` layers (popxl_addons.layers), the activation between them."""

    def __init__(self, hidden: List[int], activation: str):
        super().__init__()
        self.activation = _ACTIVATIONS[activation]
        self.num_layers = len(hidden) + 1
        for i, width in enumerate([*hidden, NUM_CLASSES]):
            setattr(self, f"fc{i + 1}", Linear(width))

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        for i in range(1, self.num_layers + 1):
            x = getattr(self, f"fc{i}")(x)
            if i < self.num_layers:
                x = self.activation(x)
        return x


class MicroBatchStep(addons.Module):
    """One micro batch: load it, forward, loss (to the host), backward into the gradient
    accumulators. Called in `ops.repeat` once per accumulation step."""

    def __init__(self, inputs: addons.InputStreams, outputs: addons.OutputStreams,
                 fwd: Tuple[addons.NamedVariableFactories, addons.GraphWithNamedArgs],
                 bwd: Tuple[addons.NamedVariableFactories, addons.GraphWithNamedArgs],
                 loss_scaling: float):
        super().__init__()
        self.inputs, self.outputs = inputs, outputs
        self.fwd_facts, self.fwd_graph = fwd
        self.bwd_facts, self.bwd_graph = bwd
        self.loss_scaling = loss_scaling

    @popxl.in_sequence()
    def build(self) -> None:
        x = ops.host_load(self.inputs.images, "images")
        labels = ops.host_load(self.inputs.labels, "labels")
        weights = self.add_variable_inputs("weights", self.fwd_facts)
        accums = self.add_variable_inputs("grads", self.bwd_facts)
        info = self.fwd_graph.bind(weights).call_with_info(x)
        loss, dlogits = addons.ops.cross_entropy_with_grad(info.outputs[0], labels,
                                                           self.loss_scaling)
        ops.host_store(self.outputs.loss, loss)
        self.bwd_graph.bind(accums).call(
            dlogits, args=self.bwd_graph.grad_graph_info.inputs_dict(info))


class SGDStep(addons.Module):
    """One SGD step on `var` (PyTorch's semantics): g = grad / loss_scaling + weight_decay *
    var; with momentum, `velocity` = momentum * velocity + g and var -= lr * velocity, else
    var -= lr * g. The velocity is replica-sharded like `var` when `var` is a shard."""

    @popxl.in_sequence()
    def build(self, var: popxl.TensorByRef, grad: popxl.Tensor, *, lr: float,
              momentum: float = 0.0, weight_decay: float = 0.0, loss_scaling: float = 1.0):
        if loss_scaling != 1:
            grad = grad * (1.0 / loss_scaling)
        if weight_decay:
            grad = grad + var * weight_decay
        if momentum:
            if var.meta_shape:
                shard_over = int(np.prod(var.meta_shape) // np.prod(var.shape))
                velocity = self.add_replica_sharded_variable_input(
                    "velocity", partial(np.zeros, var.meta_shape), var.dtype, by_ref=True,
                    shard_over=shard_over)
            else:
                velocity = self.add_variable_input("velocity", partial(np.zeros, var.shape),
                                                   var.dtype, by_ref=True)
            ops.var_updates.accumulator_scale_(velocity, momentum)
            ops.var_updates.accumulate_(velocity, grad)
            grad = velocity
        ops.scaled_add_(var, grad, b=-lr)


class TrainProgram(NamedTuple):
    """The training TaskSession (its `state`: weights and optimiser state, what checkpoints
    hold) and the handles the job needs."""

    session: addons.TaskSession
    weights: addons.NamedTensors          # the model's variables, by key
    sharded_keys: Tuple[str, ...]
    lead: Tuple[int, ...]                  # host layout's leading axes (accumulation, replicas)


class TestProgram(NamedTuple):
    session: popxl.Session
    weights: addons.NamedTensors
    images: popxl.HostToDeviceStream
    predictions: popxl.DeviceToHostStream
    lead: Tuple[int, ...]


def _lead(*dims: int) -> Tuple[int, ...]:
    return tuple(d for d in dims if d > 1)


def rts_keys(facts: addons.NamedVariableFactories, replicas: int, threshold: int
             ) -> Tuple[str, ...]:
    """Weights with at least `threshold` elements (sharded when `train.rts`)."""
    return tuple(sorted(k for k, f in facts.to_dict().items()
                        if int(np.prod(f.shape)) >= threshold and replicas > 1))


def _weights(facts: addons.NamedVariableFactories, sharded: Tuple[str, ...], empty: bool
             ) -> Tuple[addons.NamedTensors, Optional[addons.remote.NamedRemoteBuffers]]:
    """One variable per factory in sorted key order (the draws of `facts.init()`): RTS
    variables in remote buffers for the `sharded` keys, on-chip variables for the rest."""
    buffers = addons.named_variable_buffers(facts.filter_keys(sharded)) if sharded else None
    out = {}
    for key, f in sorted(facts.to_dict().items()):
        if key in sharded:
            out[key] = f.create_remote_tensor(buffers[key], 0, key, empty=empty)
        else:
            out[key] = f.create_tensor(key, empty=empty)
    return addons.NamedTensors.from_dict(out), buffers


def _full_weights(variables: addons.NamedTensors, buffers) -> Tuple[addons.NamedTensors,
                                                                    addons.NamedTensors]:
    """(full weights for the forward pass, the loaded shards): sharded weights are loaded from
    their buffers and all-gathered."""
    if buffers is None:
        return variables, addons.NamedTensors()
    load_graph, names = addons.load_remote_graph(buffers)
    shards = addons.NamedTensors.pack(names, load_graph.call(0))
    gather_graph, names = addons.rts.all_gather_replica_sharded_graph(shards)
    gathered = addons.NamedTensors.pack(names, gather_graph.bind(shards).call())
    return addons.NamedTensors.from_dict({**variables.to_dict(), **gathered.to_dict()}), shards


def _all_reduce_mean(grads: Dict[str, popxl.Tensor], replicas: int
                     ) -> Dict[str, popxl.Tensor]:
    """The mean of every gradient over the replicas, in one all-reduce of them all
    concatenated (one exchange between workers instead of one per tensor; every element is
    reduced in the same order either way, so the bits are the same)."""
    if replicas == 1 or not grads:
        return dict(grads)
    keys = sorted(grads)
    flat = ops.concat([grads[k].reshape((-1,)) for k in keys], axis=0)
    flat = ops.collectives.replicated_all_reduce(flat, op="mean")
    sizes = [int(np.prod(grads[k].shape)) for k in keys]
    pieces = ops.split(flat, sizes, axis=0)
    return {k: p.reshape(grads[k].shape) for k, p in zip(keys, pieces)}


def _optimiser(cfg: Config) -> Tuple[addons.Module, Dict]:
    t = cfg.train
    if t.optimizer == "adam":
        a = t.adam
        return AdamOptimizerStep(cache=True), dict(
            lr=a.lr, beta1=a.beta1, beta2=a.beta2, eps=a.eps, weight_decay=a.weight_decay,
            first_order_dtype=popxl.float32, bias_correction=True, loss_scaling=t.loss_scaling)
    s = t.sgd
    return SGDStep(cache=True), dict(lr=s.lr, momentum=s.momentum,
                                     weight_decay=s.weight_decay, loss_scaling=t.loss_scaling)


def _optimiser_step(cfg: Config, targets: Dict[str, popxl.Tensor],
                    grads: Dict[str, popxl.Tensor], remote: bool) -> addons.NamedTensors:
    """Update every target (a weight or a shard of one) with its gradient; returns the
    optimiser state variables keyed `<weight key>.<state name>`. With `remote`, the state
    tensors (not the scalar step counters) live in remote buffers, sharded like the weight."""
    module, kwargs = _optimiser(cfg)
    prefix = cfg.train.optimizer
    calls, on_chip, remote_facts = {}, {}, {}
    for key in sorted(targets):
        facts, graph = module.create_graph(targets[key], targets[key].spec, **kwargs)
        for name, f in facts.to_dict().items():
            if remote and f.shape != ():
                remote_facts[f"{key}.{name}"] = f
            else:
                on_chip[f"{key}.{name}"] = f.create_tensor(f"{prefix}.{key}.{name}")
        calls[key] = (graph, facts.keys_flat())
    loaded, remote_vars = {}, addons.NamedTensors()
    if remote_facts:
        rfacts = addons.NamedVariableFactories.from_dict(remote_facts)
        buffers = addons.named_variable_buffers(rfacts, shard_over_dict=False)
        remote_vars = rfacts.init_remote(buffers, prefix=prefix)
        load_graph, names = addons.load_remote_graph(buffers)
        loaded_nt = addons.NamedTensors.pack(names, load_graph.call(0))
        loaded = loaded_nt.to_dict()
    for key, (graph, names) in calls.items():
        state = addons.NamedTensors.from_dict(
            {n: loaded.get(f"{key}.{n}", on_chip.get(f"{key}.{n}")) for n in names})
        graph.bind(state).call(targets[key], grads[key])
    if remote_facts:
        addons.store_remote_graph(buffers).bind(loaded_nt).call(0)
    return addons.NamedTensors.from_dict({**on_chip, **remote_vars.to_dict()})


def build_train_program(cfg: Config) -> TrainProgram:
    """The training program and its TaskSession (not attached)."""
    t = cfg.train
    R, A, mb = t.replicas, t.accumulation, cfg.micro_batch
    np.random.seed(cfg.seed)
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        inputs = addons.InputStreams(images=((mb, IMAGE_SIZE), popxl.float32),
                                     labels=((mb,), popxl.int32))
        outputs = addons.OutputStreams(loss=((), popxl.float32))
        facts, fwd = MLP(cfg.model.hidden, cfg.model.activation).create_graph(
            popxl.TensorSpec((mb, IMAGE_SIZE), popxl.float32))
        bwd_facts, bwd = addons.autodiff_with_accumulation(
            fwd, tensors_to_accumulate_grads=fwd.args.tensors)
        sharded = rts_keys(facts, R, t.rts_threshold) if t.rts else ()
        weights, buffers = _weights(facts, sharded, empty=False)
        accums = bwd_facts.init()
        _, step = MicroBatchStep(inputs, outputs, (facts, fwd), (bwd_facts, bwd),
                                 t.loss_scaling).create_graph()

        with popxl.in_sequence(True):
            full, shards = _full_weights(weights, buffers)
            ops.repeat(step.graph, A, inputs_dict={**step.args.weights.to_mapping(full),
                                                   **step.args.grads.to_mapping(accums)})
            grads = {}
            if sharded:
                full_grads = accums.accum.filter_keys(sharded)
                reduce_graph, names = addons.rts.reduce_replica_sharded_graph(full_grads,
                                                                              op="mean")
                grads.update(zip(names, reduce_graph.bind(full_grads).call()))
            grads.update(_all_reduce_mean({k: g for k, g in accums.accum.to_dict().items()
                                           if k not in sharded}, R))
            targets = {k: shards[k] if k in sharded else weights[k] for k in weights.keys_flat()}
            opt_state = _optimiser_step(cfg, targets, grads, remote=t.rts)
            if sharded:
                addons.store_remote_graph(buffers).bind(shards).call(0)
            # Restart the running means (the counter at 0 makes the next accumulation
            # overwrite them; zeroing keeps the values tidy).
            ops.var_updates.accumulator_scale_(accums.mean_accum_counter, 0.0)
            for g in accums.accum.to_dict().values():
                ops.var_updates.accumulator_scale_(g, 0.0)
    ir.num_host_transfers = A
    # The accumulators are zero between steps, so a checkpoint holds weights and optimiser
    # state only.
    state = addons.NamedTensors.from_dict(
        {**{f"model.{k}": v for k, v in weights.to_dict().items()},
         **{f"optimizer.{k}": v for k, v in opt_state.to_dict().items()}})
    session = addons.TaskSession(inputs, outputs, state, t.max_checkpoints, ir, "ipu_hw")
    return TrainProgram(session, weights, sharded, _lead(A, R))


def build_test_program(cfg: Config, sharded: Tuple[str, ...]) -> TestProgram:
    """The inference program on the training program's replicas, its weights laid out like
    the training weights (`sharded` keys as RTS variables); their values are copied in from
    the training session before each evaluation."""
    R, tb = cfg.train.replicas, cfg.test_micro_batch
    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        images = popxl.h2d_stream((tb, IMAGE_SIZE), popxl.float32, "images")
        x = ops.host_load(images, "images")
        facts, fwd = MLP(cfg.model.hidden, cfg.model.activation).create_graph(x)
        weights, buffers = _weights(facts, sharded, empty=True)
        full, _ = _full_weights(weights, buffers)
        (logits,) = fwd.bind(full).call(x)
        classes = ops.argmax(logits, dim=1)
        predictions = popxl.d2h_stream(classes.shape, classes.dtype, "predictions")
        ops.host_store(predictions, classes)
    session = popxl.Session(ir, "ipu_hw")
    return TestProgram(session, weights, images, predictions, _lead(R))
