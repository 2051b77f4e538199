"""A tiny GPT trained with tensor parallelism x data parallelism, as Graphcore's applications do.

The model is a pre-layer-norm decoder-only transformer (GPT) whose layers are split over the
`--tp` replicas of each tensor-parallel group (Megatron style), with `--dp` data-parallel copies
of each group (`replicas = tp * dp`):

* vocabulary-sharded embedding (`addons.layers.Embedding` with one shard per group member,
  indices offset per shard) whose partial lookups are summed with
  `replicated_all_reduce_identical_grad_inputs`;
* attention with the heads split over the group: q, k, v column-parallel, rotary positional
  embedding (`rotary_pos_embed`), the output projection row-parallel; the f/g pair
  `replicated_all_reduce_identical_inputs` / `..._identical_grad_inputs` around it;
* an MLP with the hidden units split over the group, and a NormFormer-style layer norm of
  its (sharded) hidden activations: `LayerNormDistributed`;
* a vocabulary-sharded LM head and loss: `cross_entropy_sharded_loss`;
* gradient accumulation (`addons.autodiff_with_accumulation` in `ops.repeat`), a mean over the
  data-parallel replicas of each gradient, global-norm gradient clipping with
  `grad_reduce_square_add` (sharded weights' norms summed over the group), and AdamW;
* `apply_pre_alias_patterns` after building, which the identical-inputs collectives require.

Weights are made on the host from one seed at their full size and written sharded (as the
applications load pretrained checkpoints), so any `--tp` trains the same model on the same data:
the losses of TP=2 x DP=2 equal those of TP=1 x DP=2 within float32 rounding. `--compare`
trains both and checks it: relative difference <= 1e-5 on every step (measured: < 1e-7 over 40
steps; the shards' partial sums are added in another order than the full tensors'). Every
backend gives the same bits.

    python examples/gpt_tiny_tp.py --tp 2 --dp 2 --compare
    popxl-run --backend mpi --workers 2 examples/gpt_tiny_tp.py --tp 2 --dp 2 --compare
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from functools import partial

import numpy as np
import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons.layers import Embedding, LayerNorm, Linear
from popxl_addons.layers.layer_norm_distributed import LayerNormDistributed
from popxl_addons.ops.cross_entropy_sharded_loss import cross_entropy_sharded_loss
from popxl_addons.ops.grad_reduce_square_add import grad_reduce_square_add
from popxl_addons.ops.replicated_all_reduce_TP import (
    replicated_all_reduce_identical_grad_inputs,
    replicated_all_reduce_identical_inputs,
)
from popxl_addons.ops.rotary_pos_embed import rotary_pos_embed, trig_table_constants
from popxl_addons.optimizers.adam import AdamOptimizerStep
from popxl_addons.patterns import apply_pre_alias_patterns

COMPARE_RTOL = 1e-5      # float32: the shards sum in another order than the full tensors


@dataclass(frozen=True)
class Config:
    vocab: int = 64
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    ffn: int = 64
    rotary_dim: int = 4          # of each head's 8 features
    seq: int = 16
    micro_batch: int = 4
    accumulation: int = 2
    lr: float = 3e-3
    clip_norm: float = 1.0

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


class Parallel:
    """The replica groupings of a TP x DP program on `ir`."""

    def __init__(self, ir: popxl.Ir, tp: int):
        self.tp = tp
        self.dp = ir.replication_factor // tp
        # Consecutive replicas form a tensor-parallel group (they get the same samples) ...
        self.tp_group = ir.replica_grouping(group_size=tp)
        # ... a TP-sharded weight holds one value per position in the group, shared by the
        # data-parallel copies ...
        self.shard_group = self.tp_group.transpose()
        # ... and the data-parallel copies of one position reduce their gradients.
        self.dp_group = ir.replica_grouping(stride=tp, group_size=self.dp)


def f_op(x: popxl.Tensor, par: Parallel) -> popxl.Tensor:
    """Megatron's f: identity forward, all-reduce of the gradient over the TP group."""
    return replicated_all_reduce_identical_inputs(x, group=par.tp_group)


def g_op(x: popxl.Tensor, par: Parallel) -> popxl.Tensor:
    """Megatron's g: all-reduce over the TP group forward, identity gradient."""
    return replicated_all_reduce_identical_grad_inputs(x, group=par.tp_group)


