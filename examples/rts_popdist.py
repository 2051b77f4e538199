"""Replicated tensor sharding across popdist instances (the PopXL user guide's multi-instance RTS
programs), self-checking against NumPy:

    poprun --num-instances 2 --num-replicas 4 python examples/rts_popdist.py
    poprun --num-instances 8 --num-replicas 128 python examples/rts_popdist.py --groupings
    popxl-run --backend ray --instances 2 --replicas 4 examples/rts_popdist.py --groupings

Every replica holds one shard of a replica-sharded variable. Each run gathers the shards into
the whole weight (`replicated_all_gather`), multiplies it by the replica's own input, and updates
the shard with the reduce-scatter of that product (`replicated_reduce_scatter` with an RTS
output); the weight is then read back whole on every instance (`get_tensor_data` gathers the
shards across instances), rewritten, and run again. `--groupings` adds variables grouped over
replicas (contiguous and strided groups, sharded over a part of each group), whose sharding
groups cross the instances. All values are small integers, so float32 arithmetic is exact and
the NumPy reference is compared bit for bit. Prints `ok <case>` / `FAIL <case>: ...` per case.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import popdist
import popxl
from popxl import ops

C = ops.collectives


def chunk(flat: np.ndarray, i: int, k: int) -> np.ndarray:
    """Shard i of k of `flat`, zero-padded to k * ceil(n / k)."""
    c = -(-flat.size // k)
    return np.concatenate([flat, np.zeros(c * k - flat.size, flat.dtype)])[i * c:(i + 1) * c]


class Case:
    """One replica-sharded variable: its grouping `(stride, group_size)` (None = all replicas),
    `shard_over`, per-group shape, and the NumPy model of every replica's shard."""

    def __init__(self, ir: popxl.Ir, grouping, shard_over: int, shape, seed: int):
        R = ir.replication_factor
        self.stride, self.size = grouping or (1, R)
        self.k = shard_over
        self.shape = shape
        self.groups = R // self.size
        rng = np.random.default_rng(seed)
        self.init = rng.integers(-4, 5, size=(self.groups, *shape)).astype(np.float32)
        self.x = rng.integers(-2, 3, size=(R, *shape)).astype(np.float32)
        rg = ir.replica_grouping(self.stride, self.size) if grouping else None
        host = self.init if self.groups > 1 else self.init[0]
        self.var, shard = popxl.replica_sharded_variable(host, popxl.float32, replica_grouping=rg,
                                                         shard_over=shard_over)
        self.name = (f"rts[{'all' if grouping is None else f'stride{self.stride}-size{self.size}'}"
                     f",shard_over={shard_over},shape={shape}]")
        self.xs = popxl.h2d_stream(shape, popxl.float32, f"x_{seed}")
        gather_group = ir.replica_grouping(self.stride, shard_over)
        full = C.replicated_all_gather(shard, group=gather_group)
        grad = full * ops.host_load(self.xs)
        update = C.replicated_reduce_scatter(grad, "add", gather_group,
                                             configure_output_for_replicated_tensor_sharding=True)
        ops.scaled_add_(shard, update, b=-1.0)
        self.full_out = popxl.d2h_stream(full.shape, full.dtype, f"full_{seed}")
        ops.host_store(self.full_out, full)
        self.R = R
        self.shards = np.stack([self._shard_of(self.init, r) for r in range(R)])

    # --- the NumPy model ------------------------------------------------------------------
    def _group(self, r: int) -> int:
        return r % self.stride + self.stride * (r // (self.stride * self.size))

    def _index(self, r: int) -> int:
        return (r % (self.stride * self.size)) // self.stride

    def _members(self, r: int):
        """r's sharding group: the k members of its variable group's block, ascending."""
        first = r - self._index(r) * self.stride
        blk = self._index(r) // self.k
        return [first + (blk * self.k + j) * self.stride for j in range(self.k)]

    def _shard_of(self, weights: np.ndarray, r: int) -> np.ndarray:
        return chunk(weights[self._group(r)].reshape(-1), self._index(r) % self.k, self.k)

    def gathered(self, r: int) -> np.ndarray:
        n = int(np.prod(self.shape))
        return np.concatenate([self.shards[m] for m in self._members(r)])[:n].reshape(self.shape)

    def step(self) -> np.ndarray:
        """Advance the model by one run; returns every replica's gathered weight."""
        full = np.stack([self.gathered(r) for r in range(self.R)])
        grad = full * self.x
        new = self.shards.copy()
        for r in range(self.R):
            mem = self._members(r)
            total = sum(grad[m] for m in mem).reshape(-1)
            new[r] -= chunk(total, mem.index(r), self.k)
        self.shards = new
        return full

    def weights(self) -> np.ndarray:
        """The host value: each group's weight from the shards of its first members."""
        firsts = [r for r in range(self.R) if self._index(r) == 0]
        whole = np.stack([self.gathered(f) for f in firsts])
        return whole if self.groups > 1 else whole[0]

    def rewrite(self, weights: np.ndarray) -> None:
        w = weights if self.groups > 1 else weights[np.newaxis]
        self.shards = np.stack([self._shard_of(w, r) for r in range(self.R)])


def build(groupings: bool):
    ir = popxl.Ir(replication="popdist" if popdist.isPopdistEnvSet() else 4)
    R = ir.replication_factor
    specs = [(None, R, (3, 5)), (None, R, (2,))]
    if groupings and R >= 4:
        specs += [((1, R // 2), R // 2, (7,)),          # two contiguous groups
                  ((2, R // 2), R // 2, (3, 3)),        # two interleaved groups
                  ((1, R), R // 2, (5,))]               # sharded twice within one group
    with ir.main_graph:
        cases = [Case(ir, g, k, shape, seed) for seed, (g, k, shape) in enumerate(specs)]
    return ir, cases


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groupings", action="store_true", help="also the grouped variables")
    args = p.parse_args(argv)
    ir, cases = build(args.groupings)
    local = ir.instance_replication_factor
    offset = popdist.getReplicaIndexOffset() if popdist.isPopdistEnvSet() else 0
    mine = slice(offset, offset + local)
    errors = {c.name: [] for c in cases}

    def check(case: Case, what: str, got: np.ndarray, want: np.ndarray) -> None:
        if got.shape != want.shape or got.tobytes() != want.tobytes():
            errors[case.name].append(f"{what}: got {got.tolist()}, expected {want.tolist()}")

    def run(session: popxl.Session, label: str) -> None:
        feeds = {c.xs: c.x[mine] if local > 1 else c.x[offset] for c in cases}
        out = session.run(feeds)
        for c in cases:
            want = c.step()[mine]
            check(c, f"{label}: gathered weights", out[c.full_out],
                  want if local > 1 else want[0])

    with popxl.Session(ir, "ipu_hw") as session:
        run(session, "run 1")
        run(session, "run 2")
        for c in cases:              # collective: the whole weights on every instance
            check(c, "read back after 2 runs", session.get_tensor_data(c.var), c.weights())
        rewritten = {c.var: c.weights() * 2 + 1 for c in cases}
        session.write_variables_data(rewritten)
        for c in cases:
            c.rewrite(rewritten[c.var])
        run(session, "run 3 after a rewrite")
    for c in cases:
        check(c, "read back after leaving the session", session.get_tensor_data(c.var),
              c.weights())
    failed = 0
    for c in cases:
        if errors[c.name]:
            failed += 1
            print(f"FAIL R{c.R} {c.name}: {'; '.join(errors[c.name][:2])}")
        else:
            print(f"ok R{c.R} {c.name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
