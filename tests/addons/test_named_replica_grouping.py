"""The tensor-parallel grouping helpers of `popxl_addons.named_replica_grouping`: groupings cut
to one popdist instance (`ir.instance_replication_factor` replicas) or one IPU-link domain."""
from __future__ import annotations

import pytest

import popxl
from popxl_addons.named_replica_grouping import (
    NamedReplicaGrouping,
    fill_none_group,
    get_ild_replica_grouping,
    get_ild_size_from_popdist,
    get_instance_replica_grouping,
    is_cross_ild,
    is_cross_instance,
)


@pytest.fixture
def instances(monkeypatch):
    """Pretend each instance owns `n` of the Ir's replicas."""
    def set_local(n: int) -> None:
        monkeypatch.setattr(popxl.Ir, "instance_replication_factor", property(lambda self: n))
    return set_local


def test_instance_grouping_of_constant_groupings(instances):
    ir = popxl.Ir(replication=8)
    instances(4)
    with ir.main_graph:
        dp = ir.replica_grouping(stride=2)                    # size 4, crosses instances
        assert is_cross_instance(dp) and is_cross_instance(None)
        local = get_instance_replica_grouping(dp)
        assert (local.stride, local.group_size) == (2, 2)
        assert local.assignment == [0, 1, 0, 1, 2, 3, 2, 3]
        tp = ir.replica_grouping(group_size=2)
        assert not is_cross_instance(tp) and get_instance_replica_grouping(tp) is tp
        across = get_instance_replica_grouping(ir.replica_grouping(stride=4))
        assert across.group_size == 1                         # members all in other instances
        everyone = get_instance_replica_grouping()
        assert everyone.assignment == [0, 0, 0, 0, 1, 1, 1, 1]


def test_instance_grouping_of_assignment_groupings(instances):
    ir = popxl.Ir(replication=8)
    instances(4)
    with ir.main_graph:
        rg = ir.replica_grouping_from_assignments([0, 1, 1, 0, 0, 1, 1, 0])
        assert not rg.is_const and is_cross_instance(rg)
        local = get_instance_replica_grouping(rg)
        assert local.assignment == [0, 1, 1, 0, 2, 3, 3, 2]
        bad = ir.replica_grouping_from_assignments([0, 1, 1, 0, 0, 0, 1, 1])
        with pytest.raises(ValueError, match="same pattern in every block of 4"):
            get_instance_replica_grouping(bad)


def test_single_controller_has_one_instance():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        assert ir.instance_replication_factor == 4
        assert not is_cross_instance(None)
        assert get_instance_replica_grouping().group_size == 4


def test_ild_size_and_grouping(monkeypatch):
    ir = popxl.Ir(replication=8)
    with ir.main_graph:
        monkeypatch.delenv("POPLAR_TARGET_OPTIONS", raising=False)
        assert get_ild_size_from_popdist() == 8
        monkeypatch.setenv("POPLAR_TARGET_OPTIONS", '{"ipuLinkDomainSize": 4}')
        assert get_ild_size_from_popdist() == 4
        rg = ir.replica_grouping(stride=2)
        assert is_cross_ild(rg)
        assert get_ild_replica_grouping(rg).assignment == [0, 1, 0, 1, 2, 3, 2, 3]
        assert not is_cross_ild(ir.replica_grouping(group_size=4))
        monkeypatch.setenv("POPLAR_TARGET_OPTIONS", '{"ipuLinkDomainSize": "x"}')
        with pytest.raises(ValueError, match="ipuLinkDomainSize must be a positive int"):
            get_ild_size_from_popdist()
        monkeypatch.setenv("POPLAR_TARGET_OPTIONS", "{oops")
        with pytest.raises(ValueError, match="not valid JSON"):
            get_ild_size_from_popdist()


def test_fill_none_group_and_named_groupings():
    ir = popxl.Ir(replication=4)
    with ir.main_graph:
        tp = ir.replica_grouping(group_size=2)
        assert fill_none_group(tp, None) is tp
        assert fill_none_group(None, tp) is tp
        with pytest.raises(TypeError):
            fill_none_group(None)                   # `none_value` is required, as upstream
        named = NamedReplicaGrouping.build_groups(["a.w", "b"], tp)
        assert named.a.w is tp and named.b is tp


def test_ild_grouping_of_a_stride_beyond_the_domain_is_refused(monkeypatch):
    ir = popxl.Ir(replication=8)
    with ir.main_graph:
        monkeypatch.setenv("POPLAR_TARGET_OPTIONS", '{"ipuLinkDomainSize": 2}')
        with pytest.raises(ValueError, match="stride 4 must not exceed the 2 replicas"):
            get_ild_replica_grouping(ir.replica_grouping(stride=4))
        # A stride equal to the domain keeps one replica per group (as upstream).
        monkeypatch.setenv("POPLAR_TARGET_OPTIONS", '{"ipuLinkDomainSize": 4}')
        assert get_ild_replica_grouping(ir.replica_grouping(stride=4)).group_size == 1
