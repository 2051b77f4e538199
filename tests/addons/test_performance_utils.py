"""performance_utils: FLOPs per op (MatMul, element-wise, GroupNorm) through calls and repeats."""
from __future__ import annotations

import numpy as np
import pytest

import popxl
import popxl.ops as ops
import popxl_addons as addons


def _program(replicas=1):
    """Four MatMuls with an `x.T` transpose created second (ids 100, 102, 103, 104; the
    transpose takes 101), an Add (105), and a Mul repeated 3 times in a subgraph."""
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph:
        x = popxl.variable(np.ones((4, 8), np.float32), name="x")
        w = popxl.variable(np.ones((8, 16), np.float32), name="w")
        a = x @ w                         # 100: 2 * 8 * (4*16)
        xt = x.T                          # 101: not counted
        xt @ x                            # 102: 2 * 4 * (8*8)
        x @ w                             # 103: 2 * 8 * (4*16)
        ops.matmul(a, popxl.variable(np.ones((16, 2), np.float32)))   # 104: 2 * 16 * (4*2)
        a + a                             # 105: 64
        g = ir.create_graph(lambda y: (y * 2.0,), a)                    # Mul: 64 per iteration
        ops.repeat(g, 3, a)
    return ir


def test_evaluate_flops_counts_ops_by_id_and_trip_count():
    ir = _program()
    flops = addons.evaluate_FLOPs(ir.main_graph)
    assert flops["MatMul"] == {100: 2 * 8 * 64, 102: 2 * 4 * 64, 103: 2 * 8 * 64,
                               104: 2 * 16 * 8}
    assert flops["Add"] == {105: 64}
    (mul_id,) = flops["Mul"]
    assert flops["Mul"][mul_id] == 3 * 64
    assert flops["TOT"] == 2 * 8 * 64 * 2 + 2 * 4 * 64 + 2 * 16 * 8 + 64 + 3 * 64
    assert "Transpose" not in flops


def test_ir_flops_scale_with_replicas_and_print(capsys):
    ir = _program(replicas=2)
    one = addons.evaluate_FLOPs(ir.main_graph)
    both = addons.evaluate_ir_FLOPs(ir)
    assert both["TOT"] == 2 * one["TOT"] == addons.total_FLOPs(ir)
    assert both["MatMul"][100] == 2 * one["MatMul"][100]
    text = addons.print_FLOPs(both)
    assert text in capsys.readouterr().out
    assert "MatMul" in text and "TOT" in text
    assert "MatMul.100" in addons.print_FLOPs(both, mode="op")
    with pytest.raises(ValueError, match="mode"):
        addons.print_FLOPs(both, mode="graph")


def test_group_norm_flops():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((4, 6), np.float32))
        ops.group_norm(x, popxl.variable(np.ones(6, np.float32)),
                       popxl.variable(np.zeros(6, np.float32)), 2)
    assert addons.evaluate_FLOPs(ir.main_graph)["TOT"] == 8 * 24


def test_format_flops_scientific():
    assert addons.format_flops_scientific(12_345_000_000) == "12.35e9"
    assert addons.format_flops_scientific(12_345_000_000, "scientific") == "1.234e10"
    assert addons.format_flops_scientific(999) == "999e0"
    assert addons.format_flops_scientific(0) == "0"
    with pytest.raises(ValueError, match="format"):
        addons.format_flops_scientific(1, "eng")
