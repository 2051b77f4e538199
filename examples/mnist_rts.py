"""Data-parallel MNIST with replicated tensor sharding (RTS): sharded weights and Adam state.

The twin of `examples/mnist_data_parallel.py` (same `Net`, data order, seeds and
hyper-parameters; its pieces are imported from there), on `--replicas` replicas (default 4).
Each `session.run` is one optimiser step:

1. Every weight with at least `--rts-threshold` elements (default 1024: the four weight
   matrices, not the biases) lives in a remote buffer as an RTS variable: each replica stores
   1/R of it. The shards are loaded (`addons.load_remote_graph`) and all-gathered
   (`addons.rts.all_gather_replica_sharded_graph`, i.e. `replicated_all_gather`) into full
   weights before the forward passes.
2. `ops.repeat` runs the micro-batch step (`MicroBatchStep` of the DP example) `--accumulation`
   times, accumulating the mean gradient of every weight.
3. Sharded weights: the accumulated gradient is reduce-scattered (`replicated_reduce_scatter`,
   op "mean", RTS output) so that each replica gets the mean gradient of its own shard. Small
   weights keep the all-reduce(mean) of the DP example.
4. Adam updates each sharded weight on its shard. The first and second moments of every weight
   live in remote buffers (sharded for sharded weights): loaded before the update and stored back
   after it, as are the updated weight shards.

`--no-rts` builds the same program with nothing sharded (weights on chip, all-reduce; Adam
moments still in remote buffers, whole). Both give the same weights bit for bit: the
reduce-scatter sums every element over the replicas in the same order as the all-reduce, and
Adam is element-wise.

    popxl-run --backend local examples/mnist_rts.py --memory-report
    popxl-run --backend mpi --workers 2 examples/mnist_rts.py --save-weights w.npz
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons.optimizers.adam import AdamOptimizerStep

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import mnist_data_parallel as dp

IMAGE_SIZE = dp.IMAGE_SIZE
MOMENTS = ("first_order", "second_order")


class PersistentTensor(NamedTuple):
    """One tensor of per-replica device memory (what `device_memory_report` counts)."""

    name: str
    kind: str            # "variables" (on chip) or "remote_buffers"
    nbytes: int          # per replica
    rts_candidate: bool  # a weight >= threshold, or an Adam moment of one


class RTSTrainProgram(dp.TrainProgram):
    """The DP example's TrainProgram plus what sharding changed.

    Attributes:
        rts_keys: keys of the weights that meet the threshold (sharded unless `--no-rts`).
        sharded: whether those weights (and their Adam moments) are sharded.
        persistent: every tensor of per-replica device memory, for the memory report.
    """

    def __init__(self, *args, rts_keys: tuple[str, ...], sharded: bool,
                 persistent: list[PersistentTensor], **kwargs):
        super().__init__(*args, **kwargs)
        self.rts_keys = rts_keys
        self.sharded = sharded
        self.persistent = persistent

    def candidate_bytes(self) -> int:
        """Per-replica bytes of the sharding candidates (weights >= threshold + moments)."""
        return sum(p.nbytes for p in self.persistent if p.rts_candidate)

    def other_bytes(self) -> int:
        """Per-replica bytes of everything else (identical with and without RTS)."""
        return sum(p.nbytes for p in self.persistent if not p.rts_candidate)


def _nbytes(shape: tuple[int, ...], dtype: popxl.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype.as_numpy()).itemsize


def rts_weight_keys(facts: addons.NamedVariableFactories, replicas: int,
                    threshold: int) -> tuple[str, ...]:
    """Weights with at least `threshold` elements that split evenly over the replicas."""
    keys = []
    for key, f in facts.to_dict().items():
        n = int(np.prod(f.shape, dtype=np.int64))
        if n >= threshold and n % replicas == 0:
            keys.append(key)
    return tuple(sorted(keys))


def build_train_program(replicas: int = 4, accumulation: int = 4, micro_batch: int = 8,
                        lr: float = 1e-3, seed: int = 42, rts_threshold: int = 1024,
                        rts: bool = True) -> RTSTrainProgram:
    """Build the (RTS) data-parallel training program and its Session (not yet attached).

    Args:
        replicas: replication factor R (sharding needs R > 1).
        accumulation: micro batches accumulated per optimiser step (= num_host_transfers).
        micro_batch: images per replica per micro batch.
        lr: Adam learning rate.
        seed: NumPy seed for the weight initialisation.
        rts_threshold: weights with at least this many elements are sharded over all replicas.
        rts: False builds the same program with nothing sharded.
    """
    np.random.seed(seed)
    ir = popxl.Ir(replication=replicas)
    persistent: list[PersistentTensor] = []
    with ir.main_graph:
        img_stream = popxl.h2d_stream((micro_batch, IMAGE_SIZE), popxl.float32, "image")
        label_stream = popxl.h2d_stream((micro_batch,), popxl.int32, "labels")
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")

        facts, fwd_graph = dp.Net().create_graph(popxl.TensorSpec((micro_batch, IMAGE_SIZE),
                                                                  popxl.float32))
        bwd_facts, bwd_graph = addons.autodiff_with_accumulation(
            fwd_graph, tensors_to_accumulate_grads=fwd_graph.args.tensors)

        rts_keys = rts_weight_keys(facts, replicas, rts_threshold)
        shard = rts and replicas > 1 and bool(rts_keys)
        sharded_keys = rts_keys if shard else ()

        # Weights: sharded ones are RTS variables in remote buffers (one shard per replica),
        # the rest on-chip variables. Created in sorted key order like `facts.init()`, so the
        # random draws (and thus the initial weights) are those of the unsharded program.
        weight_buffers = addons.named_variable_buffers(facts.filter_keys(sharded_keys)) \
            if sharded_keys else addons.remote.NamedRemoteBuffers()
        variables = {}
        for key, f in sorted(facts.to_dict().items()):
            if key in sharded_keys:
                variables[key] = f.create_remote_tensor(weight_buffers[key], 0, key)
                buf = weight_buffers[key]
                persistent.append(PersistentTensor(key, "remote_buffers",
                                                   _nbytes(buf.tensor_shape, buf.tensor_dtype),
                                                   True))
            else:
                variables[key] = f.create_tensor(key)
                persistent.append(PersistentTensor(key, "variables",
                                                   _nbytes(f.shape, f.dtype),
                                                   key in rts_keys))
        variables = addons.NamedTensors.from_dict(variables)
        accums = bwd_facts.init()
        persistent += [PersistentTensor(t.name, "variables", _nbytes(t.shape, t.dtype), False)
                       for t in accums.tensors]

        _, step_graph = dp.MicroBatchStep(
            (img_stream, label_stream), loss_stream, (facts, fwd_graph),
            (bwd_facts, bwd_graph)).create_graph()

        with popxl.in_sequence(True):
            # 1. The full weights: on-chip variables, or gathered from the sharded buffers.
            weights = variables
            shards = addons.NamedTensors()
            if sharded_keys:
                load_graph, names = addons.load_remote_graph(weight_buffers)
                shards = addons.NamedTensors.pack(names, load_graph.call(0))
                gather_graph, names = addons.rts.all_gather_replica_sharded_graph(shards)
                gathered = addons.NamedTensors.pack(names, gather_graph.bind(shards).call())
                weights = addons.NamedTensors.from_dict({**variables.to_dict(),
                                                         **gathered.to_dict()})

            # 2. Gradient accumulation (one host transfer per micro batch).
            step_inputs = {**step_graph.args.weights.to_mapping(weights),
                           **step_graph.args.grads.to_mapping(accums)}
            ops.repeat(step_graph.graph, accumulation, inputs_dict=step_inputs)

            # 3. Mean over the replicas: reduce-scatter into shards, or all-reduce.
            grads = {}
            if sharded_keys:
                full_grads = accums.accum.filter_keys(sharded_keys)
                reduce_graph, names = addons.rts.reduce_replica_sharded_graph(full_grads,
                                                                              op="mean")
                grads.update(zip(names, reduce_graph.bind(full_grads).call()))
            for key, g in accums.accum.to_dict().items():
                if key not in sharded_keys:
                    if replicas > 1:
                        ops.collectives.replicated_all_reduce_(g, op="mean")
                    grads[key] = g

            # 4. Adam on the shards (or whole weights), moments in remote buffers.
            targets = {key: shards[key] if key in sharded_keys else variables[key]
                       for key in variables.keys_flat()}
            adam_state, opt_calls, moment_facts = _adam_graphs(targets, lr)
            moment_buffers = addons.named_variable_buffers(moment_facts, shard_over_dict=False)
            # RTS remote variables for sharded weights' moments, whole ones for the rest.
            moment_vars = moment_facts.init_remote(moment_buffers, prefix="adam")
            for key, buf in moment_buffers.to_dict().items():
                persistent.append(PersistentTensor(
                    f"adam.{key}", "remote_buffers", _nbytes(buf.tensor_shape, buf.tensor_dtype),
                    key.rsplit(".", 1)[0] in rts_keys))
            persistent += [PersistentTensor(t.name, "variables", _nbytes(t.shape, t.dtype),
                                            False) for t in adam_state.tensors]
            adam_state = addons.NamedTensors.from_dict({**adam_state.to_dict(),
                                                        **moment_vars.to_dict()})

            load_graph, names = addons.load_remote_graph(moment_buffers)
            moments = addons.NamedTensors.pack(names, load_graph.call(0))
            for key, (opt_graph, steps) in opt_calls.items():
                state = addons.NamedTensors.from_dict({
                    **{m: moments[f"{key}.{m}"] for m in MOMENTS}, "step": steps})
                opt_graph.bind(state).call(targets[key], grads[key])
            addons.store_remote_graph(moment_buffers).bind(moments).call(0)
            if sharded_keys:
                addons.store_remote_graph(weight_buffers).bind(shards).call(0)

            # 5. Restart the running means (as the DP example).
            dp.reset_accumulators(accums)

    ir.num_host_transfers = accumulation
    session = popxl.Session(ir, "ipu_hw")
    return RTSTrainProgram(session, [img_stream, label_stream], loss_stream, variables,
                           adam_state, accumulation, replicas, micro_batch,
                           rts_keys=rts_keys, sharded=bool(sharded_keys), persistent=persistent)


def _adam_graphs(targets: dict[str, popxl.Tensor], lr: float):
    """An Adam graph per weight (the DP example's settings), the step counters (on chip),
    and the moments' factories keyed `<weight key>.<first_order|second_order>`.

    Returns `(step counters keyed "<weight key>.step", {key: (graph, step counter)},
    moment factories)`."""
    optimiser = AdamOptimizerStep(cache=True)
    steps, calls, moment_facts = {}, {}, {}
    for key, var in targets.items():
        opt_facts, opt_graph = optimiser.create_graph(
            var, var.spec, lr=lr, weight_decay=0.0, first_order_dtype=popxl.float32,
            bias_correction=True)
        for m in MOMENTS:
            moment_facts[f"{key}.{m}"] = opt_facts.get(m)
        step = opt_facts.get("step").create_tensor(f"adam.{key}.step")
        steps[f"{key}.step"] = step
        calls[key] = (opt_graph, step)
    return (addons.NamedTensors.from_dict(steps), calls,
            addons.NamedVariableFactories.from_dict(moment_facts))


def memory_table(programs: dict[str, RTSTrainProgram]) -> str:
    """A table of per-replica device bytes (from `session.device_memory_report()`; the sessions
    must be attached) by kind, and of the sharding candidates, for each program."""
    rows = {}
    for label, prog in programs.items():
        reports = prog.session.device_memory_report()
        first = reports[0]
        for rep in reports[1:]:
            for kind in ("variables", "rts_shards", "remote_buffers"):
                if rep[kind] != first[kind]:
                    raise RuntimeError(f"{label}: replicas {first['replica']} and "
                                       f"{rep['replica']} report different {kind} bytes")
        total = first["variables"] + first["rts_shards"] + first["remote_buffers"]
        rows[label] = {"variables": first["variables"], "rts_shards": first["rts_shards"],
                       "remote_buffers": first["remote_buffers"], "total": total,
                       "sharded part": total - prog.other_bytes(),
                       "rest": prog.other_bytes()}
    labels = list(programs)
    head = f"{'bytes per replica':<20}" + "".join(f"{lb:>16}" for lb in labels)
    if len(labels) == 2:
        head += f"{'ratio':>10}"
    lines = [head, "-" * len(head)]
    for kind in ("variables", "rts_shards", "remote_buffers", "total", "rest",
                 "sharded part"):
        line = f"{kind:<20}" + "".join(f"{rows[lb][kind]:>16,}" for lb in labels)
        if len(labels) == 2:
            a, b = rows[labels[0]][kind], rows[labels[1]][kind]
            line += f"{a / b:>9.2f}x" if b else f"{'-':>10}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = dp.training_parser(__doc__.splitlines()[0], replicas=4)
    p.add_argument("--rts-threshold", type=int, default=1024,
                   help="shard weights with at least this many elements (default 1024)")
    p.add_argument("--no-rts", action="store_true",
                   help="shard nothing: weights on chip, all-reduced gradients")
    p.add_argument("--memory-report", action="store_true",
                   help="print the per-replica device memory of this program")
    args = dp.parse_checked(p, argv, positive=("rts_threshold",))

    t0 = time.perf_counter()
    program = build_train_program(args.replicas, args.accumulation, args.micro_batch, args.lr,
                                  args.seed, args.rts_threshold, rts=not args.no_rts)
    print(f"Training: {args.replicas} replicas x {args.accumulation} accumulation steps x "
          f"micro batch {args.micro_batch} = {program.global_batch} images per step")
    if program.sharded:
        print(f"Replica-sharded over {args.replicas} replicas: {', '.join(program.rts_keys)} "
              f"(and their Adam moments)")
    else:
        print("Nothing sharded")

    def report() -> None:
        if args.memory_report:
            with program.session:
                print(memory_table({"RTS" if program.sharded else "no RTS": program}))

    return dp.finish(program, args, t0, report)


if __name__ == "__main__":
    sys.exit(main())
