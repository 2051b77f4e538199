"""VariableFactory / NamedVariableFactories: `empty=True` variables (upstream: uninitialised
memory) hold zeros here and draw nothing from the data source."""
import numpy as np

import popxl
import popxl_addons as addons
from popxl_addons.variable_factory import NamedVariableFactories, VariableFactory


def _values(*vs):
    return iter([np.full(3, v, np.float32) for v in vs])


def test_empty_variables_are_zero_and_draw_nothing():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        grouped = ir.replica_grouping(group_size=1)          # 2 groups: stacked (2, 3)
        facts = NamedVariableFactories()
        facts.insert("a", VariableFactory(_values(1, 2, 3)))
        facts.insert("g", VariableFactory(_values(10, 20, 30), replica_grouping=grouped))
        buffers = addons.named_variable_buffers(facts, entries=2, shard_over_dict=False)
        local = facts.init("local", empty=True)
        remote = facts.init_remote(buffers, 1, "remote", empty=True)
        full = facts.init("full")
    with popxl.Session(ir, "ipu_hw") as s:
        data = s.get_tensors_data([*local.tensors, *remote.tensors, *full.tensors])
    for t in (*local.tensors, *remote.tensors):
        assert data[t].shape == ((2, 3) if t.name.endswith(".g") else (3,))
        np.testing.assert_array_equal(data[t], 0)
    np.testing.assert_array_equal(data[full.a], 1)           # the first draws: none was used
    np.testing.assert_array_equal(data[full.g], [[10] * 3, [20] * 3])
