"""Helpers for tests of modules: `run_module`, `TensorInput`, `ops_of_type`."""
from __future__ import annotations

from typing import Any, Callable, Iterable, List, Mapping, Optional, Union

import numpy as np

import popxl
from popxl import ops

__all__ = ["ops_of_type", "TensorInput", "run_module"]


def ops_of_type(ops: Iterable, op_type: Union[type, str]) -> int:
    """How many of `ops` (views from `_pb_graph.getOps()`) are instances of `op_type`, an op
    class such as `popart._internal.ir.op.MatMulOp` (or, as an extension, an op type string
    such as "MatMul")."""
    if isinstance(op_type, str):
        return sum(1 for op in ops if op.opType() == op_type)
    return sum(1 for op in ops if isinstance(op, op_type))


class TensorInput:
    """Host data that `run_module` turns into a main-graph variable."""

    def __init__(self, data: Any, dtype: Optional[popxl.dtype] = None):
        self.data = data
        self.dtype = dtype


def run_module(module, *args: Any, weights: Optional[Union[Callable, Mapping]] = None,
               **kwargs: Any) -> List[np.ndarray]:
    """Build `module` in a fresh Ir, run it once and return its outputs as NumPy arrays.

    `TensorInput` arguments become variables; `weights` is a dict {key: data} or a callable of
    the variables returning {variable: data}.
    """
    ir = popxl.Ir()
    with ir.main_graph:
        args = [popxl.variable(a.data, a.dtype) if isinstance(a, TensorInput) else a for a in args]
        kwargs = {k: popxl.variable(v.data, v.dtype) if isinstance(v, TensorInput) else v
                  for k, v in kwargs.items()}
        facts, graph = module.create_graph(*args, **kwargs)
        variables = facts.init()
        tensor_args = [a for a in args if isinstance(a, popxl.Tensor)]
        tensor_args += [v for v in kwargs.values() if isinstance(v, popxl.Tensor)]
        outs = graph.bind(variables).call(*tensor_args)
        streams = []
        for o in outs:
            s = popxl.d2h_stream(o.shape, o.dtype)
            ops.host_store(s, o)
            streams.append(s)
    session = popxl.Session(ir, "ipu_hw")
    if weights is not None:
        data = weights(variables) if callable(weights) else {
            variables.get(k) if isinstance(k, str) else k: v for k, v in weights.items()}
        session.write_variables_data(data)
    with session:
        result = session.run()
    return [result[s] for s in streams]
