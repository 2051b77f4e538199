"""seed_variable: per-group device seeds in a remote buffer, loaded and saved with the weights."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons


def _program(group_size):
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        rg = None if group_size is None else ir.replica_grouping(group_size=group_size)
        seed_var, seed = addons.seed_variable(1984, rg)
        before = popxl.d2h_stream((2,), popxl.uint32, "before")
        after = popxl.d2h_stream((2,), popxl.uint32, "after")
        with popxl.in_sequence(True):
            ops.host_store(before, seed)
            _, nxt = ops.split_random_seed(seed)
            ops.var_updates.copy_var_update_(seed, nxt)
            ops.host_store(after, seed)
    return ir, seed_var, seed, before, after


def test_grouped_seeds_match_within_groups_and_track_the_device():
    ir, seed_var, seed, before, after = _program(2)
    assert seed_var.name == "random_seed" and seed_var.shape == (2,)
    assert seed_var.shape_on_host == (2, 2) and seed.dtype == popxl.uint32
    initial = popxl.create_seeds(1984, replicas=2)
    with popxl.Session(ir, "ipu_hw") as s:
        np.testing.assert_array_equal(s.get_tensor_data(seed_var), initial)
        out = s.run()
        b, a = out[before], out[after]
        np.testing.assert_array_equal(b[0], b[1])
        np.testing.assert_array_equal(b[2], b[3])
        assert not np.array_equal(b[0], b[2])
        np.testing.assert_array_equal(b[[0, 2]], initial)
        assert not np.array_equal(a, b)
        # The updated seed is saved with the weights: the first replica of each group.
        np.testing.assert_array_equal(s.get_tensor_data(seed_var), a[[0, 2]])
        out2 = s.run()
        np.testing.assert_array_equal(out2[before], a)   # persists across runs


def test_default_is_one_seed_per_replica():
    ir, seed_var, _, before, _ = _program(None)
    assert seed_var.shape_on_host == (4, 2)
    with popxl.Session(ir, "ipu_hw") as s:
        b = s.run()[before]
    assert len({tuple(r) for r in b}) == 4
    np.testing.assert_array_equal(b, popxl.create_seeds(1984, replicas=4))


def test_fragments_and_errors():
    ir, *_ = _program(2)
    ctx = [(op.type, op.exec_ctx) for op in ir.main_graph._data.ops]
    assert ("RemoteLoad", "WeightsFromHostFragment") in ctx
    assert ("RemoteStore", "WeightsToHostFragment") in ctx
    with ir.main_graph, pytest.raises(TypeError, match="'seed' must be an int"):
        addons.seed_variable(1.5)
