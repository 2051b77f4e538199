"""Test helpers: build a tiny program around some ops, run it, and check gradients.

`run_ops(fn, *arrays)`: each array becomes an h2d stream + host_load; `fn(*tensors)` builds ops in
the main graph and returns a Tensor or a tuple of Tensors; each is host_stored. Returns NumPy arrays.

`grads(fn, arrays, dys)`: builds `fn` as a subgraph, differentiates it with
`popxl.transforms.autodiff`, and returns (outputs, input gradients) for output gradients `dys`.

`numeric_grads(fn, arrays, dys)`: central finite differences of sum(out_i * dy_i) in float64.

`check_forward(fn, ref, shapes, dtype)` / `check_grads(fn, ref, shapes)`: `fn` on random inputs
against a NumPy reference in float64 / its gradients against finite differences.

`replicated_grads(fn, R, arrays, dys)`: `grads` on R replicas: `arrays` and `dys` carry a leading
replica axis (one value per replica), and so do the results. The OpToIdentity pattern is applied
to every graph (as `popxl_addons.patterns.apply_pre_alias_patterns` does).
"""
from __future__ import annotations

from typing import Callable, List, Sequence

import numpy as np

import popxl
import popxl.ops as ops


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def run_ops(fn: Callable, *arrays: np.ndarray) -> List[np.ndarray]:
    ir = popxl.Ir()
    with ir.main_graph:
        streams = [popxl.h2d_stream(a.shape, popxl.dtype.as_dtype(a.dtype), f"in{i}")
                   for i, a in enumerate(arrays)]
        ts = [ops.host_load(s, f"in{i}") for i, s in enumerate(streams)]
        outs = _as_tuple(fn(*ts))
        d2h = []
        for i, o in enumerate(outs):
            s = popxl.d2h_stream(o.shape, o.dtype, f"out{i}")
            ops.host_store(s, o)
            d2h.append(s)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run(dict(zip(streams, arrays)))
    return [res[s] for s in d2h]


def grads(fn: Callable, arrays: Sequence[np.ndarray], dys: Sequence[np.ndarray]):
    """(outputs, grads of every input) of `fn` through autodiff; ints get no gradient."""
    ir = popxl.Ir()
    arrays = list(arrays)
    with ir.main_graph:
        specs = [popxl.TensorSpec(a.shape, popxl.dtype.as_dtype(a.dtype)) for a in arrays]
        g = ir.create_graph(lambda *xs: fn(*xs), *specs)
        required = [t for t in g.inputs if t.dtype.is_floating_point]
        bwd = popxl.transforms.autodiff(g, grads_required=required)
        streams = [popxl.h2d_stream(a.shape, popxl.dtype.as_dtype(a.dtype), f"in{i}")
                   for i, a in enumerate(arrays)]
        ts = [ops.host_load(s, f"in{i}") for i, s in enumerate(streams)]
        info = ops.call_with_info(g, *ts)
        n_out = len(dys)
        outs = info.outputs[:n_out]
        dy_streams = [popxl.h2d_stream(d.shape, popxl.dtype.as_dtype(d.dtype), f"dy{i}")
                      for i, d in enumerate(dys)]
        dy_ts = [ops.host_load(s, f"dy{i}") for i, s in enumerate(dy_streams)]
        gouts = ops.call(bwd.graph, *dy_ts, inputs_dict=bwd.inputs_dict(info))
        d2h = []
        for i, o in enumerate(list(outs) + list(gouts)):
            s = popxl.d2h_stream(o.shape, o.dtype, f"out{i}")
            ops.host_store(s, o)
            d2h.append(s)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run({**dict(zip(streams, arrays)), **dict(zip(dy_streams, dys))})
    vals = [res[s] for s in d2h]
    return vals[:n_out], vals[n_out:]


def numeric_grads(fn: Callable, arrays: Sequence[np.ndarray], dys: Sequence[np.ndarray],
                  eps: float = 1e-6) -> List[np.ndarray]:
    """Finite-difference gradients (float64) of sum_i <fn(arrays)_i, dys_i> w.r.t. float inputs."""
    arrays = [np.array(a, dtype=np.float64) if a.dtype.kind == "f" else a for a in arrays]

    def f(xs):
        outs = run_ops(fn, *xs)
        return sum(float(np.sum(o.astype(np.float64) * d)) for o, d in zip(outs, dys))

    result = []
    for k, a in enumerate(arrays):
        if a.dtype.kind != "f":
            continue
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[k][idx] += eps
            minus[k][idx] -= eps
            g[idx] = (f(plus) - f(minus)) / (2 * eps)
        result.append(g)
    return result