class AttentionTP(addons.Module):
    """Causal self-attention with the heads split over the tensor-parallel group."""

    def __init__(self, cfg: Config, par: Parallel):
        super().__init__()
        self.cfg, self.par = cfg, par
        width = cfg.hidden // par.tp
        self.q = Linear(width, replica_grouping=par.shard_group)
        self.k = Linear(width, replica_grouping=par.shard_group)
        self.v = Linear(width, replica_grouping=par.shard_group)
        self.out = Linear(cfg.hidden, bias=False, replica_grouping=par.shard_group)

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        cfg = self.cfg
        batch, heads = x.shape[0] // cfg.seq, cfg.heads // self.par.tp
        x = f_op(x, self.par)

        def split_heads(t: popxl.Tensor) -> popxl.Tensor:
            return t.reshape((batch, cfg.seq, heads, cfg.head_size))

        # rotary_pos_embed takes (batch, seq, heads, head_size); attention wants the heads first
        q, k, v = split_heads(self.q(x)), split_heads(self.k(x)), split_heads(self.v(x))
        sin, cos = trig_table_constants(cfg.seq, cfg.rotary_dim)
        q = rotary_pos_embed(q, sin, cos, cfg.rotary_dim).transpose((0, 2, 1, 3))
        k = rotary_pos_embed(k, sin, cos, cfg.rotary_dim).transpose((0, 2, 1, 3))
        v = v.transpose((0, 2, 1, 3))
        causal = np.triu(np.full((cfg.seq, cfg.seq), -1e4, np.float32), k=1)
        scores = (q @ k.transpose((0, 1, 3, 2))) * (1.0 / math.sqrt(cfg.head_size))
        probs = ops.softmax(scores + popxl.constant(causal, name="causal_mask"), axis=-1)
        context = (probs @ v).transpose((0, 2, 1, 3)).reshape((batch * cfg.seq,
                                                                heads * cfg.head_size))
        y = g_op(self.out(context), self.par)
        return y + self.add_variable_input("bias", partial(np.zeros, cfg.hidden), x.dtype)


