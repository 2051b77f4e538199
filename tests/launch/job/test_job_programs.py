"""The main job's programs against independent references: `SGDStep` against NumPy
(torch.optim.SGD's update), two training steps of the data-parallel program (replicas,
accumulation, loss scaling, SGD or Adam) against the MLP's backpropagation and torch.optim's
SGD / Adam updates written in NumPy, RTS training bit for bit equal to unsharded training, and
the test program's predictions after the weight copy."""
from __future__ import annotations

import numpy as np
import popxl
import popxl_addons as addons
import pytest
from popxl import ops

import references as ref

from popxl_launch.job.config import resolve
from popxl_launch.job.loop import evaluate
from popxl_launch.job.programs import SGDStep, build_test_program, build_train_program


def _sgd_program(replicas: int, sharded: bool, **kwargs):
    """A variable updated by SGDStep with a streamed gradient each run."""
    ir = popxl.Ir(replication=replicas)
    init = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    with ir.main_graph:
        if sharded:
            var, target = popxl.replica_sharded_variable(init, popxl.float32, "w")
        else:
            var = target = popxl.variable(init, popxl.float32, "w")
        stream = popxl.h2d_stream(target.shape, popxl.float32, "g")
        grad = ops.host_load(stream)
        facts, graph = SGDStep().create_graph(target, target.spec, **kwargs)
        if sharded and facts.keys_flat():       # a sharded velocity lives in a remote buffer
            buffers = addons.named_variable_buffers(facts, shard_over_dict=False)
            facts.init_remote(buffers)
            load, names = addons.load_remote_graph(buffers)
            state = addons.NamedTensors.pack(names, load.call(0))
            graph.bind(state).call(target, grad)
            addons.store_remote_graph(buffers).bind(state).call(0)
        else:
            graph.bind(facts.init()).call(target, grad)
    return popxl.Session(ir, "ipu_hw"), var, stream, init


def _sgd_reference(w, grads, lr, momentum=0.0, weight_decay=0.0, loss_scaling=1.0):
    """torch.optim.SGD (dampening 0, no Nesterov) on the unscaled gradients."""
    v = np.zeros_like(w, dtype=np.float64)
    w = w.astype(np.float64)
    for g in grads:
        g = g / loss_scaling + weight_decay * w
        if momentum:
            v = momentum * v + g
            g = v
        w = w - lr * g
    return w


@pytest.mark.parametrize("kwargs", [
    dict(lr=0.1), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, weight_decay=0.01),
    dict(lr=0.1, momentum=0.5, loss_scaling=64.0)])
@pytest.mark.parametrize("replicas, sharded", [(1, False), (2, True)])
def test_sgd_step_matches_reference(kwargs, replicas, sharded):
    session, var, stream, init = _sgd_program(replicas, sharded, **kwargs)
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(3, 4)).astype(np.float32) * kwargs.get("loss_scaling", 1.0)
             for _ in range(3)]
    with session:
        for g in grads:
            if sharded:     # every replica feeds its own shard (3 x 4 = 12 over 2 replicas)
                feed = g.reshape(2, 6)
            else:
                feed = g
            session.run({stream: feed})
        got = session.get_tensor_data(var)
    np.testing.assert_allclose(got, _sgd_reference(init, grads, **kwargs), rtol=1e-5,
                               atol=1e-6)


TINY = {"model": {"hidden": [16, 12]}, "train": {"replicas": 2, "accumulation": 2,
                                                 "global_batch": 16},
        "test": {"batch_size": 10}}


def _merge(base, extra):
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for k, v in extra.items():
        out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) else v
    return out


def _run_steps(cfg, batches):
    program = build_train_program(cfg)
    session = program.session
    with session:
        before = {k: np.array(v) for k, v in
                  session.get_tensors_data(program.weights.tensors).items()}
        losses = []
        for x, y in batches:
            out = session.run({session.inputs.images: x, session.inputs.labels: y})
            losses.append(out[session.outputs.loss])
        after = session.get_tensors_data(program.weights.tensors)
    key = {t: t.name for t in program.weights.tensors}
    return ({key[t]: a for t, a in before.items()}, {key[t]: np.array(a) for t, a in
                                                     after.items()}, losses, program)


def _batches(cfg, n, seed=0):
    rng = np.random.default_rng(seed)
    A, R, mb = cfg.train.accumulation, cfg.train.replicas, cfg.micro_batch
    lead = tuple(d for d in (A, R) if d > 1)
    return [(rng.normal(size=lead + (mb, 784)).astype(np.float32),
             rng.integers(0, 10, size=lead + (mb,)).astype(np.int32)) for _ in range(n)]


def _mlp_loss_and_grads(params, x, y, activation):
    """Mean cross entropy of the MLP (x @ W + b per layer, the activation between layers) and
    its gradients w.r.t. params, by backpropagation in float64."""
    act, dact = ((lambda z: ref.gelu_tanh(z), lambda z: ref.gelu_tanh(z, 1))
                 if activation == "gelu" else
                 (lambda z: np.maximum(z, 0), lambda z: (z > 0).astype(np.float64)))
    n_layers = len(params) // 2
    hs, zs = [x.astype(np.float64)], []
    for i in range(n_layers):
        zs.append(hs[-1] @ params[2 * i] + params[2 * i + 1])
        hs.append(act(zs[-1]) if i < n_layers - 1 else zs[-1])
    loss, dz = ref.cross_entropy(hs[-1], y, "mean", dloss=1.0)
    grads = [None] * len(params)
    for i in reversed(range(n_layers)):
        grads[2 * i], grads[2 * i + 1] = hs[i].T @ dz, dz.sum(0)
        if i:
            dz = (dz @ params[2 * i].T) * dact(zs[i - 1])
    return loss, grads


