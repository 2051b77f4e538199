"""What one op is, in numbers a person reads: its tensors' shapes and dtypes, the bytes it reads
and writes, the floating-point operations of a matmul or convolution, and what kind of op it is
(compute, control flow, collective, host transfer). Used by the profiler's trace and table and by
`popxl-inspect`'s graph view."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .._ir.records import GraphData, IrData, Op, TensorInfo
from ..dtypes import storage_numpy
from ..engine.kernels import load_all
from ..engine.kernels.registry import CONTROL_FLOW_TYPES, spec_of

__all__ = ["OpInfo", "describe_ops", "op_flops", "tensor_bytes", "CATEGORIES"]

HOST_TRANSFERS = frozenset({"HostLoad", "HostStore"})
REMOTE_TRANSFERS = frozenset({"RemoteLoad", "RemoteLoadInplace", "RemoteStore"})
CATEGORIES = ("op", "control_flow", "collective", "host_transfer", "remote_transfer")

_CONV_FAMILY = frozenset({"Conv", "ConvTranspose", "ConvDataGrad", "ConvWeightsGrad"})


def tensor_bytes(info: TensorInfo) -> int:
    """Bytes of one tensor as stored (float8 as one byte per element)."""
    try:
        return info.nelms * storage_numpy(info.dtype).itemsize
    except TypeError:
        return 0


def _nelms(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def op_flops(op: Op, gd: GraphData) -> int:
    """Floating-point operations (a multiply and an add count two) of a matmul or a convolution
    (forward, transposed, data and weights gradients); 0 for every other op."""
    try:
        ins = [gd.tensors[t].shape for t in op.inputs]
        outs = [gd.tensors[t].shape for t in op.outputs]
    except KeyError:
        return 0
    if op.type == "MatMul" and len(ins) >= 2 and outs:
        k = ins[0][-1] if ins[0] else 1
        return 2 * _nelms(outs[0]) * int(k)
    if op.type in _CONV_FAMILY and len(ins) >= 2 and outs:
        # Conv: y and w; data grad / transposed: dy (or x) and w; weights grad: dy and dw.
        big, kernel = (outs[0], ins[1]) if op.type == "Conv" else \
            (ins[0], outs[0]) if op.type == "ConvWeightsGrad" else (ins[0], ins[1])
        per_output = _nelms(kernel[1:]) if len(kernel) > 1 else 1
        return 2 * _nelms(big) * per_output
    return 0


def _category(op: Op) -> str:
    if op.type in CONTROL_FLOW_TYPES:
        return "control_flow"
    if op.type in HOST_TRANSFERS:
        return "host_transfer"
    if op.type in REMOTE_TRANSFERS:
        return "remote_transfer"
    spec = spec_of(op)
    return "collective" if spec is not None and spec.collective else "op"


def _tensor_text(gd: GraphData, tid: str) -> str:
    info = gd.tensors.get(tid)
    if info is None:
        return tid
    return f"{tid} {tuple(info.shape)} {info.dtype.name}"


@dataclass
class OpInfo:
    """The static description of one op (the same on every replica and run)."""

    id: int
    type: str
    name: str
    graph: str
    source: str
    origin: str
    category: str
    inputs: List[str] = field(default_factory=list)
    outputs: List[str] = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0
    flops: int = 0
    group: Optional[Tuple[int, int]] = None      # (stride, group_size) of a collective
    called: Tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.type}.{self.id} '{self.name}'"

    def args(self) -> Dict:
        """The trace's `args` of this op's slices (one dict, shared by all of them)."""
        cached = self.__dict__.get("_args")
        if cached is not None:
            return cached
        a = {"op": self.label, "graph": self.graph or "main", "inputs": self.inputs,
             "outputs": self.outputs, "bytes": self.bytes_in + self.bytes_out}
        if self.source:
            a["source"] = self.source
        if self.origin:
            a["grad of"] = self.origin
        if self.flops:
            a["flops"] = self.flops
        if self.called:
            a["calls"] = list(self.called)
        self.__dict__["_args"] = a
        return a


def describe_ops(ir: IrData) -> Dict[int, OpInfo]:
    """`{op id: OpInfo}` of every op of every graph of `ir` (op ids are unique in an Ir)."""
    load_all()
    out: Dict[int, OpInfo] = {}
    for gid, gd in ir.graphs.items():
        for op in gd.ops:
            group = None
            if "stride" in op.attrs and "group_size" in op.attrs:
                group = (int(op.attrs["stride"]), int(op.attrs["group_size"]))
            ins = [gd.tensors[t] for t in op.inputs if t in gd.tensors]
            outs = [gd.tensors[t] for t in op.outputs if t in gd.tensors]
            out[op.id] = OpInfo(
                id=op.id, type=op.type, name=op.name, graph=gid, source=op.debug,
                origin=op.origin, category=_category(op),
                inputs=[_tensor_text(gd, t) for t in op.inputs],
                outputs=[_tensor_text(gd, t) for t in op.outputs],
                bytes_in=sum(tensor_bytes(i) for i in ins),
                bytes_out=sum(tensor_bytes(i) for i in outs),
                flops=op_flops(op, gd), group=group, called=tuple(op.called))
    return out
