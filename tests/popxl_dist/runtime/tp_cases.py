"""Self-checking tensor-parallel cases, run unchanged under every backend.

    python tp_cases.py                                  # local backend (in-process)
    popxl-run --backend mpi --workers 2 tp_cases.py     # (also run by backend_suite.py)

For R = 1, 2 and 4 replicas and several tensor-parallel groupings (stride 1 and 2), one Ir holds
every case: the Megatron f/g all-reduce pairs (`replicated_all_reduce_TP`, the strided
variants, add and mean), the plain TP all-reduce, the vocabulary-sharded cross entropy (every
reduction, with and without ignore_index), the distributed layer norm, and (forward only)
`rts.reduce_replica_sharded_tensor` in its three forms. Each differentiable case's forward
graph is differentiated with `popxl_addons.autodiff`, called with per-replica inputs and
output gradients, and the patterns are applied to the whole IR; every replica's outputs and
input gradients are compared with NumPy references written here from the per-replica inputs.
Prints `ok <case>` / `FAIL <case>: <details>`; exit status 1 if any case failed.
"""
from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import popxl
import popxl_addons as addons
from popxl import ops
from popxl_addons import rts
from popxl_addons.ops.cross_entropy_sharded_loss import cross_entropy_sharded_loss
from popxl_addons.ops.layer_norm_distributed import layer_norm_distributed
from popxl_addons.ops.replicated_all_reduce_TP import (
    replicated_all_reduce,
    replicated_all_reduce_identical_grad_inputs,
    replicated_all_reduce_identical_inputs,
)
from popxl_addons.ops.replicated_strided_collectives import (
    replicated_all_reduce_strided,
    replicated_all_reduce_strided_identical_grad_inputs,
    replicated_all_reduce_strided_identical_inputs,
)
from popxl_addons.patterns import apply_pre_alias_patterns

F32 = np.float32
N, H, C = 6, 4, 5          # rows, hidden units per shard, classes per shard
GROUPINGS = {1: [(1, 1)], 2: [(1, 2), (1, 1)], 4: [(1, 4), (1, 2), (2, 2)]}


def members(r: int, stride: int, size: int) -> list[int]:
    block = r // (stride * size)
    return [block * stride * size + r % stride + i * stride for i in range(size)]


@dataclass
class Case:
    """`build(group, *inputs) -> output`; `ref(ins, dys, mem, i) -> (outputs, grads)` for the
    replica at position i of group `mem` (`ins[k][r]` is replica r's input k). Cases that are
    not `differentiable` run forward only (their `ref` returns no grads)."""

    name: str
    inputs: Callable   # (rng, R, (stride, size)) -> per-replica (R, ...) arrays
    build: Callable
    ref: Callable
    differentiable: bool = True


# --- f/g all-reduce pairs --------------------------------------------------------------------
def _xw(rng, R, grouping):
    return [rng.normal(size=(R, N, H)).astype(F32), rng.normal(size=(R, N, H)).astype(F32)]


def _fg_case(name: str, f: Callable, g: Callable, op: str) -> Case:
    """y = g(f(x) * w): forward sum (or mean) of x*w over the group; dx all-reduces dy*w."""
    def build(group, x, w):
        return g(f(x, op, group) * w, op, group)

    def ref(ins, dys, mem, i):
        x, w = ins
        r = mem[i]
        k = 1.0 if op == "add" else 1.0 / len(mem)
        y = k * sum(x[m] * w[m] for m in mem)
        dx = k * sum(dys[0][m] * w[m] for m in mem)
        return [y], [dx, dys[0][r] * x[r]]
    return Case(name, _xw, build, ref)


def _plain_case(name: str, fn: Callable) -> Case:
    """y = all_reduce(x * w); its gradient all-reduces too: dx = w * sum(dy)."""
    def build(group, x, w):
        return fn(x * w, "add", group)

    def ref(ins, dys, mem, i):
        x, w = ins
        r = mem[i]
        total_dy = sum(dys[0][m] for m in mem)
        return [sum(x[m] * w[m] for m in mem)], [w[r] * total_dy, x[r] * total_dy]
    return Case(name, _xw, build, ref)


