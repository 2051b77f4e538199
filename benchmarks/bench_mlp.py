"""Training-step speed of the seed tutorial's MLP on the emulator, against the same step written by
hand in NumPy and against PyTorch eager (when installed), measured alternately in one run.

MLP 784-512-512-512-10, GELU (tanh), softmax cross entropy, SGD (lr 0.05), random inputs.
Prints steps/s (median over rounds) and ratios, plus the Session compile time.

    python benchmarks/bench_mlp.py [--steps 100] [--rounds 5] [--batch-sizes 8 128] [--addons]
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


def measure(step: Callable, data, steps: int) -> float:
    t0 = time.perf_counter()
    for i in range(steps):
        x, y = data[i % len(data)]
        step(x, y)
    return steps / (time.perf_counter() - t0)


def main(argv: List[str] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="steps per implementation per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 128])
    p.add_argument("--addons", action="store_true", help="build the program with popxl_addons")
    args = p.parse_args(argv)
    try:
        import torch

        have_torch = True
        torch_info = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    except ImportError:
        have_torch = False
        torch_info = "torch not installed"
    print(f"MLP {'-'.join(map(str, SIZES))}, GELU, softmax CE, SGD; {args.steps} steps x "
          f"{args.rounds} rounds, alternating; numpy {np.__version__}; {torch_info}; "
          f"program built with {'popxl_addons' if args.addons else 'plain popxl'}")
    rng = np.random.default_rng(0)
    for batch in args.batch_sizes:
        data = [(rng.normal(size=(batch, 28, 28)).astype(np.float32),
                 rng.integers(0, 10, batch).astype(np.int32)) for _ in range(16)]
        weights = init_weights()
        emu, (build_s, compile_s) = popxl_stepper(batch, weights, args.addons)
        impls: Dict[str, Callable] = {"emulator": emu, "numpy": numpy_stepper(weights)}
        if have_torch:
            impls["torch"] = torch_stepper(weights)
        # same weights, same data: the first losses agree
        first = {k: float(f(*data[0])) for k, f in impls.items()}
        rates: Dict[str, List[float]] = {k: [] for k in impls}
        for _ in range(args.rounds):
            for name, step in impls.items():
                rates[name].append(measure(step, data, args.steps))
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(f"\nbatch {batch}: build {build_s * 1e3:.0f} ms, Session compile "
              f"{compile_s * 1e3:.0f} ms; first-step loss "
              + ", ".join(f"{k} {v:.5f}" for k, v in first.items()))
        for k in impls:
            spread = f"[{min(rates[k]):.0f}-{max(rates[k]):.0f}]"
            print(f"  {k:9s} {med[k]:8.1f} steps/s  (median of {args.rounds}, range {spread})")
        print(f"  emulator / numpy = {med['emulator'] / med['numpy']:.2f}x")
        if have_torch:
            print(f"  emulator / torch = {med['emulator'] / med['torch']:.2f}x")


if __name__ == "__main__":
    main()
