"""A GPT training step on the emulator against its PyTorch eager twin (issue 23's benchmark).

The model: token embedding + learned positions, pre-LN decoder layers (causal multi-head attention,
GELU (tanh) MLP), a final LayerNorm, an LM head, softmax cross-entropy and Adam, written in
idiomatic popxl + popxl_addons (`addons.Module`, `addons.autodiff`, `cross_entropy_with_grad`,
`AdamOptimizerStep`) and the same model in PyTorch eager (`nn.Module`, `torch.optim.Adam`). Both
start from the same weights and data; the first losses must agree.

Every measurement runs a contender in a fresh process (default malloc, 1 BLAS / OpenMP thread),
the contenders alternate round by round, and the figures are medians over rounds:

* CPU time per step (user + system, `resource.getrusage`), its ratio to torch's, peak RSS,
  minor page faults per step, and the "compile" time (popxl: IR build + Session creation;
  torch: building the model and the optimiser) at sizes a, b, c (float32);
* popxl float16 against popxl float32 (same run), and the same paired in one process (part
  `f16pair`: both programs' Sessions in one fresh process, their steps alternating, the median
  of the step-by-step ratios; the machine's drift between processes is larger than the
  difference, and within a pair both steps see the same machine);
* IR build + Session creation of the size-a model unrolled to 8, 32 and 96 layers (log-log slope);
* data parallel over 2 MPI ranks (`popxl-run --backend mpi --workers 2`, all-reduce of every
  gradient) against torch DDP (gloo, 2 processes), samples/s at sizes a and b;
* the same unchanged 2-rank script with the default environment (no BLAS variable: the runtime's
  BLAS policy decides) against `OPENBLAS_NUM_THREADS=1` (part `blas`, sizes a and b);
* wall time per step with default settings for both contenders, no thread pinning: popxl-dist
  with its own threads (`POPXL_THREADS` unset), PyTorch with its default intra-op threads (part
  `wall`, sizes a, b, c);
* the scaling of wall time from 1 to 2 threads (`POPXL_THREADS=1` / `2`, torch
  `set_num_threads(1)` / `(2)`), with the parallel fraction it implies and, from it, the time
  projected on 8 and 16 cores (part `scaling`; Amdahl's law, see docs/threads.md).

    python benchmarks/bench_transformer.py                      # everything (torch optional)
    python benchmarks/bench_transformer.py --parts step --sizes a b --rounds 5
    python benchmarks/bench_transformer.py --parts f16 f16pair compile dp blas
    python benchmarks/bench_transformer.py --parts wall scaling --markdown   # + a Markdown table

The 1-thread parts (`step`, `f16`, `f16pair`) pin both contenders to one thread
(`POPXL_THREADS=1`, torch `set_num_threads(1)` and the BLAS / OpenMP variables at 1).
`--markdown` ends with a table of every figure measured, headed by the machine, the versions
and the load average.

Nothing here asserts on time. A contender can be run alone in worker mode:
`--run popxl|torch --size b [--dtype float16] [--layers 8] [--replicas 2]` prints one JSON line
(`--run f16pair --size a`: the paired float16 / float32 measurement).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

SCRIPT = os.path.abspath(__file__)
TAG = "BENCH_JSON "
SIZES = {
    "a": dict(hidden=64, layers=2, heads=4, seq=64, vocab=256, batch=8),
    "b": dict(hidden=256, layers=4, heads=8, seq=128, vocab=4096, batch=8),
    "c": dict(hidden=768, layers=2, heads=12, seq=256, vocab=8192, batch=4),
}
STEPS = {"a": 40, "b": 12, "c": 6}          # measured steps per run (after WARMUP)
PAIRS = {"a": 300, "b": 40, "c": 10}        # step pairs of `f16pair`
WARMUP = 2
LR = 1e-3
EPS = 1e-5
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "POPXL_THREADS": "1"}
MALLOC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX",
               "MALLOC_TOP_PAD_", "LD_PRELOAD")
BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "POPXL_BLAS_THREADS", "POPXL_THREADS", "POPXL_REPLICA_THREADS",
             "OPENBLAS_THREAD_TIMEOUT")
TABLE: List[Dict[str, str]] = []        # every figure measured, for --markdown


def emit(record: Dict[str, Any]) -> None:
    print(TAG + json.dumps(record), flush=True)


# --- shared weights and data -----------------------------------------------------------------
def param_shapes(cfg: Dict[str, int]) -> Dict[str, tuple]:
    """Every parameter's name and shape, in the popxl program's naming (Linear weights are
    (in, out))."""
    h, v, s = cfg["hidden"], cfg["vocab"], cfg["seq"]
    shapes = {"embedding.weight": (v, h), "positions": (s, h)}
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        shapes.update({p + "ln_1.weight": (h,), p + "ln_1.bias": (h,),
                       p + "attention.qkv.weight": (h, 3 * h), p + "attention.qkv.bias": (3 * h,),
                       p + "attention.output.weight": (h, h), p + "attention.output.bias": (h,),
                       p + "ln_2.weight": (h,), p + "ln_2.bias": (h,),
                       p + "mlp.fc_1.weight": (h, 4 * h), p + "mlp.fc_1.bias": (4 * h,),
                       p + "mlp.fc_2.weight": (4 * h, h), p + "mlp.fc_2.bias": (h,)})
    shapes.update({"ln_f.weight": (h,), "ln_f.bias": (h,), "head.weight": (h, v)})
    return shapes


def init_weights(cfg: Dict[str, int], seed: int = 0) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            out[name] = np.ones(shape, np.float32)
        elif name.endswith("bias"):
            out[name] = np.zeros(shape, np.float32)
        else:
            out[name] = (rng.standard_normal(shape, np.float32) * np.float32(0.02))
    return out


def make_data(cfg: Dict[str, int], replicas: int = 1, n: int = 4, seed: int = 1):
    """`n` batches of (tokens, labels), each (replicas, batch * seq) int32."""
    rng = np.random.default_rng(seed)
    shape = (replicas, cfg["batch"] * cfg["seq"])
    return [(rng.integers(0, cfg["vocab"], shape).astype(np.int32),
             rng.integers(0, cfg["vocab"], shape).astype(np.int32)) for _ in range(n)]


def causal_mask(seq: int) -> np.ndarray:
    return (1e4 * (np.tril(np.ones((seq, seq))) - 1)).astype(np.float32)


# --- popxl + popxl_addons ----------------------------------------------------------------------
def popxl_model(cfg: Dict[str, int], dtype_name: str, replicas: int = 1):
    """(ir, streams, variables): the training step in idiomatic popxl + popxl_addons."""
    import popxl
    import popxl_addons as addons
    from popxl import ops
    from popxl_addons.layers import Embedding, LayerNorm, Linear
    from popxl_addons.optimizers.adam import AdamOptimizerStep

    dtype = getattr(popxl, dtype_name)
    B, S, H, NH, V = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"], cfg["vocab"]
    hd = H // NH

    class Attention(addons.Module):
        def __init__(self):
            super().__init__()
            self.qkv = Linear(3 * H)
            self.output = Linear(H)

        def build(self, x):
            q, k, v = ops.split(self.qkv(x), 3, axis=-1)
            q = q.reshape((B, S, NH, hd)).transpose((0, 2, 1, 3))
            k = k.reshape((B, S, NH, hd)).transpose((0, 2, 3, 1))
            v = v.reshape((B, S, NH, hd)).transpose((0, 2, 1, 3))
            w = (q @ k) * (1 / math.sqrt(hd))
            w = w + popxl.constant(causal_mask(S), x.dtype, "causal_mask")
            z = ops.softmax(w, axis=-1) @ v
            return self.output(z.transpose((0, 2, 1, 3)).reshape((B * S, H)))

    class MLP(addons.Module):
        def __init__(self):
            super().__init__()
            self.fc_1 = Linear(4 * H)
            self.fc_2 = Linear(H)

        def build(self, x):
            return self.fc_2(ops.gelu(self.fc_1(x)))

    class Decoder(addons.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attention = LayerNorm(), Attention()
            self.ln_2, self.mlp = LayerNorm(), MLP()

        def build(self, x):
            x = x + self.attention(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(addons.Module):
        def __init__(self):
            super().__init__()
            self.embedding = Embedding(dtype, V, H)
            self.layers = addons.Module()
            for i in range(cfg["layers"]):
                setattr(self.layers, str(i), Decoder())
            self.ln_f = LayerNorm()
            self.head = Linear(V, bias=False)

        def build(self, tokens):
            pos = self.add_variable_input("positions", lambda: np.zeros((S, H), np.float32),
                                          dtype)
            x = (self.embedding(tokens).reshape((B, S, H)) + pos).reshape((B * S, H))
            for i in range(cfg["layers"]):
                x = getattr(self.layers, str(i))(x)
            return self.head(self.ln_f(x))

    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        tok_s = popxl.h2d_stream((B * S,), popxl.int32, "tokens")
        lab_s = popxl.h2d_stream((B * S,), popxl.int32, "labels")
        tokens, labels = ops.host_load(tok_s, "tokens"), ops.host_load(lab_s, "labels")
        facts, fwd = GPT().create_graph(tokens)
        bwd = addons.autodiff(fwd, grads_required=fwd.args.tensors)
        variables = facts.init()
        info = fwd.bind(variables).call_with_info(tokens)
        loss, dlogits = addons.ops.cross_entropy_with_grad(info.outputs[0], labels)
        bwd_info = bwd.call_with_info(dlogits, args=bwd.grad_graph_info.inputs_dict(info))
        grads = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, bwd_info)
        for name, var in variables.to_dict().items():
            g = grads[var]
            if replicas > 1:
                g = ops.collectives.replicated_all_reduce(g, op="mean")
            ofacts, ograph = AdamOptimizerStep().create_graph(
                var, g.spec, lr=LR, eps=EPS, weight_decay=0.0, first_order_dtype=dtype)
            ograph.bind(ofacts.init(f"optimizer.{name}")).call(var, g)
        loss_s = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(loss_s, ops.cast(loss, popxl.float32))
    return ir, (tok_s, lab_s, loss_s), variables


def run_popxl(args, cfg) -> Dict[str, Any]:
    import popxl

    _import_builders()
    np.random.seed(0)
    t0 = time.process_time()
    ir, (tok_s, lab_s, loss_s), variables = popxl_model(cfg, args.dtype, args.replicas)
    t1 = time.process_time()
    sess = popxl.Session(ir, "ipu_hw")
    t2 = time.process_time()
    weights = init_weights(cfg)
    npd = np.float16 if args.dtype == "float16" else np.float32
    sess.write_variables_data({variables[n]: weights[n].astype(npd) for n in weights})
    data = make_data(cfg, args.replicas)
    r = args.replicas

    def step(i):
        tok, lab = data[i % len(data)]
        if r == 1:
            tok, lab = tok[0], lab[0]
        out = sess.run({tok_s: tok, lab_s: lab})[loss_s]
        return float(np.asarray(out).reshape(-1)[0])

    with sess:
        rec = measure(step, args.steps)
    rec.update(build_s=t1 - t0, session_s=t2 - t1, compile_s=t2 - t0)
    return rec


def run_f16_pair(args, cfg) -> Dict[str, Any]:
    """The float32 and float16 programs' Sessions in this process, their steps alternating (the
    order swapped every pair): CPU time per step of each and the median of their ratios."""
    import popxl

    _import_builders()
    data = make_data(cfg, 1)
    sessions = {}
    for dt in ("float32", "float16"):
        np.random.seed(0)
        ir, (tok_s, lab_s, loss_s), variables = popxl_model(cfg, dt, 1)
        sess = popxl.Session(ir, "ipu_hw")
        npd = np.float16 if dt == "float16" else np.float32
        sess.write_variables_data({variables[n]: w.astype(npd)
                                   for n, w in init_weights(cfg).items()})
        sessions[dt] = (sess, tok_s, lab_s, loss_s)
    times: Dict[str, List[float]] = {dt: [] for dt in sessions}
    for sess, *_ in sessions.values():
        sess.__enter__()
    try:
        for i in range(WARMUP + args.steps):
            order = ("float32", "float16") if i % 2 == 0 else ("float16", "float32")
            for dt in order:
                sess, tok_s, lab_s, loss_s = sessions[dt]
                tok, lab = data[i % len(data)]
                t0 = time.process_time()
                sess.run({tok_s: tok[0], lab_s: lab[0]})
                if i >= WARMUP:
                    times[dt].append(time.process_time() - t0)
    finally:
        for sess, *_ in sessions.values():
            sess.__exit__(None, None, None)
    ratios = [b / a for a, b in zip(times["float32"], times["float16"])]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return {"f32_step_ms": 1e3 * statistics.median(times["float32"]),
            "f16_step_ms": 1e3 * statistics.median(times["float16"]),
            "ratio": statistics.median(ratios), "q1": q1, "q3": q3, "pairs": len(ratios)}


# --- PyTorch eager ------------------------------------------------------------------------------
def torch_model(cfg: Dict[str, int], weights: Dict[str, np.ndarray]):
    import torch
    from torch import nn
    from torch.nn import functional as F

    B, S, H, NH, V = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"], cfg["vocab"]
    hd = H // NH

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(H, 3 * H)
            self.output = nn.Linear(H, H)
            self.register_buffer("mask", torch.from_numpy(causal_mask(S)))

        def forward(self, x):
            q, k, v = self.qkv(x).split(H, dim=-1)
            q = q.view(B, S, NH, hd).transpose(1, 2)
            k = k.view(B, S, NH, hd).permute(0, 2, 3, 1)
            v = v.view(B, S, NH, hd).transpose(1, 2)
            w = (q @ k) * (1 / math.sqrt(hd)) + self.mask
            z = F.softmax(w, dim=-1) @ v
            return self.output(z.transpose(1, 2).reshape(B * S, H))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attention = nn.LayerNorm(H), Attention()
            self.ln_2 = nn.LayerNorm(H)
            self.fc_1, self.fc_2 = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

        def forward(self, x):
            x = x + self.attention(self.ln_1(x))
            return x + self.fc_2(F.gelu(self.fc_1(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(V, H)
            self.positions = nn.Parameter(torch.zeros(S, H))
            self.layers = nn.ModuleList([Decoder() for _ in range(cfg["layers"])])
            self.ln_f = nn.LayerNorm(H)
            self.head = nn.Linear(H, V, bias=False)

        def forward(self, tokens):
            x = (self.embedding(tokens).view(B, S, H) + self.positions).view(B * S, H)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.ln_f(x))

    model = GPT()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, w in weights.items():
            tname = name.replace("mlp.", "")
            t = torch.from_numpy(w)
            if tname.endswith("weight") and w.ndim == 2 and "embedding" not in tname:
                t = t.T                                  # popxl Linear is (in, out)
            params[tname].copy_(t)
    return model


def run_torch(args, cfg) -> Dict[str, Any]:
    import torch
    from torch.nn import functional as F

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)   # 0: PyTorch's default (one per core)
    ddp = args.ddp_world > 1
    if ddp:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.ddp_port))
        dist.init_process_group("gloo", rank=args.ddp_rank, world_size=args.ddp_world)
    import torch.optim  # noqa: F401 - its first import is slow; not part of building the model

    t0 = time.process_time()
    model = torch_model(cfg, init_weights(cfg))
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=LR, eps=EPS)
    t1 = time.process_time()
    data = make_data(cfg, args.ddp_world)
    rank = args.ddp_rank

    def step(i):
        tok, lab = data[i % len(data)]
        tok = torch.from_numpy(tok[rank].astype(np.int64))
        lab = torch.from_numpy(lab[rank].astype(np.int64))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tok), lab)
        loss.backward()
        opt.step()
        return loss.item()

    if ddp:
        torch.distributed.barrier()
    rec = measure(step, args.steps)
    if ddp:
        torch.distributed.destroy_process_group()
    rec.update(build_s=t1 - t0, session_s=0.0, compile_s=t1 - t0)
    return rec


# --- measuring ---------------------------------------------------------------------------------
def measure(step, steps: int) -> Dict[str, Any]:
    losses = [step(i) for i in range(WARMUP)]
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.perf_counter()
    for i in range(WARMUP, WARMUP + steps):
        losses.append(step(i))
    w1 = time.perf_counter()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"cpu_step_ms": 1e3 * cpu / steps, "wall_step_ms": 1e3 * (w1 - w0) / steps,
            "sys_step_ms": 1e3 * (ru1.ru_stime - ru0.ru_stime) / steps,
            "minflt_step": (ru1.ru_minflt - ru0.ru_minflt) / steps,
            "peak_rss_mb": peak_rss_mb(), "losses": losses[:3]}


def peak_rss_mb() -> float:
    """This process's peak resident memory. Linux's `ru_maxrss` keeps the forked parent's peak
    across exec, so read VmHWM (reset by exec) where there is one."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _import_builders() -> None:
    """Import what the model's builders use before the clock starts (import time is not
    compile time)."""
    import popxl_addons  # noqa: F401
    from popxl_addons.layers import Embedding, LayerNorm, Linear  # noqa: F401
    from popxl_addons.optimizers.adam import AdamOptimizerStep  # noqa: F401