# --- sharded cross entropy -------------------------------------------------------------------
def _ce_inputs(rng, R, grouping):
    """Per replica: its (N, C) logits shard, the global labels, and its first class."""
    stride, size = grouping
    labels = rng.integers(0, C * size, size=N)
    labels[1] = 3                                    # the ignore_index of the ignore cases
    first = [C * members(r, stride, size).index(r) for r in range(R)]
    return [rng.normal(size=(R, N, C)).astype(F32), np.tile(labels, (R, 1)).astype(np.int32),
            np.array(first, np.int32)]


def _ce_case(reduction: str, ignore: bool) -> Case:
    def build(group, logits, labels, first):
        ign = popxl.constant(3, popxl.int32) - first if ignore else None
        return cross_entropy_sharded_loss(logits, labels - first, ign, group, reduction)

    def ref(ins, dys, mem, i):
        logits, labels, _ = ins
        r = mem[i]
        full = np.concatenate([logits[m] for m in mem], axis=1).astype(np.float64)
        lab = labels[r]
        valid = lab != 3 if ignore else np.ones(N, bool)
        mx = full.max(axis=1, keepdims=True)
        lse = np.log(np.exp(full - mx).sum(axis=1)) + mx[:, 0]
        rows = np.where(valid, lse - full[np.arange(N), lab], 0.0)
        count = max(int(valid.sum()), 1)
        loss = {"mean": rows.sum() / count, "sum": rows.sum(), "none": rows}[reduction]
        p = np.exp(full - lse[:, None])
        p[np.arange(N), lab] -= 1
        dl = dys[0][r].astype(np.float64)
        scale = {"mean": np.full(N, dl / count), "sum": np.full(N, dl), "none": dl}[reduction]
        p *= np.where(valid, scale, 0.0)[:, None]
        return [np.asarray(loss, F32)], [p[:, i * C:(i + 1) * C].astype(F32)]
    name = f"cross_entropy_sharded[{reduction}{',ignore' if ignore else ''}]"
    return Case(name, _ce_inputs, build, ref)


# --- distributed layer norm ------------------------------------------------------------------
def _ln_inputs(rng, R, grouping):
    return [rng.normal(size=(R, N, H)).astype(F32) * 3 + 1,
            rng.normal(size=(R, H)).astype(F32), rng.normal(size=(R, H)).astype(F32)]


def _ln_ref(ins, dys, mem, i):
    x, w, b = (np.concatenate([a[m] for m in mem], axis=-1).astype(np.float64) for a in ins)
    dy = np.concatenate([dys[0][m] for m in mem], axis=-1).astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    inv = 1 / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    xhat = (x - mean) * inv
    y = xhat * w + b
    g = dy * w
    dx = inv * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    r = mem[i]
    own = slice(i * H, (i + 1) * H)
    dyr = dys[0][r].astype(np.float64)
    return ([y[:, own].astype(F32)],
            [dx[:, own].astype(F32), (dyr * xhat[:, own]).sum(0).astype(F32),
             dyr.sum(0).astype(F32)])


