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
    with pytest.raises(TypeError):
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
    rg = ir.replica_grouping_from_assignments([1, 0, 0, 1])
    assert not rg.is_const
    assert rg.assignment == [1, 0, 0, 1]
    assert (rg.group_size, rg.num_groups) == (2, 2)
    with pytest.raises(NotImplementedError):
        _ = rg.stride
    assert repr(rg) == "ReplicaGrouping(assignment=[1, 0, 0, 1])"
    assert rg.transpose().assignment == _ref_transpose([1, 0, 0, 1]) == [0, 0, 1, 1]
    assert rg != ir.replica_grouping(1, 2)


@pytest.mark.parametrize("assignment,match", [
    ([0, 0, 1], "need 4 entries"),
    ([0, 0, 0, 1], "same size"),
    ([0, 0, 2, 2], "numbered 0..G-1"),
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