class _TorchOptimizer:
    """torch.optim.SGD (momentum, L2 weight decay, dampening 0) and torch.optim.Adam (bias
    corrections, eps added to the corrected sqrt(v)), as their documentation defines them."""

    def __init__(self, params, train):
        self.params, self.t, self.kind = params, 0, train.optimizer
        self.hp = getattr(train, train.optimizer)
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, grads):
        self.t += 1
        hp = self.hp
        for k, (p, g) in enumerate(zip(self.params, grads)):
            g = g + hp.weight_decay * p
            if self.kind == "sgd":
                self.m[k] = hp.momentum * self.m[k] + g if hp.momentum else g
                p -= hp.lr * self.m[k]
            else:
                self.m[k] = hp.beta1 * self.m[k] + (1 - hp.beta1) * g
                self.v[k] = hp.beta2 * self.v[k] + (1 - hp.beta2) * g * g
                denom = np.sqrt(self.v[k]) / np.sqrt(1 - hp.beta2 ** self.t) + hp.eps
                p -= hp.lr / (1 - hp.beta1 ** self.t) * self.m[k] / denom


@pytest.mark.parametrize("extra", [
    {"train": {"optimizer": "sgd", "sgd": {"lr": 0.1, "momentum": 0.9}}},
    {"train": {"optimizer": "sgd", "loss_scaling": 128.0, "sgd": {"lr": 0.1, "momentum": 0.0,
                                                                  "weight_decay": 0.01}}},
    {"train": {"optimizer": "adam", "adam": {"lr": 0.01}}},
    {"model": {"activation": "relu"}, "train": {"optimizer": "adam", "loss_scaling": 16.0,
                                                "adam": {"lr": 0.01}}},
])
def test_training_steps_match_reference(extra):
    """Two optimiser steps: the mean loss over all replicas and micro batches, backpropagated
    through the MLP, updated as torch's optimiser does (all in NumPy, float64)."""
    cfg = resolve(_merge(TINY, extra))
    batches = _batches(cfg, 2)
    before, after, losses, _ = _run_steps(cfg, batches)
    n_layers = len(cfg.model.hidden) + 1
    params = []
    for i in range(1, n_layers + 1):
        params += [before[f"fc{i}.weight"].astype(np.float64),
                   before[f"fc{i}.bias"].astype(np.float64)]
    opt = _TorchOptimizer(params, cfg.train)
    for (x, y), loss in zip(batches, losses):
        want, grads = _mlp_loss_and_grads(params, x.reshape(-1, 784), y.reshape(-1),
                                          cfg.model.activation)
        np.testing.assert_allclose(np.mean(loss), want, rtol=1e-5)
        opt.step(grads)
    for i in range(1, n_layers + 1):
        for j, name in enumerate(("weight", "bias")):
            np.testing.assert_allclose(after[f"fc{i}.{name}"], params[2 * (i - 1) + j],
                                       rtol=2e-4, atol=2e-6, err_msg=f"fc{i}.{name}")


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_rts_training_is_bitwise_unsharded_training(optimizer):
    """Sharded weights (reduce-scatter, per-shard updates, state in remote buffers) give the
    same bits as on-chip weights with all-reduce."""
    base = _merge(TINY, {"model": {"hidden": [32, 16]},
                         "train": {"replicas": 4, "optimizer": optimizer, "rts_threshold": 64,
                                   "adam": {"lr": 0.01}},
                         "test": {"batch_size": 20}})
    plain = resolve(base)
    rts = resolve(_merge(base, {"train": {"rts": True}}))
    batches = _batches(plain, 3, seed=1)
    _, want, _, _ = _run_steps(plain, batches)
    _, got, _, program = _run_steps(rts, batches)
    assert program.sharded_keys == ("fc1.weight", "fc2.weight", "fc3.weight")
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k
    moments = [k for k in program.session.state.keys_flat() if "order" in k or "velocity" in k]
    assert moments                             # the optimiser state is checkpointed


@pytest.mark.parametrize("rts", [False, True])
def test_test_program_predicts_with_the_copied_weights(rts):
    cfg = resolve(_merge(TINY, {"train": {"replicas": 2, "rts": rts, "rts_threshold": 64}}))
    train = build_train_program(cfg)
    test = build_test_program(cfg, train.sharded_keys)
    rng = np.random.default_rng(2)
    images = rng.normal(size=(25, 784)).astype(np.float32)
    with train.session, test.session:
        train.session.run(dict(zip(train.session.inputs, _batches(cfg, 1)[0])))
        w = {t.name: np.array(a) for t, a in
             train.session.get_tensors_data(train.weights.tensors).items()}
        h = images
        for i in (1, 2, 3):
            h = h @ w[f"fc{i}.weight"] + w[f"fc{i}.bias"]
            if i < 3:
                h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        want = np.argmax(h, axis=1)
        labels = want.astype(np.int32).copy()
        labels[:5] = (labels[:5] + 1) % 10            # 5 wrong of 25: 80%
        acc, copy_s = evaluate(train, test, images, labels, cfg.test.batch_size)
    assert acc == pytest.approx(80.0) and copy_s >= 0
