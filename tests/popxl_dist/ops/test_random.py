"""Random ops: deterministic in the seed, distribution moments, seed splitting, no gradient;
dropout / shaped_dropout: mask, scale, the gradient's mask, builder errors."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops

from harness import grads, run_ops

F32 = np.float32
SEED = np.array([11, 22], np.uint32)


@pytest.mark.parametrize("dtype", [popxl.float32, popxl.float16])
def test_random_uniform_range_moments_and_determinism(dtype):
    a, b = run_ops(lambda s: (ops.random_uniform(s, (200, 50), -2.0, 3.0, dtype),
                              ops.random_uniform(s, (200, 50), -2.0, 3.0, dtype)), SEED)
    assert a.shape == (200, 50) and a.dtype == dtype.as_numpy()
    np.testing.assert_array_equal(a, b)
    assert a.min() >= -2.0 and a.max() <= 3.0
    assert abs(a.astype(np.float64).mean() - 0.5) < 0.05
    assert abs(a.astype(np.float64).var() - 25 / 12) < 0.1


def test_random_normal_moments_and_seed_dependence():
    a, b = run_ops(lambda s, s2: (ops.random_normal(s, (100, 100), 1.0, 0.5),
                                  ops.random_normal(s2, (100, 100), 1.0, 0.5)),
                   SEED, np.array([11, 23], np.uint32))
    assert abs(a.mean() - 1.0) < 0.02 and abs(a.std() - 0.5) < 0.02
    assert not np.array_equal(a, b)


def test_split_random_seed_ops_and_values():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.variable(SEED, popxl.uint32, "seed")
        seeds = ops.split_random_seed(s, 3)
        gd = ir.main_graph._data
        mods = [gd.tensors[o.inputs[1]] for o in gd.ops]
    assert [o.type for o in gd.ops] == ["ModifyRandomSeed"] * 3
    assert [int(m.data) for m in mods] == [0, 1, 2]
    assert all(m.dtype == popxl.uint32 for m in mods)
    assert all(t.shape == (2,) and t.dtype == popxl.uint32 for t in seeds)

    create = ops.random_seed.create_random_seed
    outs = run_ops(lambda t: ops.split_random_seed(t, 3) + (create(t, 1),), SEED)
    rows = {tuple(o) for o in outs[:3]}
    assert len(rows) == 3 and SEED.tobytes() not in {o.tobytes() for o in outs}
    np.testing.assert_array_equal(outs[1], outs[3])      # same seed and modifier, same result
    again = run_ops(lambda t: ops.split_random_seed(t, 3), SEED)
    for x, y in zip(outs, again):
        np.testing.assert_array_equal(x, y)


def test_random_ops_have_no_gradient():
    def fn(x, s):
        return x * ops.random_uniform(s, (2,), dtype=popxl.float64)
    with pytest.raises(TypeError, match="float16 or float32"):
        grads(fn, [np.ones(2), SEED], [np.ones(2)])
    # float32 forward, grad wrt x flows; the random op itself gets none
    x = np.ones(2, np.float32)
    outs, (dx,) = grads(lambda x, s: x * ops.random_uniform(s, (2,)), [x, SEED],
                        [np.ones(2, np.float32)])
    np.testing.assert_array_equal(dx, outs[0])


@pytest.mark.parametrize("build,err,match", [
    (lambda s, bad: ops.random_uniform(bad, (2,)), ValueError, r"uint32 of shape \(2,\)"),
    (lambda s, bad: ops.random_normal(s, (2,), dtype=popxl.int32), TypeError, "float16 or"),
    (lambda s, bad: ops.split_random_seed(s, 0), ValueError, "positive int"),
    (lambda s, bad: ops.random_seed.create_random_seed(s, -1), TypeError, "modifier"),
    (lambda s, bad: ops.random_seed.create_random_seed(bad, 0), ValueError, "seed"),
])
def test_builder_errors(build, err, match):
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.variable(SEED, popxl.uint32, "s")
        bad = popxl.variable(np.zeros(3), popxl.int32, "bad")
        with pytest.raises(err, match=match):
            build(s, bad)


# --- dropout --------------------------------------------------------------------------------------

def _seed(a=1, b=2):
    return np.array([a, b], np.uint32)


def test_dropout_mask_scale_and_determinism():
    x = np.ones((64, 64), F32)
    y1, y2, y3 = run_ops(lambda t, s, s2: (ops.dropout(t, s, 0.25), ops.dropout(t, s, 0.25),
                                            ops.dropout(t, s2, 0.25)), x, _seed(), _seed(3, 4))
    assert set(np.unique(y1)) == {0.0, np.float32(1 / 0.75)}
    assert abs((y1 == 0).mean() - 0.25) < 0.03
    np.testing.assert_array_equal(y1, y2)                 # same seed, same mask
    assert (y1 != y3).any()                               # another seed, another mask
    y0, = run_ops(lambda t, s: ops.dropout(t, s, 0.0), x, _seed())
    np.testing.assert_array_equal(y0, x)


def test_dropout_grad_uses_the_forward_mask():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 8))
    dy = rng.normal(size=(8, 8))
    outs, (dx,) = grads(lambda t, s: ops.dropout(t, s, 0.5), [x, _seed(7, 9)], [dy])
    mask = outs[0] / x                                    # 0 or 2 elementwise
    np.testing.assert_allclose(dx, dy * mask, rtol=1e-12)
    assert (mask == 0).any() and (mask != 0).any()


def test_shaped_dropout_drops_whole_rows():
    x = np.ones((32, 6), F32)
    y, = run_ops(lambda t, s: ops.shaped_dropout(t, s, (32, 1), 0.5), x, _seed())
    rows = y[:, 0]
    assert (y == rows[:, None]).all() and set(np.unique(rows)) == {0.0, 2.0}
    rng = np.random.default_rng(1)
    xx, dy = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    outs, (dx,) = grads(lambda t, s: ops.shaped_dropout(t, s, (4, 1), 0.5), [xx, _seed()], [dy])
    np.testing.assert_allclose(dx, dy * (outs[0] / xx), rtol=1e-12)


@pytest.mark.parametrize("build,err,match", [
    (lambda x, s, lab: ops.dropout(x, lab, 0.1), ValueError, r"uint32 of shape \(2,\)"),
    (lambda x, s, lab: ops.dropout(x, s, 1.0), ValueError, r"\[0, 1\)"),
    (lambda x, s, lab: ops.shaped_dropout(x, s, (3, 1), 0.5), ValueError, "broadcast"),
])
def test_dropout_builder_errors(build, err, match):
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 4)), popxl.float32, "x")
        s = popxl.variable(_seed(), popxl.uint32, "s")
        lab = popxl.variable(np.zeros((2,)), popxl.int32, "lab")
        with pytest.raises(err, match=match):
            build(x, s, lab)
