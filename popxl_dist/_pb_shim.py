"""Small stand-ins for the popart objects real programs reach through `_pb_ir` / `_pb_graph`."""
from __future__ import annotations

from typing import List

__all__ = ["PbIr", "PbGraph", "SessionOptions"]


class SessionOptions:
    """A settable bag of session options (e.g. `numIOTiles`); numerically irrelevant here."""

    def __init__(self) -> None:
        self.numIOTiles = 0
        self.globalReplicaOffset = 0
        self.globalReplicationFactor = 1
        self.replicatedGraphCount = 1
        self.enableReplicatedGraphs = False
        self.enableDistributedReplicatedGraphs = False
        self.enableExplicitMainLoops = True
        self.useHostCopyOps = True
        self.partialsTypeMatMuls = "float"


class PbIr:
    def __init__(self, ir) -> None:
        self._ir = ir

    def getSessionOptions(self) -> SessionOptions:
        if self._ir._session_options is None:
            self._ir._session_options = SessionOptions()
        return self._ir._session_options

    def getAllGraphs(self) -> List["PbGraph"]:
        return [PbGraph(self._ir._graph(g)) for g in self._ir._data.graphs]


class PbGraph:
    def __init__(self, graph) -> None:
        self._graph = graph

    @property
    def id(self) -> str:
        return self._graph.id

    def getOpSchedule(self, require_optimal: bool = True):
        return list(self._graph._data.ops)

    def getOps(self):
        return list(self._graph._data.ops)

    def getInputIndex(self, tid: str) -> int:
        return self._graph._data.inputs.index(tid)

    def getInputTensor(self, i: int):
        return self._graph._tensor(self._graph._data.inputs[i])

    def getOutputTensor(self, i: int):
        return self._graph._tensor(self._graph._data.outputs[i])

    def setCanBeRecursivelyAutodiffed(self, can: bool) -> None:
        self._graph._data.no_recursive_autodiff = not can

    def removeOutput(self, i: int) -> None:
        del self._graph._data.outputs[i]
