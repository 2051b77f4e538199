"""Training-step speed of the seed tutorial's MLP on the emulator, against the same step written by
hand in NumPy and against PyTorch eager (when installed).

MLP 784-512-512-512-10, GELU (tanh), softmax cross entropy, SGD (lr 0.05), random inputs.
Each contender runs in a fresh process (1 thread: popxl's and BLAS / OpenMP's; default malloc),
the contenders alternate round by round; prints steps/s (median over rounds) and ratios, plus the
Session compile time (`--markdown`: also a table with the machine and the load average). (In one process, torch's OpenMP threads and allocator settings slow the emulator
down: measured 746 -> 250 steps/s at batch 8.)

    python benchmarks/bench_mlp.py [--steps 300] [--rounds 5] [--batch-sizes 8 128] [--addons]
    python benchmarks/bench_mlp.py --run emulator --batch 8     # one contender, one JSON line
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List

import numpy as np

import popxl
import popxl.ops as ops
from popxl import transforms

SIZES = [784, 512, 512, 512, 10]
LR = 0.05


def init_weights(seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(0, 0.02, (i, o)).astype(np.float32), np.zeros(o, np.float32))
            for i, o in zip(SIZES[:-1], SIZES[1:])]


# --- the emulator (plain popxl, as in the user guide) -----------------------------------------
def build_popxl(batch: int, weights, replicas: int = 1, all_reduce: bool = False):
    """The training step; with `all_reduce`, each gradient is averaged over the `replicas`
    replicas before the SGD update (bench_replication's data-parallel variant)."""
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        x_s = popxl.h2d_stream((batch, 28, 28), popxl.float32, "image")
        l_s = popxl.h2d_stream((batch,), popxl.int32, "labels")
        x = ops.host_load(x_s, "x")
        labels = ops.host_load(l_s, "labels")
        params = []
        for i, (w, b) in enumerate(weights):
            params += [popxl.variable(w, name=f"W{i}"), popxl.variable(b, name=f"b{i}")]

        def net(x, *p):
            h = x.reshape((-1, 784))
            for i in range(4):
                h = h @ p[2 * i] + p[2 * i + 1]
                if i < 3:
                    h = ops.gelu(h)
            return h

        g = ir.create_graph(net, x, *params)
        bwd = transforms.autodiff(g, grads_required=g.inputs[1:])
        info = ops.call_with_info(g, x, *params)
        logits = info.outputs[0]
        loss, dlogits = ops.nll_loss_with_softmax_grad(ops.softmax(logits, -1), labels)
        grads = ops.call(bwd.graph, dlogits, inputs_dict=bwd.inputs_dict(info))
        for p, gp in zip(params, grads):
            if all_reduce:
                ops.collectives.replicated_all_reduce_(gp, op="mean")
            ops.scaled_add_(p, gp, b=-LR)
        loss_s = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(loss_s, loss)
    return ir, x_s, l_s, loss_s


def build_addons(batch: int, weights):
    import popxl_addons as addons

    class Linear(addons.Module):
        def __init__(self, out_features: int):
            super().__init__()
            self.out_features = out_features

        def build(self, x):
            w = self.add_variable_input("weight", lambda: np.zeros((x.shape[-1], self.out_features),
                                                                   np.float32), x.dtype)
            b = self.add_variable_input("bias", lambda: np.zeros(self.out_features, np.float32),
                                        x.dtype)
            return x @ w + b

    class Net(addons.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3, self.fc4 = (Linear(512), Linear(512), Linear(512),
                                                      Linear(10))

        def build(self, x):
            x = x.reshape((-1, 784))
            x = ops.gelu(self.fc1(x))
            x = ops.gelu(self.fc2(x))
            x = ops.gelu(self.fc3(x))
            return self.fc4(x)

    ir = popxl.Ir()
    with ir.main_graph:
        x_s = popxl.h2d_stream((batch, 28, 28), popxl.float32, "image")
        l_s = popxl.h2d_stream((batch,), popxl.int32, "labels")
        x = ops.host_load(x_s, "x")
        labels = ops.host_load(l_s, "labels")
        facts, fwd = Net().create_graph(x)
        bwd = addons.autodiff(fwd)
        variables = facts.init()
        info = fwd.bind(variables).call_with_info(x)
        loss, dx = addons.ops.cross_entropy_with_grad(info.outputs[0], labels)
        bwd_info = bwd.call_with_info(dx, args=bwd.grad_graph_info.inputs_dict(info))
        grads = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, bwd_info)
        for t in variables.tensors:
            ops.scaled_add_(t, grads[t], b=-LR)
        loss_s = popxl.d2h_stream((), popxl.float32, "loss")
        ops.host_store(loss_s, loss)
    return ir, x_s, l_s, loss_s, variables


def popxl_stepper(batch: int, weights, addons: bool):
    t0 = time.perf_counter()
    if addons:
        ir, x_s, l_s, loss_s, variables = build_addons(batch, weights)
    else:
        ir, x_s, l_s, loss_s = build_popxl(batch, weights)
    t1 = time.perf_counter()
    sess = popxl.Session(ir, "ipu_hw")
    t2 = time.perf_counter()
    if addons:
        names = [f"fc{i + 1}.{n}" for i in range(4) for n in ("weight", "bias")]
        flat = [a for wb in weights for a in wb]
        sess.write_variables_data({variables.get(n): a for n, a in zip(names, flat)})
    sess.__enter__()

    def step(x, y):
        return sess.run({x_s: x, l_s: y})[loss_s]

    return step, (t1 - t0, t2 - t1)


# --- the same step by hand in NumPy -----------------------------------------------------------
_K = np.float32(np.sqrt(2 / np.pi))
_C = np.float32(0.044715)


def numpy_stepper(weights):
    params = [(w.copy(), b.copy()) for w, b in weights]

    def step(x, y):
        h = x.reshape(x.shape[0], -1)
        acts = []
        for i, (w, b) in enumerate(params):
            z = h @ w + b
            if i < 3:
                u = _K * (z + _C * z * z * z)
                t = np.tanh(u)
                acts.append((h, z, t))
                h = 0.5 * z * (1 + t)
            else:
                acts.append((h, None, None))
                h = z
        e = np.exp(h - h.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        n = x.shape[0]
        loss = -np.mean(np.log(p[np.arange(n), y] + 1e-7))
        d = p
        d[np.arange(n), y] -= 1
        d /= n
        for i in reversed(range(4)):
            h_in, z, t = acts[i]
            w, b = params[i]
            if z is not None:
                dg = 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _K * (1 + 3 * _C * z * z)
                d = d * dg
            dw = h_in.T @ d
            db = d.sum(axis=0)
            if i:
                d = d @ w.T
            w -= LR * dw
            b -= LR * db
        return loss

    return step


# --- PyTorch eager ----------------------------------------------------------------------------
def torch_stepper(weights):
    import torch

    layers = []
    for i, (w, b) in enumerate(weights):
        lin = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.T.copy()))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if i < 3:
            layers.append(torch.nn.GELU(approximate="tanh"))
    model = torch.nn.Sequential(torch.nn.Flatten(), *layers)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        xt = torch.from_numpy(x)
        yt = torch.from_numpy(y.astype(np.int64))
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def measure(step: Callable, data, steps: int) -> tuple:
    """(steps per second of wall time, steps per second of this process's CPU time: the
    figure that other jobs on a busy machine disturb less)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(steps):
        x, y = data[i % len(data)]
        step(x, y)
    return steps / (time.perf_counter() - t0), steps / (time.process_time() - c0)


TAG = "BENCH_JSON "
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "POPXL_THREADS": "1"}
MALLOC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX",
               "MALLOC_TOP_PAD_", "LD_PRELOAD")


def make_data(batch: int):
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(batch, 28, 28)).astype(np.float32),
             rng.integers(0, 10, batch).astype(np.int32)) for _ in range(16)]


def run_one(name: str, batch: int, steps: int, addons: bool) -> dict:
    """One contender in this process: warm-up, then `steps` timed steps."""
    data = make_data(batch)
    weights = init_weights()
    build_s = compile_s = 0.0
    if name == "emulator":
        step, (build_s, compile_s) = popxl_stepper(batch, weights, addons)
    elif name == "numpy":
        step = numpy_stepper(weights)
    else:
        import torch

        torch.set_num_threads(1)
        step = torch_stepper(weights)
    first = float(step(*data[0]))
    for i in range(1, 11):
        step(*data[i % len(data)])
    rate, cpu_rate = measure(step, data, steps)
    return {"steps_per_s": rate, "steps_per_cpu_s": cpu_rate, "first_loss": first,
            "build_s": build_s,
            "compile_s": compile_s}


def launch(name: str, batch: int, steps: int, addons: bool) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in MALLOC_VARS}
    env.update(ONE_THREAD)
    env.pop("POPXL_BACKEND", None)
    env.pop("POPXL_WORKERS", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--run", name, "--batch", str(batch),
           "--steps", str(steps)] + (["--addons"] if addons else [])
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in res.stdout.splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    raise RuntimeError(f"{name} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")


def main(argv: List[str] = None) -> None:
    import json
    import os
    import sys

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="timed steps per contender per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 128])
    p.add_argument("--addons", action="store_true", help="build the program with popxl_addons")
    p.add_argument("--run", choices=["emulator", "numpy", "torch"], help="worker mode")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--markdown", action="store_true",
                   help="end with a Markdown table of the figures (machine and load average)")
    args = p.parse_args(argv)
    if args.run:
        print(TAG + json.dumps(run_one(args.run, args.batch, args.steps, args.addons)),
              flush=True)
        return
    import importlib.util
    from importlib.metadata import version

    have_torch = importlib.util.find_spec("torch") is not None   # imported by its contender only
    torch_info = f"torch {version('torch')}" if have_torch else "torch not installed"
    load = os.getloadavg()
    print(f"MLP {'-'.join(map(str, SIZES))}, GELU, softmax CE, SGD; {args.steps} steps x "
          f"{args.rounds} rounds, each contender a fresh process, alternating; 1 BLAS thread; "
          f"numpy {np.__version__}; {torch_info}; program built with "
          f"{'popxl_addons' if args.addons else 'plain popxl'}; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    names = ["emulator", "numpy"] + (["torch"] if have_torch else [])
    rows = []
    for batch in args.batch_sizes:
        recs: Dict[str, List[dict]] = {k: [] for k in names}
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            for name in order:
                recs[name].append(launch(name, batch, args.steps, args.addons))
        med = {k: statistics.median(r["steps_per_s"] for r in v) for k, v in recs.items()}
        emu = recs["emulator"][0]
        print(f"\nbatch {batch}: build {emu['build_s'] * 1e3:.0f} ms, Session compile "
              f"{emu['compile_s'] * 1e3:.0f} ms; first-step loss "
              + ", ".join(f"{k} {v[0]['first_loss']:.5f}" for k, v in recs.items()))
        for k in names:
            rates = [r["steps_per_s"] for r in recs[k]]
            print(f"  {k:9s} {med[k]:8.1f} steps/s  (median of {args.rounds}, range "
                  f"[{min(rates):.0f}-{max(rates):.0f}])")
        cpu = {k: statistics.median(r["steps_per_cpu_s"] for r in v) for k, v in recs.items()}
        print("  per second of CPU time: " + ", ".join(f"{k} {cpu[k]:.1f}" for k in names))
        print(f"  emulator / numpy = {med['emulator'] / med['numpy']:.2f}x")
        if have_torch:
            same = [e["steps_per_s"] / t["steps_per_s"]
                    for e, t in zip(recs["emulator"], recs["torch"])]
            print(f"  emulator / torch = {med['emulator'] / med['torch']:.2f}x (same-round "
                  f"{', '.join(f'{r:.2f}' for r in same)}); per CPU second "
                  f"{cpu['emulator'] / cpu['torch']:.2f}x")
            rows.append(f"| `bench_mlp.py{' --addons' if args.addons else ''}` batch {batch} "
                        f"| {med['emulator']:.1f} steps/s ({cpu['emulator']:.0f} per CPU s) "
                        f"| torch {med['torch']:.1f} ({cpu['torch']:.0f} per CPU s) "
                        f"| {med['emulator'] / med['torch']:.2f}x (rounds {min(same):.2f}-"
                        f"{max(same):.2f}; per CPU s {cpu['emulator'] / cpu['torch']:.2f}x) "
                        f"| >= 1.2x |")
    end = os.getloadavg()
    print(f"\nload average at the end: {end[0]:.2f}")
    if args.markdown:
        from bench_transformer import machine
        print(f"\nMeasured by `python benchmarks/bench_mlp.py {' '.join(sys.argv[1:])}` on "
              f"{machine()}; numpy {np.__version__}, {torch_info}; 1 thread each; load average "
              f"{load[0]:.2f} at the start, {end[0]:.2f} at the end (figures count on a quiet "
              f"machine: below 1).\n")
        print("| figure | popxl-dist | same-run reference | ratio | target |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(r)


if __name__ == "__main__":
    main()