def compile_only(args, cfg) -> Dict[str, Any]:
    import popxl

    _import_builders()
    np.random.seed(0)
    t0, c0 = time.perf_counter(), time.process_time()
    ir, _, _ = popxl_model(cfg, args.dtype)
    t1, c1 = time.perf_counter(), time.process_time()
    sess = popxl.Session(ir, "ipu_hw")
    t2, c2 = time.perf_counter(), time.process_time()
    del sess
    return {"build_s": c1 - c0, "session_s": c2 - c1, "compile_s": c2 - c0,
            "compile_wall_s": t2 - t0, "peak_rss_mb": peak_rss_mb()}


# --- orchestration -----------------------------------------------------------------------------
def child_env(extra: Optional[Dict[str, str]] = None, one_thread: bool = True) -> Dict[str, str]:
    """The contenders' environment: default malloc, 1 thread (`one_thread`: popxl's threads and
    the BLAS / OpenMP variables) or no thread variable at all (the libraries' and the runtime's
    defaults)."""
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_VARS + BLAS_VARS}
    if one_thread:
        env.update(ONE_THREAD)
    env.pop("POPXL_BACKEND", None)
    env.pop("POPXL_WORKERS", None)
    here = os.path.dirname(SCRIPT)
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def launch(cmd: List[str], env=None, timeout: float = 3600) -> Dict[str, Any]:
    res = subprocess.run(cmd, capture_output=True, text=True, env=env or child_env(),
                         timeout=timeout)
    for line in res.stdout.splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    raise RuntimeError(f"{' '.join(cmd)} failed (exit {res.returncode}):\n"
                       f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")


def worker_cmd(run: str, size: str, steps: int, *extra: str) -> List[str]:
    return [sys.executable, SCRIPT, "--run", run, "--size", size, "--steps", str(steps), *extra]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ddp(size: str, steps: int) -> Dict[str, Any]:
    port = str(free_port())
    procs = [subprocess.Popen(worker_cmd("torch", size, steps, "--ddp-world", "2", "--ddp-rank",
                                         str(r), "--ddp-port", port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=child_env()) for r in range(2)]
    outs = [p.communicate(timeout=3600) for p in procs]
    for line in outs[0][0].splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    raise RuntimeError(f"torch DDP failed:\n{outs[0][0][-2000:]}\n{outs[0][1][-3000:]}")


def launch_popxl_dp(size: str, steps: int, env: Optional[Dict[str, str]] = None
                    ) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "popxl_launch", "--backend", "mpi", "--workers", "2", SCRIPT,
           "--run", "popxl", "--size", size, "--steps", str(steps), "--replicas", "2"]
    return launch(cmd, env)


def have_torch() -> bool:
    """Whether torch is installed (not imported here: the contenders run in their own
    processes)."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def med(recs: List[Dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in recs)


def rel_diff(a: List[float], b: List[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def part_step(args, torch_ok: bool) -> None:
    print("\n## CPU time per training step, float32 (each contender a fresh process, "
          f"alternating, median of {args.rounds} rounds)")
    for size in args.sizes:
        steps = args.steps or STEPS[size]
        recs: Dict[str, List[Dict[str, Any]]] = {"popxl": [], "torch": []}
        names = ["popxl", "torch"] if torch_ok else ["popxl"]
        for rnd in range(args.rounds):
            for name in (names if rnd % 2 == 0 else names[::-1]):
                recs[name].append(launch(worker_cmd(name, size, steps)))
        p = recs["popxl"]
        line = (f"size {size} {SIZES[size]}: popxl {med(p, 'cpu_step_ms'):.1f} ms/step "
                f"(wall {med(p, 'wall_step_ms'):.1f}, sys {med(p, 'sys_step_ms'):.1f}, "
                f"{med(p, 'minflt_step'):.0f} minor faults/step, peak RSS "
                f"{med(p, 'peak_rss_mb'):.0f} MB, compile {med(p, 'compile_s'):.2f} s)")
        print(line)
        if torch_ok:
            t = recs["torch"]
            print(f"        torch {med(t, 'cpu_step_ms'):.1f} ms/step (wall "
                  f"{med(t, 'wall_step_ms'):.1f}, sys {med(t, 'sys_step_ms'):.1f}, "
                  f"{med(t, 'minflt_step'):.0f} minor faults/step, peak RSS "
                  f"{med(t, 'peak_rss_mb'):.0f} MB, model+optimiser {med(t, 'compile_s'):.2f} s)")
            ratios = [a["cpu_step_ms"] / b["cpu_step_ms"] for a, b in zip(p, t)]
            row(f"CPU time per step, size {size} (1 thread each)",
                f"{med(p, 'cpu_step_ms'):.1f} ms", f"torch {med(t, 'cpu_step_ms'):.1f} ms",
                med(p, "cpu_step_ms") / med(t, "cpu_step_ms"), ratios, "<= 1.0x")
            print(f"        popxl / torch CPU time per step = "
                  f"{med(p, 'cpu_step_ms') / med(t, 'cpu_step_ms'):.2f}x (same-round ratios "
                  f"{', '.join(f'{r:.2f}' for r in ratios)}); losses agree to "
                  f"{rel_diff(p[0]['losses'], t[0]['losses']):.1e} (popxl "
                  f"{p[0]['losses'][0]:.5f}, torch {t[0]['losses'][0]:.5f})")


def part_f16(args) -> None:
    print(f"\n## float16 against float32 (popxl, median of {args.rounds} rounds)")
    for size in args.sizes:
        steps = args.steps or STEPS[size]
        recs: Dict[str, List[Dict[str, Any]]] = {"float32": [], "float16": []}
        for rnd in range(args.rounds):
            for dt in (("float32", "float16") if rnd % 2 == 0 else ("float16", "float32")):
                recs[dt].append(launch(worker_cmd("popxl", size, steps, "--dtype", dt)))
        a, b = recs["float16"], recs["float32"]
        ratios = [x["cpu_step_ms"] / y["cpu_step_ms"] for x, y in zip(a, b)]
        row(f"float16 / float32 CPU time per step, size {size}", f"{med(a, 'cpu_step_ms'):.1f} ms",
            f"float32 {med(b, 'cpu_step_ms'):.1f} ms", med(a, "cpu_step_ms") / med(b, "cpu_step_ms"),
            ratios, "<= 1.3x")
        print(f"size {size}: float16 {med(a, 'cpu_step_ms'):.1f} ms/step, float32 "
              f"{med(b, 'cpu_step_ms'):.1f} ms/step: float16 / float32 = "
              f"{med(a, 'cpu_step_ms') / med(b, 'cpu_step_ms'):.2f}x (same-round "
              f"{', '.join(f'{r:.2f}' for r in ratios)}); first loss float16 "
              f"{a[0]['losses'][0]:.4f}, float32 {b[0]['losses'][0]:.4f}")


def part_f16_pair(args) -> None:
    print("\n## float16 against float32, paired in one process (popxl, 1 thread)")
    for size in args.sizes:
        r = launch(worker_cmd("f16pair", size, args.steps or PAIRS[size]))
        row(f"float16 / float32 CPU time per step, size {size}, paired in one process",
            f"{r['f16_step_ms']:.1f} ms", f"float32 {r['f32_step_ms']:.1f} ms", r["ratio"],
            None, "<= 1.3x")
        TABLE[-1]["ratio"] += f" (quartiles {r['q1']:.2f}-{r['q3']:.2f}, {r['pairs']} pairs)"
        print(f"size {size}: float16 {r['f16_step_ms']:.1f} ms/step, float32 "
              f"{r['f32_step_ms']:.1f} ms/step (medians): float16 / float32 = {r['ratio']:.2f}x "
              f"(median of {r['pairs']} step pairs; quartiles {r['q1']:.2f}-{r['q3']:.2f})")


def part_compile(args) -> None:
    layer_counts = (8, 32, 96)
    print(f"\n## IR build + Session creation (CPU time), size a unrolled (median of "
          f"{args.rounds})")
    recs: Dict[int, List[Dict[str, Any]]] = {n: [] for n in layer_counts}
    for rnd in range(args.rounds):
        for n in (layer_counts if rnd % 2 == 0 else layer_counts[::-1]):
            recs[n].append(launch(worker_cmd("compile", "a", 0, "--layers", str(n))))
    t = {n: med(recs[n], "compile_s") for n in layer_counts}
    for n in layer_counts:
        print(f"  {n:3d} layers: build {med(recs[n], 'build_s'):.2f} s + Session "
              f"{med(recs[n], 'session_s'):.2f} s = {t[n]:.2f} s, peak RSS "
              f"{med(recs[n], 'peak_rss_mb'):.0f} MB")
    s1 = math.log(t[96] / t[8]) / math.log(96 / 8)
    s2 = math.log(t[96] / t[32]) / math.log(96 / 32)
    print(f"  log-log slope 8 -> 96: {s1:.2f}; 32 -> 96: {s2:.2f}")


def part_dp(args, torch_ok: bool) -> None:
    print(f"\n## data parallel over 2 processes (popxl: 2 MPI ranks, R=2; torch: DDP gloo), "
          f"median of {args.rounds}")
    for size in [s for s in args.sizes if s in ("a", "b")]:
        steps = args.steps or STEPS[size]
        recs: Dict[str, List[Dict[str, Any]]] = {"popxl": [], "torch": []}
        for rnd in range(args.rounds):
            order = ["popxl", "torch"] if rnd % 2 == 0 else ["torch", "popxl"]
            for name in order:
                if name == "popxl":
                    recs[name].append(launch_popxl_dp(size, steps))
                elif torch_ok:
                    recs[name].append(launch_ddp(size, steps))
        samples = 2 * SIZES[size]["batch"]
        p = recs["popxl"]
        sp = samples / (med(p, "wall_step_ms") / 1e3)
        line = f"size {size}: popxl {sp:.1f} samples/s ({med(p, 'wall_step_ms'):.1f} ms/step)"
        if torch_ok:
            t = recs["torch"]
            st = samples / (med(t, "wall_step_ms") / 1e3)
            same = [b["wall_step_ms"] / a["wall_step_ms"] for a, b in zip(p, t)]
            line += (f", torch DDP {st:.1f} samples/s ({med(t, 'wall_step_ms'):.1f} ms/step): "
                     f"popxl / DDP = {sp / st:.2f}x (same-round "
                     f"{', '.join(f'{r:.2f}' for r in same)}); losses agree to "
                     f"{rel_diff(p[0]['losses'], t[0]['losses']):.1e}")
        print(line)


def part_blas(args) -> None:
    print(f"\n## an unchanged script over 2 MPI ranks (R=2): default environment (no BLAS "
          f"variable) against OPENBLAS_NUM_THREADS=1, median of {args.rounds}")
    envs = {"default": child_env(one_thread=False),
            "OPENBLAS_NUM_THREADS=1": child_env({"OPENBLAS_NUM_THREADS": "1"}, one_thread=False)}
    for size in [s for s in args.sizes if s in ("a", "b")]:
        steps = args.steps or STEPS[size]
        recs: Dict[str, List[Dict[str, Any]]] = {k: [] for k in envs}
        for rnd in range(args.rounds):
            for name in (list(envs) if rnd % 2 == 0 else list(envs)[::-1]):
                recs[name].append(launch_popxl_dp(size, steps, envs[name]))
        d, o = recs["default"], recs["OPENBLAS_NUM_THREADS=1"]
        ratios = [x["wall_step_ms"] / y["wall_step_ms"] for x, y in zip(d, o)]
        same = d[0]["losses"] == o[0]["losses"]
        print(f"size {size}: default {med(d, 'wall_step_ms'):.1f} ms/step, "
              f"OPENBLAS_NUM_THREADS=1 {med(o, 'wall_step_ms'):.1f} ms/step: default / one "
              f"thread = {med(d, 'wall_step_ms') / med(o, 'wall_step_ms'):.2f}x (same-round "
              f"{', '.join(f'{r:.2f}' for r in ratios)}); losses "
              f"{'bitwise equal' if same else 'differ'}")


def launch_default(name: str, size: str, steps: int, threads: Optional[int]) -> Dict[str, Any]:
    """One contender with `threads` threads (popxl: `POPXL_THREADS`; torch:
    `set_num_threads`), or with no thread setting at all (None: the defaults)."""
    if threads is None:
        env = child_env(one_thread=False)
        extra = ["--torch-threads", "0"] if name == "torch" else []
    else:
        env = child_env({"POPXL_THREADS": str(threads)}, one_thread=False)
        extra = ["--torch-threads", str(threads)] if name == "torch" else []
    return launch(worker_cmd(name, size, steps, *extra), env)


def part_wall(args, torch_ok: bool) -> None:
    print(f"\n## wall time per training step with default settings (no thread setting: "
          f"popxl-dist's and PyTorch's own defaults), median of {args.rounds} rounds")
    for size in args.sizes:
        steps = args.steps or STEPS[size]
        names = ["popxl", "torch"] if torch_ok else ["popxl"]
        recs: Dict[str, List[Dict[str, Any]]] = {n: [] for n in names}
        for rnd in range(args.rounds):
            for name in (names if rnd % 2 == 0 else names[::-1]):
                recs[name].append(launch_default(name, size, steps, None))
        p = recs["popxl"]
        line = (f"size {size}: popxl {med(p, 'wall_step_ms'):.1f} ms/step "
                f"(CPU {med(p, 'cpu_step_ms'):.1f})")
        if torch_ok:
            t = recs["torch"]
            ratios = [a["wall_step_ms"] / b["wall_step_ms"] for a, b in zip(p, t)]
            ratio = med(p, "wall_step_ms") / med(t, "wall_step_ms")
            line += (f", torch {med(t, 'wall_step_ms'):.1f} ms/step (CPU "
                     f"{med(t, 'cpu_step_ms'):.1f}): popxl / torch = {ratio:.2f}x (same-round "
                     f"{', '.join(f'{r:.2f}' for r in ratios)}); losses agree to "
                     f"{rel_diff(p[0]['losses'], t[0]['losses']):.1e}")
            row(f"wall time per step, size {size}, default settings",
                f"{med(p, 'wall_step_ms'):.1f} ms", f"torch {med(t, 'wall_step_ms'):.1f} ms",
                ratio, ratios, "<= 0.9x")
        print(line)


def amdahl(t1: float, t2: float) -> float:
    """The parallel fraction p of a run taking t1 on 1 thread and t2 on 2 (Amdahl's law:
    t2 = t1 * ((1 - p) + p / 2)), clipped to [0, 1]."""
    return min(1.0, max(0.0, 2.0 * (1.0 - t2 / t1)))


def projected(t1: float, p: float, cores: int) -> float:
    return t1 * ((1.0 - p) + p / cores)


def part_scaling(args, torch_ok: bool) -> None:
    print(f"\n## scaling 1 -> 2 threads (wall time per step; popxl POPXL_THREADS, torch "
          f"set_num_threads), median of {args.rounds} rounds; projected to 8 and 16 cores by "
          f"Amdahl's law from the parallel fraction p the two runs imply")
    names = ["popxl", "torch"] if torch_ok else ["popxl"]
    for size in args.sizes:
        steps = args.steps or STEPS[size]
        recs: Dict[tuple, List[Dict[str, Any]]] = {(n, t): [] for n in names for t in (1, 2)}
        order = list(recs)
        for rnd in range(args.rounds):
            for key in (order if rnd % 2 == 0 else order[::-1]):
                recs[key].append(launch_default(key[0], size, steps, key[1]))
        for name in names:
            t1, t2 = med(recs[(name, 1)], "wall_step_ms"), med(recs[(name, 2)], "wall_step_ms")
            p = amdahl(t1, t2)
            t8, t16 = projected(t1, p, 8), projected(t1, p, 16)
            same = recs[(name, 1)][0]["losses"] == recs[(name, 2)][0]["losses"]
            print(f"size {size} {name:5s}: 1 thread {t1:.1f} ms/step, 2 threads {t2:.1f} ms/step "
                  f"(speed-up {t1 / t2:.2f}x, p = {p:.2f}); projected 8 cores {t8:.1f}, 16 cores "
                  f"{t16:.1f} ms/step; losses 1 vs 2 threads "
                  f"{'bitwise equal' if same else 'differ'}")
            row(f"scaling, size {size}, {name}: 1 -> 2 threads", f"{t1:.1f} -> {t2:.1f} ms",
                f"p = {p:.2f}; 8 / 16 cores: {t8:.1f} / {t16:.1f} ms", t1 / t2, None, "",
                ratio_word="speed-up")


def row(figure: str, popxl: str, reference: str, ratio: Optional[float],
        ratios: Optional[List[float]], target: str, ratio_word: str = "") -> None:
    """One line of the --markdown table."""
    r = "" if ratio is None else f"{ratio:.2f}x"
    if ratios:
        r += f" (rounds {min(ratios):.2f}-{max(ratios):.2f})"
    if ratio_word and r:
        r = f"{ratio_word} {r}"
    TABLE.append({"figure": figure, "popxl": popxl, "reference": reference, "ratio": r,
                  "target": target})


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                         "")
    except OSError:
        pass
    return f"{model or 'unknown CPU'}, {os.cpu_count()} cores"


def markdown(header: str, load_start, load_end) -> str:
    lines = [f"Measured by `python benchmarks/bench_transformer.py {' '.join(sys.argv[1:])}` on "
             f"{machine()}; {header}; load average {load_start[0]:.2f} at the start, "
             f"{load_end[0]:.2f} at the end (figures count on a quiet machine: below 1).", "",
             "| figure | popxl-dist | same-run reference | ratio | target |",
             "|---|---|---|---|---|"]
    for r in TABLE:
        lines.append(f"| {r['figure']} | {r['popxl']} | {r['reference']} | {r['ratio']} | "
                     f"{r['target']} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parts = ["step", "f16", "f16pair", "compile", "dp", "blas", "wall", "scaling"]
    p.add_argument("--parts", nargs="+", default=parts, choices=parts)
    p.add_argument("--markdown", action="store_true",
                   help="end with a Markdown table of the figures (machine and load average)")
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=0, help="measured steps per run (0: per size)")
    # worker mode
    p.add_argument("--run", choices=["popxl", "torch", "compile", "f16pair"])
    p.add_argument("--size", default="a", choices=list(SIZES))
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--ddp-world", type=int, default=1)
    p.add_argument("--ddp-rank", type=int, default=0)
    p.add_argument("--ddp-port", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=1,
                   help="worker mode: torch.set_num_threads (0: PyTorch's default)")
    args = p.parse_args(argv)
    if args.run:
        cfg = dict(SIZES[args.size])
        if args.layers:
            cfg["layers"] = args.layers
        args.steps = args.steps or (PAIRS if args.run == "f16pair" else STEPS)[args.size]
        fn = {"popxl": run_popxl, "torch": run_torch, "compile": compile_only,
              "f16pair": run_f16_pair}[args.run]
        rec = fn(args, cfg)
        if args.run != "torch" or args.ddp_rank == 0:
            emit(rec)
        return
    torch_ok = have_torch()
    from importlib.metadata import version

    load_start = os.getloadavg()
    header = (f"numpy {np.__version__}, "
              f"{'torch ' + version('torch') if torch_ok else 'torch not installed'}")
    print(f"bench_transformer: {header}; load average {load_start[0]:.2f} {load_start[1]:.2f} "
          f"{load_start[2]:.2f}; {machine()}")
    if "step" in args.parts:
        part_step(args, torch_ok)
    if "f16" in args.parts:
        part_f16(args)
    if "f16pair" in args.parts:
        part_f16_pair(args)
    if "compile" in args.parts:
        part_compile(args)
    if "dp" in args.parts:
        part_dp(args, torch_ok)
    if "blas" in args.parts:
        part_blas(args)
    if "wall" in args.parts:
        part_wall(args, torch_ok)
    if "scaling" in args.parts:
        part_scaling(args, torch_ok)
    load_end = os.getloadavg()
    print(f"\nload average at the end: {load_end[0]:.2f}")
    if args.markdown:
        print("\n" + markdown(header, load_start, load_end))


if __name__ == "__main__":
    main()