def _random_inputs(shapes, dtype, positive, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=s) for s in shapes]
    for i in positive:
        arrays[i] = np.abs(arrays[i]) + 0.5
    return rng, [a.astype(dtype) for a in arrays]


def check_forward(fn: Callable, ref: Callable, shapes, dtype, positive=(), seed: int = 0) -> None:
    """`fn` on random inputs of `shapes` (those at `positive` indices > 0.5) keeps `dtype` and
    matches the NumPy `ref` computed in float64 (float16: within 2e-3)."""
    _, arrays = _random_inputs(shapes, dtype, positive, seed)
    out, = run_ops(fn, *arrays)
    want = ref(*[a.astype(np.float64) for a in arrays])
    assert out.dtype == dtype
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol, atol=tol)


def check_grads(fn: Callable, ref: Callable, shapes, positive=(), seed: int = 0) -> None:
    """The autodiff gradients of `fn` (float64 inputs of `shapes`) match finite differences."""
    rng, arrays = _random_inputs(shapes, np.float64, positive, seed)
    dy = rng.normal(size=np.shape(ref(*arrays)))
    _, got = grads(fn, arrays, [dy])
    want = numeric_grads(fn, arrays, [dy])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def replicated_grads(fn: Callable, R: int, arrays: Sequence[np.ndarray],
                     dys: Sequence[np.ndarray]):
    """(outputs, float-input gradients) of `fn` on R replicas, each `(R, *shape)`."""
    from popxl.transforms.patterns import apply_pre_alias_patterns

    ir = popxl.Ir(replication=R)
    with ir.main_graph:
        specs = [popxl.TensorSpec(a.shape[1:], popxl.dtype.as_dtype(a.dtype)) for a in arrays]
        g = ir.create_graph(lambda *xs: fn(*xs), *specs)
        required = [t for t in g.inputs if t.dtype.is_floating_point]
        bwd = popxl.transforms.autodiff(g, grads_required=required)
        streams = [popxl.h2d_stream(a.shape[1:], popxl.dtype.as_dtype(a.dtype), f"in{i}")
                   for i, a in enumerate(arrays)]
        info = ops.call_with_info(g, *[ops.host_load(s) for s in streams])
        dy_streams = [popxl.h2d_stream(d.shape[1:], popxl.dtype.as_dtype(d.dtype), f"dy{i}")
                      for i, d in enumerate(dys)]
        gouts = ops.call(bwd.graph, *[ops.host_load(s) for s in dy_streams],
                         inputs_dict=bwd.inputs_dict(info))
        d2h = []
        for i, o in enumerate(list(info.outputs[:len(dys)]) + list(gouts)):
            s = popxl.d2h_stream(o.shape, o.dtype, f"out{i}")
            ops.host_store(s, o)
            d2h.append(s)
    for graph in ir._graph_cache.values():
        apply_pre_alias_patterns(graph)
    with popxl.Session(ir, "ipu_hw") as sess:
        feeds = dict(zip(streams + dy_streams, list(arrays) + list(dys)))
        res = sess.run({s: a if R > 1 else a[0] for s, a in feeds.items()})
    vals = [res[s] if R > 1 else res[s][np.newaxis] for s in d2h]
    return vals[:len(dys)], vals[len(dys):]


def check_image_builder_error(build: Callable, err: type, match: str) -> None:
    """`build(x, w, i)` on an image batch x (2, 2, 3, 3), conv weights w (2, 3, 2, 2) and int32
    indices i (2, 2, 3, 3) raises `err` matching `match` while the graph is built."""
    import pytest
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 2, 3, 3)), popxl.float32, "x")
        w = popxl.variable(np.zeros((2, 3, 2, 2)), popxl.float32, "w")
        i = popxl.variable(np.zeros((2, 2, 3, 3), np.int32), popxl.int32, "i")
        with pytest.raises(err, match=match):
            build(x, w, i)
