"""Counting floating-point operations of a program from its IR."""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import numpy as np

import popxl
from popxl.utils import table_to_string

__all__ = ["total_FLOPs", "evaluate_ir_FLOPs", "evaluate_FLOPs", "print_FLOPs",
           "format_flops_scientific"]


class OpShapes:
    """An op with the shapes of its inputs and outputs (what the FLOP counters need)."""

    def __init__(self, op, tensors):
        self.op = op
        self.id = op.id
        self.type = op.type
        self.input_shapes: List[Tuple[int, ...]] = [tensors[t].shape for t in op.inputs]
        self.output_shapes: List[Tuple[int, ...]] = [tensors[t].shape for t in op.outputs]


def _nelms(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def matmul_flops(op: OpShapes) -> int:
    """2 * K * (elements of the output), K the contracted size."""
    return 2 * op.input_shapes[0][-1] * _nelms(op.output_shapes[0])


def elementwise_binary_flops(op: OpShapes) -> int:
    """One operation per output element."""
    return _nelms(op.output_shapes[0])


def group_norm_flops(op: OpShapes) -> int:
    """8 per input element: mean (1), variance (3), normalisation (2), scale and shift (2)."""
    return 8 * _nelms(op.input_shapes[0])


FLOPS_FNS: Dict[str, Callable[[OpShapes], int]] = {
    "Add": elementwise_binary_flops, "Sub": elementwise_binary_flops,
    "Mul": elementwise_binary_flops, "Div": elementwise_binary_flops,
    "MatMul": matmul_flops, "GroupNormalization": group_norm_flops,
}


def evaluate_FLOPs(graph: popxl.Graph) -> Dict:
    """FLOPs of `graph` per op: `{op_type: {op_id: flops}, ..., "TOT": total}`.

    Counts MatMul, Add / Sub / Mul / Div and GroupNormalization ops, in `graph` and in the
    graphs it calls (a repeat counts its trip count times; an op reached several times adds up).
    """
    if not isinstance(graph, popxl.Graph):
        raise TypeError(f"evaluate_FLOPs: expected a popxl.Graph, got {type(graph).__name__}")
    graphs = graph.ir._data.graphs
    result: Dict = {}
    total = 0

    def visit(gid: str, times: int) -> None:
        nonlocal total
        gd = graphs[gid]
        for op in gd.ops:
            fn = FLOPS_FNS.get(op.type)
            if fn is not None:
                flops = fn(OpShapes(op, gd.tensors)) * times
                per_type = result.setdefault(op.type, {})
                per_type[op.id] = per_type.get(op.id, 0) + flops
                total += flops
            trips = int(op.attrs.get("trip_count", 1)) if op.type == "Loop" else 1
            for c in op.called:
                visit(c, times * trips)

    visit(graph.id, 1)
    result["TOT"] = total
    return result


def evaluate_ir_FLOPs(ir: popxl.Ir) -> Dict:
    """`evaluate_FLOPs` of the main graph, times the replication factor."""
    r = ir.replication_factor
    flops = evaluate_FLOPs(ir.main_graph)
    return {k: (v * r if k == "TOT" else {i: f * r for i, f in v.items()})
            for k, v in flops.items()}


def total_FLOPs(ir: popxl.Ir) -> int:
    """Total FLOPs of one run of the program over all replicas."""
    return evaluate_ir_FLOPs(ir)["TOT"]


def format_flops_scientific(val: float, format: str = "nearest3") -> str:
    """`val` in scientific notation: "nearest3" uses an exponent that is a multiple of 3
    (e.g. `12.35e9`), "scientific" a normalised mantissa (e.g. `1.235e10`)."""
    if format not in ("nearest3", "scientific"):
        raise ValueError(f"format_flops_scientific: format must be 'nearest3' or 'scientific', "
                         f"got {format!r}")
    if val == 0:
        return "0"
    exp = int(np.floor(np.log10(abs(val))))
    if format == "nearest3":
        exp -= exp % 3
    return f"{val / 10 ** exp:.4g}e{exp}"


def print_FLOPs(flops_breakdown: Dict, mode: str = "type",
                numerical_format: str = "nearest3") -> str:
    """Print (and return) a table of `evaluate_FLOPs` output: per op type (`mode="type"`) or
    per op (`mode="op"`), plus the total.

    Upstream calls an undefined `table_to_string` here and always raises NameError; this prints
    the table it meant to.
    """
    if mode not in ("type", "op"):
        raise ValueError(f"print_FLOPs: mode must be 'type' or 'op', got {mode!r}")
    rows = []
    for op_type, per_op in flops_breakdown.items():
        if op_type == "TOT":
            continue
        if mode == "type":
            rows.append([op_type, format_flops_scientific(sum(per_op.values()),
                                                          numerical_format)])
        else:
            rows += [[f"{op_type}.{i}", format_flops_scientific(f, numerical_format)]
                     for i, f in per_op.items()]
    rows.append(["TOT", format_flops_scientific(flops_breakdown.get("TOT", 0),
                                                numerical_format)])
    text = table_to_string([["Op" if mode == "op" else "Op type", "FLOPs"], *rows])
    print(text)
    return text