class MlpTP(addons.Module):
    """Column- then row-parallel MLP; the sharded hidden units get a distributed layer norm."""

    def __init__(self, cfg: Config, par: Parallel):
        super().__init__()
        self.cfg, self.par = cfg, par
        self.fc1 = Linear(cfg.ffn // par.tp, replica_grouping=par.shard_group)
        self.ln = LayerNormDistributed(par.tp_group)
        self.fc2 = Linear(cfg.hidden, bias=False, replica_grouping=par.shard_group)

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        h = self.ln(ops.gelu(self.fc1(f_op(x, self.par))))
        y = g_op(self.fc2(h), self.par)
        return y + self.add_variable_input("bias", partial(np.zeros, self.cfg.hidden), x.dtype)


class DecoderLayer(addons.Module):
    def __init__(self, cfg: Config, par: Parallel):
        super().__init__()
        self.ln1 = LayerNorm()
        self.attention = AttentionTP(cfg, par)
        self.ln2 = LayerNorm()
        self.mlp = MlpTP(cfg, par)

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTLoss(addons.Module):
    """Token ids -> mean next-token loss. `offset` is this replica's first vocabulary id."""

    def __init__(self, cfg: Config, par: Parallel):
        super().__init__()
        self.cfg, self.par = cfg, par
        self.embedding = Embedding(popxl.float32, cfg.vocab, cfg.hidden,
                                   replica_grouping=par.shard_group)
        self.layers = addons.Module.from_list([DecoderLayer(cfg, par)
                                               for _ in range(cfg.layers)])
        self.ln_f = LayerNorm()
        self.head = Linear(self.embedding.vocab_shard_size, bias=False,
                           replica_grouping=par.shard_group)

    def build(self, input_ids: popxl.Tensor, labels: popxl.Tensor,
              offset: popxl.Tensor) -> popxl.Tensor:
        n = input_ids.nelms
        x = self.embedding((input_ids - offset).reshape((n,)))     # zeros off this shard
        x = g_op(x, self.par)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(f_op(self.ln_f(x), self.par))             # this shard's vocabulary
        return cross_entropy_sharded_loss(logits, (labels - offset).reshape((n,)),
                                          replica_grouping=self.par.tp_group)


class MicroBatchStep(addons.Module):
    """Load a micro batch, compute the loss (sent to the host) and accumulate the gradients."""

    def __init__(self, streams, loss_stream, fwd, bwd):
        super().__init__()
        self.streams, self.loss_stream = streams, loss_stream
        self.fwd_facts, self.fwd_graph = fwd
        self.bwd_facts, self.bwd_graph = bwd

    @popxl.in_sequence()
    def build(self, offset: popxl.Tensor) -> None:
        ids = ops.host_load(self.streams[0], "input_ids")
        labels = ops.host_load(self.streams[1], "labels")
        weights = self.add_variable_inputs("weights", self.fwd_facts)
        accums = self.add_variable_inputs("grads", self.bwd_facts)
        info = self.fwd_graph.bind(weights).call_with_info(ids, labels, offset)
        ops.host_store(self.loss_stream, info.outputs[0])
        self.bwd_graph.bind(accums).call(popxl.constant(1.0, popxl.float32),
                                         args=self.bwd_graph.grad_graph_info.inputs_dict(info))


def global_norm(grads: dict, par: Parallel) -> popxl.Tensor:
    """sqrt of the sum of every gradient's squares: sharded weights' parts are summed over the
    tensor-parallel group, replicated weights (the same on every member) counted once."""
    def total(gs):
        parts = [grad_reduce_square_add(g, 1.0).reshape((1,)) for g in gs]
        return ops.sum(ops.concat(parts, 0)) if parts else popxl.constant(0.0)
    sharded = [g for v, g in grads.items() if is_tp_sharded(v)]
    replicated = [g for v, g in grads.items() if not is_tp_sharded(v)]
    norm2 = ops.collectives.replicated_all_reduce(total(sharded), group=par.tp_group)
    return ops.sqrt(norm2 + total(replicated))


class TrainProgram:
    def __init__(self, session, streams, loss_stream, variables, cfg, par, replicas):
        self.session, self.streams, self.loss_stream = session, streams, loss_stream
        self.variables, self.cfg, self.par, self.replicas = variables, cfg, par, replicas


def build_program(cfg: Config, tp: int, dp: int) -> TrainProgram:
    if cfg.vocab % (16 * tp) or cfg.heads % tp or cfg.ffn % tp:
        raise ValueError(f"--tp {tp} must divide the heads ({cfg.heads}) and the MLP width "
                         f"({cfg.ffn}), and the vocabulary ({cfg.vocab}) must split into "
                         f"shards of a multiple of 16")
    replicas = tp * dp
    ir = popxl.Ir(replication=replicas)
    par = Parallel(ir, tp)
    with ir.main_graph:
        tokens = (cfg.micro_batch, cfg.seq)
        streams = [popxl.h2d_stream(tokens, popxl.int32, "input_ids"),
                   popxl.h2d_stream(tokens, popxl.int32, "labels")]
        loss_stream = popxl.d2h_stream((), popxl.float32, "loss")
        offsets = Embedding.get_offsets(cfg.vocab, tp).astype(np.int32)
        offset = popxl.variable(offsets if tp > 1 else offsets[0], popxl.int32, "vocab_offset",
                                replica_grouping=par.shard_group)

        model = GPTLoss(cfg, par)
        facts, fwd = model.create_graph(*(popxl.TensorSpec(tokens, popxl.int32),) * 2,
                                        offset.spec)
        bwd_facts, bwd = addons.autodiff_with_accumulation(
            fwd, tensors_to_accumulate_grads=fwd.args.tensors,
            grads_provided=fwd.graph.outputs[:1])
        variables = facts.init()
        accums = bwd_facts.init()
        _, step = MicroBatchStep(streams, loss_stream, (facts, fwd), (bwd_facts, bwd)
                                 ).create_graph(offset.spec)
        step_inputs = {**step.args.weights.to_mapping(variables),
                       **step.args.grads.to_mapping(accums)}

        with popxl.in_sequence(True):
            ops.repeat(step.graph, cfg.accumulation, offset, inputs_dict=step_inputs)
            grads = variables.to_mapping(accums.accum)
            for g in grads.values():
                ops.collectives.replicated_all_reduce_(g, op="mean", group=par.dp_group)
            norm = global_norm(grads, par)
            for name, var in variables.named_tensors.items():
                opt_facts, opt = AdamOptimizerStep(cache=True).create_graph(
                    var, var.spec, var.replica_grouping, lr=cfg.lr, weight_decay=0.0,
                    first_order_dtype=popxl.float32, global_norm=norm.spec,
                    global_norm_max=cfg.clip_norm)
                state = opt_facts.init(prefix=f"adam.{name}")
                opt.bind(state).call(var, grads[var], norm)
            ops.var_updates.accumulator_scale_(accums.mean_accum_counter, 0.0)
            for g in grads.values():
                ops.var_updates.accumulator_scale_(g, 0.0)
    ir.num_host_transfers = cfg.accumulation
    apply_pre_alias_patterns(ir, level="default")
    session = popxl.Session(ir, "ipu_hw")
    return TrainProgram(session, streams, loss_stream, variables, cfg, par, replicas)


# --- host side: weights and data --------------------------------------------------------------
def is_tp_sharded(var: popxl.Tensor) -> bool:
    """Whether a weight holds one value per tensor-parallel position (a shard)."""
    return var.replica_grouping.num_groups > 1


def reference_weights(variables: addons.NamedTensors, tp: int, seed: int) -> dict[str, np.ndarray]:
    """Full-size initial weights, the same for every `tp`, drawn in key order from one seed:
    normal(0, 0.02) matrices, layer-norm scales 1, biases 0."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, var in sorted(variables.named_tensors.items()):
        shape = list(var.shape)
        if is_tp_sharded(var):
            shape[_shard_axis(key, var.shape)] *= tp
        if key.endswith("bias"):
            out[key] = np.zeros(shape, np.float32)
        elif key.split(".")[-2].startswith("ln"):
            out[key] = np.ones(shape, np.float32)
        else:
            out[key] = rng.normal(0, 0.02, shape).astype(np.float32)
    return out


def _shard_axis(key: str, shard_shape) -> int:
    """The axis a tensor-parallel weight is split on: columns of the column-parallel layers (q,
    k, v, fc1, head), rows of the row-parallel ones (out, fc2), the vocabulary of the
    embedding, and the only axis of vectors."""
    if len(shard_shape) == 1:
        return 0
    name = key.split(".")[-2]
    return 1 if name in ("q", "k", "v", "fc1", "head") else 0


def write_weights(program: TrainProgram, full: dict[str, np.ndarray]) -> None:
    """Write the full weights, each TP-sharded one split over its group's positions."""
    tp = program.par.tp
    data = {}
    for key, var in program.variables.named_tensors.items():
        w = full[key]
        if is_tp_sharded(var):
            w = addons.shard(w, tp, _shard_axis(key, var.shape))
        data[var] = w
    program.session.write_variables_data(data)


def token_batches(cfg: Config, dp: int, steps: int, seed: int):
    """Synthetic sequences t_i = (start + stride * i) mod vocab with a random start and a
    stride in {1, 3, 5}: learnable, and the same for every `tp`. Yields, per step,
    `(accumulation * dp, micro_batch, seq + 1)` tokens."""
    rng = np.random.default_rng(seed)
    n = cfg.accumulation * dp * cfg.micro_batch
    pos = np.arange(cfg.seq + 1)
    for _ in range(steps):
        start = rng.integers(0, cfg.vocab, size=(n, 1))
        stride = rng.choice([1, 3, 5], size=(n, 1))
        yield ((start + stride * pos) % cfg.vocab).astype(np.int32).reshape(
            cfg.accumulation * dp, cfg.micro_batch, cfg.seq + 1)


def train(cfg: Config, tp: int, dp: int, steps: int, seed: int = 0,
          verbose: bool = True) -> list[float]:
    """Train for `steps` optimiser steps; returns each step's mean loss (over its micro batches
    and data-parallel replicas)."""
    program = build_program(cfg, tp, dp)
    losses = []
    with program.session:
        write_weights(program, reference_weights(program.variables, tp, seed))
        for i, tokens in enumerate(token_batches(cfg, dp, steps, seed + 1)):
            replicas = program.replicas
            inputs = [addons.tensor_parallel_input(tokens[..., :-1], tp, replicas),
                      addons.tensor_parallel_input(tokens[..., 1:], tp, replicas)]
            out = program.session.run(dict(zip(program.streams, inputs)))[program.loss_stream]
            per_replica = np.asarray(out).reshape(cfg.accumulation, replicas)
            losses.append(float(np.mean(per_replica[:, ::tp], dtype=np.float64)))
            if verbose:
                print(f"TP={tp} x DP={dp} step {i + 1}: loss {losses[-1]:.6f}", flush=True)
    return losses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel replicas (default 2)")
    p.add_argument("--dp", type=int, default=2, help="data-parallel replicas (default 2)")
    p.add_argument("--steps", type=int, default=6, help="optimiser steps (default 6)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", action="store_true",
                   help="also train with TP=1 and check the losses agree")
    p.add_argument("--save-losses", metavar="PATH", help="np.save the losses")
    args = p.parse_args(argv)
    for name in ("tp", "dp", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    cfg = Config()
    t0 = time.perf_counter()
    losses = train(cfg, args.tp, args.dp, args.steps, args.seed)
    status = 0
    if args.compare:
        ref = train(cfg, 1, args.dp, args.steps, args.seed)
        rel = np.abs(np.array(losses) - ref) / np.abs(ref)
        ok = bool(np.all(rel <= COMPARE_RTOL))
        print(f"TP={args.tp} vs TP=1 losses: max relative difference {rel.max():.2e} "
              f"({'within' if ok else 'ABOVE'} {COMPARE_RTOL:g})")
        status = 0 if ok else 1
        losses = np.stack([losses, ref])
    if args.save_losses:
        np.save(args.save_losses, np.asarray(losses))
    print(f"Total time: {time.perf_counter() - t0:0.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
