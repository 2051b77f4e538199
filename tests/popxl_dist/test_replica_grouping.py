"""ReplicaGrouping maths, construction, validation, transpose, repr and equality (no Session).

The reference values are the maths and the R=8 table of the PopXL reference (§1.10), written out
here independently of `popxl_dist.replica_grouping`.
"""
import popxl
import pytest


def _ref_group(r: int, stride: int, group_size: int) -> int:
    return r % stride + stride * (r // (stride * group_size))


def _ref_replica(g: int, i: int, stride: int, group_size: int) -> int:
    return (g // stride) * stride * group_size + g % stride + i * stride


def _valid_params(R: int):
    """Every (stride, group_size) the reference accepts for R replicas."""
    out = []
    for stride in range(1, R + 1):
        for k in range(1, R + 1):
            if R % stride or (k > 1 and R % (stride * k)) or (k == 1 and stride > 1):
                continue
            out.append((stride, k))
    return out


def _ref_transpose(assignment):
    """Member index within its group (groups ordered by ascending replica) becomes the group."""
    seen = {}
    out = []
    for g in assignment:
        out.append(seen.get(g, 0))
        seen[g] = seen.get(g, 0) + 1
    return out


R8_TABLE = [
    ((1, 8), [0, 0, 0, 0, 0, 0, 0, 0]),
    ((1, 2), [0, 0, 1, 1, 2, 2, 3, 3]),
    ((2, 2), [0, 1, 0, 1, 2, 3, 2, 3]),
    ((2, 4), [0, 1, 0, 1, 0, 1, 0, 1]),
    ((4, 2), [0, 1, 2, 3, 0, 1, 2, 3]),
]


@pytest.mark.parametrize("params,assignment", R8_TABLE)
def test_reference_r8_assignment_table(params, assignment):
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping(*params)
    assert rg.assignment == assignment
    assert (rg.stride, rg.group_size) == params
    assert rg.num_groups == len(set(assignment)) == 8 // params[1]
    assert rg.is_const


@pytest.mark.parametrize("R", [1, 2, 4, 8])
def test_constant_stride_maths_for_every_valid_grouping(R):
    ir = popxl.Ir(replication=R)
    params = _valid_params(R)
    assert params  # (1, R) at least
    for stride, k in params:
        rg = ir.replica_grouping(stride, k)
        assert rg.assignment == [_ref_group(r, stride, k) for r in range(R)], (stride, k)
        assert rg.num_groups == R // k
        for g in range(rg.num_groups):
            members = [r for r in range(R) if rg.assignment[r] == g]
            assert members == [_ref_replica(g, i, stride, k) for i in range(k)], (stride, k, g)


def test_defaults_and_group_size_one_resets_stride():
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping()
    assert (rg.stride, rg.group_size, rg.num_groups) == (1, 8, 1)
    assert ir.replica_grouping(stride=2).group_size == 4       # R // stride
    assert ir.replica_grouping(stride=4).assignment == [0, 1, 2, 3, 0, 1, 2, 3]
    one = ir.replica_grouping(stride=2, group_size=1)
    assert (one.stride, one.group_size, one.num_groups) == (1, 1, 8)
    assert one.assignment == list(range(8))
    single = popxl.Ir().replica_grouping()
    assert (single.stride, single.group_size, single.num_groups) == (1, 1, 1)
    assert single.assignment == [0]


@pytest.mark.parametrize("stride,group_size", [
    (0, None), (-1, 2), (3, None), (16, 1), (1, 0), (1, 16), (1, 3), (2, 3), (4, 4), (3, 1),
])
def test_invalid_groupings_raise_value_error(stride, group_size):
    ir = popxl.Ir(replication=8)
    with pytest.raises(ValueError, match="replica_grouping"):
        ir.replica_grouping(stride, group_size)


def test_constructor_raises():
    with pytest.raises(RuntimeError):          # as upstream: built by the Ir's factories
        popxl.ReplicaGrouping()


@pytest.mark.parametrize("params,transposed", [
    ((1, 2), (2, 4)), ((2, 4), (1, 2)), ((4, 2), (1, 4)), ((1, 4), (4, 2)),
    ((1, 8), (1, 1)), ((1, 1), (1, 8)),
])
def test_transpose_swaps_members_and_groups(params, transposed):
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping(*params)
    t = rg.transpose()
    assert t.assignment == _ref_transpose(rg.assignment)
    assert t == ir.replica_grouping(*transposed)
    assert t.is_const and (t.stride, t.group_size) == transposed
    assert (t.num_groups, t.group_size) == (rg.group_size, rg.num_groups)
    assert t.transpose() == rg


def test_transpose_of_a_mixed_grouping_is_not_constant_stride():
    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping(2, 2)           # groups [0,2] [1,3] [4,6] [5,7]
    t = rg.transpose()
    assert t.assignment == _ref_transpose(rg.assignment) == [0, 0, 1, 1, 0, 0, 1, 1]
    assert not t.is_const
    assert (t.group_size, t.num_groups) == (4, 2)


@pytest.mark.parametrize("R,params", [(8, p) for p in _valid_params(8)] + [(4, (2, 2))])
def test_from_assignments_recognises_constant_stride(R, params):
    ir = popxl.Ir(replication=R)
    assignment = [_ref_group(r, *params) for r in range(R)]
    rg = ir.replica_grouping_from_assignments(assignment)
    assert rg.is_const
    assert (rg.stride, rg.group_size) == params
    assert rg == ir.replica_grouping(*params)


def test_non_constant_grouping():
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping_from_assignments([0, 1, 1, 0])
    assert not rg.is_const
    assert rg.assignment == [0, 1, 1, 0]
    assert (rg.group_size, rg.num_groups) == (2, 2)
    with pytest.raises(NotImplementedError):
        _ = rg.stride
    with pytest.raises(NotImplementedError):
        _ = rg._pb_replica_grouping
    with pytest.raises(NotImplementedError):
        rg._to_variable_settings()
    assert repr(rg) == "ReplicaGrouping(assignment=[0, 1, 1, 0])"
    assert rg.transpose().assignment == _ref_transpose([0, 1, 1, 0]) == [0, 0, 1, 1]
    assert rg != ir.replica_grouping(1, 2)


def _ref_const_refinement(assignment):
    """The constant-stride grouping a non-constant one is stored as: the smallest distance d
    between consecutive members of any group; each group cut into runs of members d apart;
    group size = gcd of the run lengths; stride d (1 for singletons)."""
    import math

    R = len(assignment)
    members = [[r for r in range(R) if assignment[r] == g] for g in range(max(assignment) + 1)]
    d = min(b - a for m in members for a, b in zip(m, m[1:]))
    runs = []
    for m in members:
        n = 1
        for a, b in zip(m, m[1:]):
            if b - a == d:
                n += 1
            else:
                runs.append(n)
                n = 1
        runs.append(n)
    k = 0
    for n in runs:
        k = math.gcd(k, n)
    stride = d if k > 1 else 1
    return [_ref_group(r, stride, k) for r in range(R)]


NON_CONST = [
    [0, 0, 1, 1, 0, 0, 1, 1],                      # the 2-D tensor-parallel grouping
    [0, 1, 1, 0, 0, 1, 1, 0],
    [0, 0, 1, 1, 1, 1, 0, 0],
    [0, 1, 0, 0, 1, 1, 0, 1],
    [0, 1, 2, 3, 1, 2, 3, 0],
    [0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 0, 1, 0, 1],
    [0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1],
]


@pytest.mark.parametrize("assignment", NON_CONST)
def test_const_rg_of_non_constant_groupings(assignment):
    ir = popxl.Ir(replication=len(assignment))
    rg = ir.replica_grouping_from_assignments(assignment)
    assert not rg.is_const
    const = rg.const_rg
    assert const.is_const and const.assignment == _ref_const_refinement(assignment)
    # Every const_rg group lies inside one group here, so the maps are well defined.
    for c in range(const.num_groups):
        assert len({assignment[r] for r in const.members(c)}) == 1
    device_map = [assignment[const.members(c)[0]] for c in range(const.num_groups)]
    host_map = [const.assignment[rg.members(g)[0]] for g in range(rg.num_groups)]
    assert rg.to_device_map == device_map and rg.to_host_map == host_map
    # Host data laid out for const_rg and read back one per group: the identity.
    data = list(range(rg.num_groups))
    assert [[data[g] for g in rg.to_device_map][c] for c in rg.to_host_map] == data


def test_const_rg_of_the_2d_tensor_parallel_grouping():
    ir = popxl.Ir(replication=8)
    tp1 = ir.replica_grouping(stride=2, group_size=2)      # [0, 1, 0, 1, 2, 3, 2, 3]
    rg = tp1.transpose()
    assert rg.assignment == [0, 0, 1, 1, 0, 0, 1, 1] and not rg.is_const
    assert rg.const_rg == ir.replica_grouping(stride=1, group_size=2)
    assert rg.const_rg.assignment == [0, 0, 1, 1, 2, 2, 3, 3]
    assert rg.to_device_map == [0, 1, 0, 1]
    assert rg.to_host_map == [0, 1]
    assert rg.transpose() == tp1


def test_constant_groupings_map_to_themselves():
    ir = popxl.Ir(replication=8)
    for stride, k in _valid_params(8):
        rg = ir.replica_grouping(stride, k)
        assert rg.const_rg is rg
        assert rg.to_device_map is None and rg.to_host_map is None
        vs = rg._to_variable_settings()
        assert (vs.getStride(), vs.getGroupSize()) == (rg.stride, rg.group_size)
        assert vs.groups(8) == [rg.members(g) for g in range(rg.num_groups)]
        assert rg._pb_replica_grouping.getGroupSize() == k


def test_variable_settings_of_a_grouping():
    import popart

    ir = popxl.Ir(replication=8)
    rg = ir.replica_grouping(stride=2, group_size=2)
    vs = rg._to_variable_settings("all_replicas")
    assert isinstance(vs, popart.VariableSettings) and not vs.isUsingCommGroup()
    assert vs.getRetrievalMode() == popart.VariableRetrievalMode.AllReplicas
    assert vs.groups(8) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert vs.getGroupCount(8) == 4 and vs.getRealGroupSize(8) == 2
    assert vs.numReplicasReturningVariable(8) == 8
    assert [vs.getGroupRepresentative(g) for g in range(4)] == [0, 1, 4, 5]
    assert vs.shapeOnHost([3], 8) == [4, 3] and vs.shapeOnReplica([4, 3], 8, "w") == [3]
    with pytest.raises(ValueError, match="outer dimension"):
        vs.shapeOnReplica([3, 3], 8, "w")
    one = rg._to_variable_settings()
    assert one.getRetrievalMode() == popart.VariableRetrievalMode.OnePerGroup
    assert one.numReplicasReturningVariable(8) == 4
    with pytest.raises(ValueError, match="retrieval_mode"):
        rg._to_variable_settings("every_replica")


def test_variable_settings_from_comm_groups():
    import popart
    from popxl.ops.collectives import CommGroup, CommGroupType

    orth = popart.VariableSettings(CommGroup(CommGroupType.Orthogonal, 2),
                                   popart.VariableRetrievalMode.OnePerGroup)
    assert orth.isUsingCommGroup() and orth.groups(8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    cons = popart.VariableSettings(CommGroup(CommGroupType.Consecutive, 4))
    assert cons.groups(8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [cons.getGroupRepresentative(g) for g in range(2)] == [0, 4]
    assert popart.VariableSettings().groups(4) == [[0, 1, 2, 3]]
    none = popart.VariableSettings(CommGroup(CommGroupType.Ungrouped, 0))
    assert none.groups(3) == [[0], [1], [2]] and none.numReplicasReturningVariable(3) == 3
    all_mode = popart.VariableSettings(popart.VariableRetrievalMode.AllReplicas)
    assert all_mode.numReplicasReturningVariable(4) == 4
    with pytest.raises(ValueError, match="replicaGroupSize"):
        popart.VariableSettings(CommGroup(CommGroupType.Consecutive, 0))


@pytest.mark.parametrize("assignment,match", [
    ([0, 0, 1], "need 4 entries"),
    ([0, 0, 0, 1], "same size"),
    ([0, 0, 2, 2], "numbered 0..G-1"),
    ([1, 1, 2, 2], "numbered 0..G-1"),
    ([1, 1, 0, 0], "order their first replica appears"),
])
def test_from_assignments_validation(assignment, match):
    ir = popxl.Ir(replication=4)
    with pytest.raises(ValueError, match=match):
        ir.replica_grouping_from_assignments(assignment)


def test_repr():
    ir = popxl.Ir(replication=8)
    assert repr(ir.replica_grouping(2, 2)) == (
        "ReplicaGrouping(num_replicas=8, stride=2, group_size=2, num_groups=4)")
    assert repr(ir.replica_grouping()) == (
        "ReplicaGrouping(num_replicas=8, stride=1, group_size=8, num_groups=1)")


def test_equality_rules():
    ir = popxl.Ir(replication=8)
    other = popxl.Ir(replication=8)
    assert ir.replica_grouping(2, 4) == ir.replica_grouping(2, 4)
    assert ir.replica_grouping(2, 4) == ir.replica_grouping(stride=2)
    assert ir.replica_grouping(2, 4) != ir.replica_grouping(4, 2)
    # group_size 1 resets the stride, so these are the same grouping
    assert ir.replica_grouping(4, 1) == ir.replica_grouping(1, 1)
    assert ir.replica_grouping(2, 4) != other.replica_grouping(2, 4)     # different Ir
    with pytest.raises(TypeError):
        _ = ir.replica_grouping() == 1
    with pytest.raises(TypeError):
        _ = ir.replica_grouping() == [0] * 8
    assert hash(ir.replica_grouping(2, 2)) == hash(ir.replica_grouping_from_assignments(
        [0, 1, 0, 1, 2, 3, 2, 3]))