# --- reduce_replica_sharded_tensor -------------------------------------------------------------
def _chunk(flat: np.ndarray, i: int, k: int) -> np.ndarray:
    c = -(-flat.size // k)
    return np.concatenate([flat, np.zeros(c * k - flat.size, flat.dtype)])[i * c:(i + 1) * c]


def _rts_inputs(rng, R, grouping):
    return [rng.normal(size=(R, 4, 6)).astype(F32), rng.normal(size=(R, 3)).astype(F32)]


def _rts_build(group, x, y):
    """Three outputs concatenated: reduce-scatter over `group`; all-reduce over every replica
    then this replica's shard over `group`; and an all-reduce (3 elements do not divide)."""
    every = x.ir.replica_grouping()
    parts = [rts.reduce_replica_sharded_tensor(x, "add", group, group),
             rts.reduce_replica_sharded_tensor(x, "mean", every, group),
             rts.reduce_replica_sharded_tensor(y, "add", group, group)]
    return ops.concat([p.reshape((p.nelms,)) for p in parts], 0)


def _rts_ref(ins, dys, mem, i):
    x, y = ins
    R, k = x.shape[0], len(mem)
    if k > 1:
        scattered = _chunk(sum(x[m] for m in mem).reshape(-1), i, k)
        sliced = _chunk((sum(x) / R).reshape(-1), i, k)
    else:
        scattered, sliced = x[mem[0]].reshape(-1), (sum(x) / R).reshape(-1)
    whole = sum(y[m] for m in mem) if 3 % k else _chunk(sum(y[m] for m in mem), i, k)
    return [np.concatenate([scattered, sliced, whole.reshape(-1)])], []


CASES = [
    _fg_case("replicated_all_reduce_TP f/g[add]", replicated_all_reduce_identical_inputs,
             replicated_all_reduce_identical_grad_inputs, "add"),
    _fg_case("replicated_all_reduce_TP f/g[mean]", replicated_all_reduce_identical_inputs,
             replicated_all_reduce_identical_grad_inputs, "mean"),
    _fg_case("strided f/g[add]", replicated_all_reduce_strided_identical_inputs,
             replicated_all_reduce_strided_identical_grad_inputs, "add"),
    _plain_case("replicated_all_reduce_TP plain", replicated_all_reduce),
    _plain_case("replicated_all_reduce_strided plain", replicated_all_reduce_strided),
    *[_ce_case(red, ign) for red in ("mean", "sum", "none") for ign in (False, True)],
    Case("layer_norm_distributed", _ln_inputs,
         lambda group, x, w, b: layer_norm_distributed(x, w, b, 1e-5, group), _ln_ref),
    Case("reduce_replica_sharded_tensor", _rts_inputs, _rts_build, _rts_ref,
         differentiable=False),
]


# --- runner --------------------------------------------------------------------------------
def compare(got: np.ndarray, want: np.ndarray) -> str:
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if np.allclose(got, want, rtol=2e-5, atol=2e-5):
        return ""
    return f"max |diff| {np.max(np.abs(got.astype(np.float64) - want))}"


def run(R: int, grouping: tuple[int, int], results: list[tuple[str, str]]) -> None:
    rng = np.random.default_rng(R * 10 + grouping[0] * 3 + grouping[1])
    ir = popxl.Ir(replication=R)
    built, feeds = [], {}
    with ir.main_graph:
        group = ir.replica_grouping(*grouping)
        for ci, case in enumerate(CASES):
            ins = case.inputs(rng, R, grouping)
            specs = [popxl.TensorSpec(a.shape[1:], popxl.dtype.as_dtype(a.dtype)) for a in ins]
            fwd = ir.create_graph(lambda *xs, c=case: c.build(group, *xs), *specs)
            loaded = []
            for j, a in enumerate(ins):
                s = popxl.h2d_stream(a.shape[1:], popxl.dtype.as_dtype(a.dtype), f"in{ci}_{j}")
                feeds[s] = a
                loaded.append(ops.host_load(s))
            if not case.differentiable:
                y = ops.call(fwd, *loaded)[0]
                built.append((case, ins, None, [addons.host_store(y)]))
                continue
            required = [t for t in fwd.inputs if t.dtype.is_floating_point]
            bwd = addons.autodiff(fwd, grads_required=required)
            info = ops.call_with_info(fwd, *loaded)
            y = info.outputs[0]
            dy = rng.normal(size=(R, *y.shape)).astype(F32)
            s = popxl.h2d_stream(y.shape, y.dtype, f"dy{ci}")
            feeds[s] = dy
            grads = bwd.call(ops.host_load(s), args=bwd.grad_graph_info.inputs_dict(info))
            outs = [addons.host_store(t) for t in [y, *grads]]
            built.append((case, ins, dy, outs))
    apply_pre_alias_patterns(ir, "default")
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run(feeds)
    stride, size = grouping
    for case, ins, dy, outs in built:
        errs = []
        for r in range(R):
            mem = members(r, stride, size)
            want_y, want_g = case.ref(ins, [dy], mem, mem.index(r))
            for k, (o, w) in enumerate(zip(outs, want_y + want_g)):
                got = res[o] if R == 1 else res[o][r]
                err = compare(got, w)
                if err:
                    errs.append(f"replica {r} output {k}: {err}")
        results.append((f"R{R} stride{stride}-size{size} {case.name}", "; ".join(errs[:3])))


def main() -> int:
    """Run every case; print `ok <case>` / `FAIL <case>: <details>`; 1 if any failed."""
    failed = 0
    for R, groupings in GROUPINGS.items():
        for grouping in groupings:
            results: list[tuple[str, str]] = []
            try:
                run(R, grouping, results)
            except Exception:  # noqa: BLE001 - reported as a failed case, the rest still run
                results.append((f"R{R} {grouping}", traceback.format_exc()))
            for name, err in results:
                failed += bool(err)
                print(f"FAIL {name}: {err}" if err else f"ok {name}")
    print(f"{'FAILED' if failed else 'passed'}: {failed} failing tensor-parallel case(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
