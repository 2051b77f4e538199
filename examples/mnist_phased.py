"""MNIST in phased execution with popxl.addons, as Graphcore's large applications (BERT, GPT)
train: remote RTS weights and Adam state, batch serialisation, recomputation, layer phases.

The network of the data-parallel example (784-512-512-512-10, GELU) is trained on `--replicas`
replicas (default 2). Nothing of the model stays on chip between phases: every weight, its Adam
moments and its gradient live in remote buffers, sharded over the replicas (RTS: each replica
holds half). Each `session.run` is one optimiser step made of phases; each phase loads what it
needs (weight shards, all-gathered into full weights on the IO tiles), runs a batch-serialised
graph over the `--accumulation` micro batches, and stores its results:

1. embedding phase: `fc1` over the images streamed from the host; activations to a remote
   buffer (row 0);
2. layer phases: `fc2`, `fc3` are the same graph run by `ops.repeat` over a layer counter (a
   by-ref loop-carried tensor) that picks the weights' remote entry and the activation rows
   (row n in, row n + 1 out);
3. head phase: `fc4`, the loss (to the host) and its gradient, backward through `fc4`;
4. layer backward phases (counter running down) and the embedding backward phase: each
   recomputes its forward (`recompute_graph`) from the stored input row, accumulates the mean
   weight gradient over the micro batches, reduce-scatters it (mean over replicas) into a
   gradient shard in a remote buffer, and writes its input gradient row;
5. the global gradient norm over every shard (sum of squares, all-reduced);
6. optimiser phases: Adam on the weight shards with the moments loaded from and stored to
   remote buffers, gradients clipped to a global norm of `--clip-norm`.

`--no-phases` trains the same model the plain way (the data-parallel example's program: weights
and Adam state on chip, gradient accumulation by `ops.repeat`, all-reduce, the same clipping
and Adam) from the same initial weights. Without clipping (`--clip-norm 0`) both give the same
weights bit for bit; with it the global norm is summed in another order (per shard, then across
replicas), so the weights agree to float32 rounding.

    popxl-run --backend local examples/mnist_phased.py
    popxl-run --backend mpi --workers 2 examples/mnist_phased.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Dict, Iterable, List

import numpy as np
import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons.optimizers.adam import AdamOptimizerStep

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import mnist_data_parallel as dp

IMAGE_SIZE = dp.IMAGE_SIZE
HIDDEN = 512
LAYERS = ("fc2", "fc3")          # the repeated layers
ADAM = dict(weight_decay=0.0, first_order_dtype=popxl.float32, bias_correction=True)


def initial_weights(seed: int) -> Dict[str, np.ndarray]:
    """The starting weights of both programs: N(0, 0.02) matrices, zero biases."""
    rng = np.random.default_rng(seed)
    shapes = {"fc1": (IMAGE_SIZE, HIDDEN), "fc2": (HIDDEN, HIDDEN), "fc3": (HIDDEN, HIDDEN),
              "fc4": (HIDDEN, 10)}
    out = {}
    for name, shape in shapes.items():
        out[f"{name}.weight"] = rng.normal(0, 0.02, shape).astype(np.float32)
        out[f"{name}.bias"] = np.zeros(shape[1], np.float32)
    return out


class Layer(addons.Module):
    """x @ weight + bias (then GELU), its variables drawn from iterables of initial values."""

    def __init__(self, weights: Iterable[np.ndarray], biases: Iterable[np.ndarray],
                 gelu: bool = True):
        super().__init__()
        self.weights, self.biases, self.gelu = iter(weights), iter(biases), gelu

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        w = self.add_variable_input("weight", self.weights, popxl.float32)
        b = self.add_variable_input("bias", self.biases, popxl.float32)
        y = x @ w + b
        return ops.gelu(y) if self.gelu else y


class HeadStep(addons.Module):
    """The head of one micro batch: fc4, the loss and its gradient, backward through fc4."""

    def __init__(self, fwd_facts: addons.NamedVariableFactories, fwd: addons.GraphWithNamedArgs,
                 bwd_facts: addons.NamedVariableFactories, bwd: addons.GraphWithNamedArgs):
        super().__init__()
        self.fwd_facts, self.fwd, self.bwd_facts, self.bwd = fwd_facts, fwd, bwd_facts, bwd

    def build(self, x: popxl.Tensor, labels: popxl.Tensor):
        weights = self.add_variable_inputs("weights", self.fwd_facts)
        accums = self.add_variable_inputs("grads", self.bwd_facts)
        info = self.fwd.bind(weights).call_with_info(x)
        loss, dlogits = addons.ops.cross_entropy_with_grad(info.outputs[0], labels)
        (dx,) = self.bwd.bind(accums).call(dlogits,
                                           args=self.bwd.grad_graph_info.inputs_dict(info))
        return loss, dx


class Group:
    """One phase group (embedding, layers or head): its graphs and its remote buffers (weights,
    gradients, Adam moments: one entry per layer, RTS-sharded over the replicas)."""

    def __init__(self, names: List[str], facts: addons.NamedVariableFactories):
        self.names, self.facts = names, facts
        entries = len(names)
        self.weights = addons.named_variable_buffers(facts, entries)
        self.grads = addons.named_variable_buffers(facts, entries)
        self.variables = addons.NamedTensors.from_dict({
            name: facts.init_remote(self.weights, i, prefix=name)
            for i, name in enumerate(names)})

    def load_full_weights(self, index) -> tuple[addons.NamedTensors, addons.NamedTensors]:
        """(shards loaded from entry `index`, the all-gathered full weights)."""
        load, names = addons.load_remote_graph(self.weights, use_io_tiles=True)
        shards = addons.NamedTensors.pack(names, load.call(index))
        gather, names = addons.rts.all_gather_replica_sharded_graph(shards, use_io_tiles=True)
        return shards, addons.NamedTensors.pack(names, gather.bind(shards).call())

    def store_mean_grads(self, accums: addons.NamedTensors, index) -> None:
        """Reduce-scatter the accumulated gradients (mean over replicas), store the shards."""
        reduce, names = addons.rts.reduce_replica_sharded_graph(accums, op="mean")
        shards = addons.NamedTensors.pack(names, reduce.bind(accums).call())
        addons.store_remote_graph(self.grads, use_io_tiles=True).bind(shards).call(index)


def _counter(start: int) -> popxl.Tensor:
    return ops.init((), popxl.int32, "layer", "zero") + start


def build_phased_program(replicas: int = 2, accumulation: int = 4, micro_batch: int = 8,
                         lr: float = 1e-3, seed: int = 42,
                         clip_norm: float = 1.0) -> dp.TrainProgram:
    """Build the phased training program and its Session (not yet attached). See the module
    docstring; `clip_norm` <= 0 turns clipping off."""
    if replicas < 2:
        raise ValueError(f"the phased program shards over the replicas: --replicas must be at "
                         f"least 2, got {replicas}")
    init = initial_weights(seed)
    steps, n_layers = accumulation, len(LAYERS)
    ir = popxl.Ir(replication=replicas)
    ir._pb_ir.getSessionOptions().numIOTiles = 32
    x_spec = popxl.TensorSpec((micro_batch, IMAGE_SIZE), popxl.float32)
    h_spec = popxl.TensorSpec((micro_batch, HIDDEN), popxl.float32)
    with ir.main_graph:
        img_stream = popxl.h2d_stream(x_spec.shape, popxl.float32, "image")
        label_stream = popxl.h2d_stream((micro_batch,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")

        # ----- Graphs: forward, recomputing gradient graphs (mean-accumulating) -----
        def layer_graphs(layer: Layer, spec, input_grad: bool):
            facts, fwd = layer.create_graph(spec)
            required = [fwd.graph.inputs[0]] if input_grad else []
            dfacts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors,
                                                            grads_required=required)
            return facts, fwd, dfacts, addons.recompute_graph(bwd)

        embed = layer_graphs(Layer([init["fc1.weight"]], [init["fc1.bias"]]), x_spec, False)
        layer = layer_graphs(Layer([init[f"{n}.weight"] for n in LAYERS],
                                   [init[f"{n}.bias"] for n in LAYERS]), h_spec, True)
        head_facts, head_fwd = Layer([init["fc4.weight"]], [init["fc4.bias"]],
                                     gelu=False).create_graph(h_spec)
        head_dfacts, head_bwd = addons.autodiff_with_accumulation(
            head_fwd, head_fwd.args.tensors, grads_required=[head_fwd.graph.inputs[0]])
        head_step = HeadStep(head_facts, head_fwd, head_dfacts, head_bwd)
        step_facts, step_graph = head_step.create_graph(
            h_spec, popxl.TensorSpec((micro_batch,), popxl.int32))

        # ----- Remote buffers: weights, gradients, moments; activations and their grads -----
        groups = {"embed": Group(["fc1"], embed[0]), "layers": Group(list(LAYERS), layer[0]),
                  "head": Group(["fc4"], head_facts)}
        acts = addons.batch_serial_buffer(h_spec, steps, n_layers + 1)
        dacts = addons.batch_serial_buffer(h_spec, steps, n_layers + 1)

        # ----- Batch serialisation of every phase's graphs -----
        def serialise(graphs, loads, stores, rows=1):
            facts, fwd, dfacts, bwd = graphs
            fwd_in, fwd_out = fwd.graph.inputs[0], fwd.graph.outputs[0]
            dy = bwd.graph.inputs[0]
            handles = {fwd_in: loads[0], dy: loads[1]}
            buffers = {fwd_out: stores[0]}
            if len(bwd.graph.outputs) == 1:             # the input gradient
                buffers[bwd.graph.outputs[0]] = stores[1]
            return addons.batch_serialise_fwd_and_grad(fwd, bwd, fwd.args, steps, handles, {},
                                                       buffers, rows=rows)

        embed_bs = serialise(embed, (img_stream, addons.RemoteHandle(dacts, 0)),
                             (addons.RemoteHandle(acts, 0), None))
        layer_bs = serialise(layer, (addons.RemoteHandle(acts, 0), addons.RemoteHandle(dacts, 1)),
                             (addons.RemoteHandle(acts, 1), addons.RemoteHandle(dacts, 0)),
                             rows=n_layers)
        x_t, labels_t = step_graph.graph.inputs[:2]
        loss_t, dx_t = step_graph.graph.outputs
        head_bs = addons.batch_serialise(
            step_graph, steps, {x_t: addons.RemoteHandle(acts, n_layers), labels_t: label_stream},
            {loss_t: loss_stream}, {dx_t: addons.RemoteHandle(dacts, n_layers)})

        # ----- Phases -----
        def forward_phase(group: Group, bs, index) -> None:
            _, weights = group.load_full_weights(index)
            bs.graph.bind(weights).call(index)

        def backward_phase(group: Group, dfacts, bs, index, nested: bool = False) -> None:
            _, weights = group.load_full_weights(index)
            accums = dfacts.init_zero()
            if nested:       # the head step's args: weights.*, grads.*
                args = addons.NamedTensors(weights=weights, grads=accums)
            else:            # batch_serialise_fwd_and_grad put the weights beside the grads
                args = accums.copy()
                args.update(weights)
            bs.graph.bind(args).call(index)
            group.store_mean_grads(accums.accum, index)

        def layers_phase(body, start: int, step: int) -> None:
            """`body(counter)` over the layers by ops.repeat; the counter is by-ref carried."""
            def phase(counter: popxl.TensorByRef):
                body(counter)
                counter += step
            graph = ir.create_graph(phase, popxl.TensorSpec((), popxl.int32))
            ops.repeat(graph, n_layers, _counter(start))

        adam_step = popxl.variable(np.float32(0), popxl.float32, "adam.step")
        with popxl.in_sequence(True):
            forward_phase(groups["embed"], embed_bs[0], 0)
            layers_phase(lambda n: forward_phase(groups["layers"], layer_bs[0], n), 0, 1)
            backward_phase(groups["head"], step_facts.grads, head_bs, 0, nested=True)
            layers_phase(lambda n: backward_phase(groups["layers"], layer[2], layer_bs[1], n),
                         n_layers - 1, -1)
            backward_phase(groups["embed"], embed[2], embed_bs[1], 0)

            norm = global_norm(groups) if clip_norm > 0 else None
            moments = optimiser_phases(ir, groups, norm, adam_step, lr, clip_norm)
            ops.var_updates.accumulate_(adam_step, popxl.constant(1.0, popxl.float32))

    ir.num_host_transfers = accumulation
    session = popxl.Session(ir, "ipu_hw")
    variables = addons.NamedTensors.from_dict(
        {k: v for g in groups.values() for k, v in g.variables.to_dict().items()})
    state = addons.NamedTensors.from_dict({**moments.to_dict(), "step": adam_step})
    return dp.TrainProgram(session, [img_stream, label_stream], loss_stream, variables, state,
                           accumulation, replicas, micro_batch)


def global_norm(groups: Dict[str, Group]) -> popxl.Tensor:
    """sqrt of the sum of squares of every gradient: per shard, then all-reduced."""
    total = None
    for group in groups.values():
        load, names = addons.load_remote_graph(group.grads)
        for i in range(len(group.names)):
            for shard in load.call(i):
                sq = ops.sumsquare(shard)
                total = sq if total is None else total + sq
    return ops.sqrt(ops.collectives.replicated_all_reduce(total, op="add"))


def optimiser_phases(ir: popxl.Ir, groups: Dict[str, Group], norm, adam_step, lr: float,
                     clip_norm: float) -> addons.NamedTensors:
    """Adam on every weight shard, its moments in remote buffers; the layers by a repeat over a
    layer counter. Returns the moment variables."""
    optimiser = AdamOptimizerStep(cache=True)
    clip = dict(global_norm=popxl.TensorSpec((), popxl.float32) if norm is not None else None,
                global_norm_max=clip_norm if norm is not None else None)
    all_moments = {}
    for group in groups.values():
        shard_specs = {k: popxl.TensorSpec(b.tensor_shape, b.tensor_dtype, b.meta_shape)
                       for k, b in group.weights.to_dict().items()}
        graphs, moment_facts = {}, {}
        for k, spec in shard_specs.items():
            facts, graph = optimiser.create_graph(spec, spec, lr=lr, **clip, **ADAM)
            graphs[k] = graph
            moment_facts.update({f"{k}.{m}": facts.get(m)
                                 for m in ("first_order", "second_order")})
        moment_facts = addons.NamedVariableFactories.from_dict(moment_facts)
        buffers = addons.named_variable_buffers(moment_facts, len(group.names))
        for i, name in enumerate(group.names):
            created = moment_facts.init_remote(buffers, i, prefix=f"adam.{name}")
            all_moments.update({f"{name}.{k}": v for k, v in created.to_dict().items()})

        def update(index, step: popxl.Tensor, gnorm) -> None:
            load, names = addons.load_remote_graph(group.weights, use_io_tiles=True)
            shards = addons.NamedTensors.pack(names, load.call(index))
            load, names = addons.load_remote_graph(group.grads, use_io_tiles=True)
            grads = addons.NamedTensors.pack(names, load.call(index))
            load, names = addons.load_remote_graph(buffers, use_io_tiles=True)
            moments = addons.NamedTensors.pack(names, load.call(index))
            for k, graph in graphs.items():
                state = addons.NamedTensors.from_dict({
                    "first_order": moments[f"{k}.first_order"],
                    "second_order": moments[f"{k}.second_order"], "step": step + 0.0})
                extra = (gnorm,) if gnorm is not None else ()
                graph.bind(state).call(shards[k], grads[k], *extra)
            addons.store_remote_graph(group.weights, use_io_tiles=True).bind(shards).call(index)
            addons.store_remote_graph(buffers, use_io_tiles=True).bind(moments).call(index)

        if len(group.names) == 1:
            update(0, adam_step, norm)
        else:
            def phase(counter: popxl.TensorByRef, step: popxl.Tensor, *gnorm):
                update(counter, step, gnorm[0] if gnorm else None)
                counter += 1
            specs = [popxl.TensorSpec((), popxl.float32)] * (norm is not None)
            graph = ir.create_graph(phase, popxl.TensorSpec((), popxl.int32),
                                    popxl.TensorSpec((), popxl.float32), *specs)
            ops.repeat(graph, len(group.names), _counter(0), adam_step,
                       *([norm] if norm is not None else []))
    return addons.NamedTensors.from_dict(all_moments)


class Net(addons.Module):
    """The same network in one graph (for `--no-phases`)."""

    def __init__(self, init: Dict[str, np.ndarray]):
        super().__init__()
        for name in ("fc1", *LAYERS, "fc4"):
            setattr(self, name, Layer([init[f"{name}.weight"]], [init[f"{name}.bias"]],
                                      gelu=name != "fc4"))

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        for name in ("fc1", *LAYERS, "fc4"):
            x = getattr(self, name)(x)
        return x


def build_plain_program(replicas: int = 2, accumulation: int = 4, micro_batch: int = 8,
                        lr: float = 1e-3, seed: int = 42,
                        clip_norm: float = 1.0) -> dp.TrainProgram:
    """The same model without phases: the data-parallel example's program (weights and Adam
    state on chip) with the same initial weights, clipping and Adam settings."""
    init = initial_weights(seed)
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        img_stream = popxl.h2d_stream((micro_batch, IMAGE_SIZE), popxl.float32, "image")
        label_stream = popxl.h2d_stream((micro_batch,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        facts, fwd = Net(init).create_graph(popxl.TensorSpec((micro_batch, IMAGE_SIZE),
                                                             popxl.float32))
        bwd_facts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        variables, accums = facts.init(), bwd_facts.init()
        _, step = dp.MicroBatchStep((img_stream, label_stream), loss_stream, (facts, fwd),
                                    (bwd_facts, bwd)).create_graph()
        with popxl.in_sequence(True):
            ops.repeat(step.graph, accumulation,
                       inputs_dict={**step.args.weights.to_mapping(variables),
                                    **step.args.grads.to_mapping(accums)})
            grads = variables.to_mapping(accums.accum)
            if replicas > 1:
                for g in grads.values():
                    ops.collectives.replicated_all_reduce_(g, op="mean")
            norm = None
            if clip_norm > 0:
                total = None
                for g in grads.values():
                    sq = ops.sumsquare(g)
                    total = sq if total is None else total + sq
                norm = ops.sqrt(total)
            optimiser = AdamOptimizerStep(cache=True)
            states = {}
            for name, var in variables.named_tensors.items():
                clip = dict(global_norm=popxl.TensorSpec((), popxl.float32),
                            global_norm_max=clip_norm) if norm is not None else {}
                opt_facts, opt = optimiser.create_graph(var, var.spec, lr=lr, **clip, **ADAM)
                state = opt_facts.init(prefix=f"adam.{name}")
                opt.bind(state).call(var, grads[var], *([norm] if norm is not None else []))
                states.update({f"{name}.{k}": t for k, t in state.named_tensors.items()})
            dp.reset_accumulators(accums)
    ir.num_host_transfers = accumulation
    session = popxl.Session(ir, "ipu_hw")
    return dp.TrainProgram(session, [img_stream, label_stream], loss_stream, variables,
                           addons.NamedTensors.from_dict(states), accumulation, replicas,
                           micro_batch)


def main(argv: list[str] | None = None) -> int:
    p = dp.training_parser(__doc__.splitlines()[0], replicas=2)
    p.add_argument("--clip-norm", type=float, default=1.0,
                   help="clip gradients to this global norm (<= 0: no clipping; default 1)")
    p.add_argument("--no-phases", action="store_true",
                   help="train the same model without phases (on-chip weights, the reference)")
    args = dp.parse_checked(p, argv)

    t0 = time.perf_counter()
    build = build_plain_program if args.no_phases else build_phased_program
    try:
        program = build(args.replicas, args.accumulation, args.micro_batch, args.lr, args.seed,
                        args.clip_norm)
    except ValueError as e:
        p.error(str(e))
    how = ("without phases (weights on chip)" if args.no_phases else
           "in phases (remote RTS weights and Adam state, batch serialisation)")
    print(f"Training {how}: {args.replicas} replicas x {args.accumulation} micro batches x "
          f"{args.micro_batch} = {program.global_batch} images per step")
    return dp.finish(program, args, t0)

if __name__ == "__main__":
    sys.exit(main())
