"""Public `Ir`: the whole program, its graphs and its replication settings."""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable, ClassVar, Dict, List, Optional, Set, Union

from popart import SessionOptions, VirtualGraphMode

from ._ir.records import GraphData, IrData
from .graph import Graph

__all__ = ["Ir"]

_IR_IDS = itertools.count()


class Ir:
    """A PopXL program: a main graph, subgraphs, streams and replication settings.

    Args:
        replication: the replication factor, or "popdist" to take it from the launcher
            (poprun, `mpirun -n N`, `popxl-run --instances N`): `replication_factor` is then the
            global count and `instance_replication_factor` this process's share.
    """

    # Ir id -> Ir, for `Ir._from_pb`
    _ir_cache: ClassVar["weakref.WeakValueDictionary[int, Ir]"] = weakref.WeakValueDictionary()

    def __init__(self, replication: Union[int, str] = 1):
        self._id = next(_IR_IDS)
        self._data = IrData(self._id)
        self._graphs: Dict[str, Graph] = {}
        self._prepared = False
        self._session_options: Optional[SessionOptions] = None
        self._streams: Dict[str, Any] = {}
        self._use_popdist = replication == "popdist"
        # Set when a variable is backed by a read-only np.memmap (weights cannot go to host).
        self._has_read_only_memmap = False
        Ir._ir_cache[self._id] = self
        if replication == "popdist":
            from .popdist_env import placement_from_popdist

            placement = placement_from_popdist(self._pb_ir.getSessionOptions())
            self._data.replication_factor = placement.total
            if placement.multi:
                from .runtime.instances.join import install_failure_hooks

                self._data.instance = placement
                install_failure_hooks()
            return
        self.replication_factor = replication

    # --- graphs ------------------------------------------------------------------------
    def _graph(self, gid: str) -> Graph:
        g = self._graphs.get(gid)
        if g is None:
            g = Graph._create(self, self._data.graphs[gid])
            self._graphs[gid] = g
        return g

    @property
    def main_graph(self) -> Graph:
        return self._graph("")

    def _check_not_frozen(self, what: str) -> None:
        """Refuse a change to the program once a Session exists: the Session compiled the Ir
        when it was created (upstream: it takes ownership, and the Ir must not be modified), so
        the change would silently never run."""
        if self._prepared:
            raise RuntimeError(
                f"{what}: {self!r} is frozen because a popxl.Session was created from it; ops, "
                f"tensors and graphs added now would never run. Build the whole program before "
                f"creating the Session, or build a new Ir.")

    def _new_graph(self, name: str) -> Graph:
        self._check_not_frozen(f"creating graph '{name}'")
        idx = self._data.new_graph_index()
        gid = f"{name}_subgraph({idx})"
        self._data.graphs[gid] = GraphData(gid)
        return self._graph(gid)

    def create_empty_graph(self, name: Optional[str] = None) -> Graph:
        """An empty subgraph named `<name or "graph">_subgraph(<n>)`."""
        return self._new_graph(name or "graph")

    def create_graph(self, fn: Callable, *args: Any, **kwargs: Any) -> Graph:
        """Build a subgraph by calling `fn` (or `Module.build`) inside it.

        Tensor and TensorSpec arguments become graph inputs named after their parameters
        (`name_0`, `name_1`, ... for list elements); other arguments pass through. The return
        value (None, a Tensor or an iterable of Tensors) becomes the graph outputs.
        """
        from .graph_builder import build_graph

        return build_graph(self, fn, args, kwargs)

    # --- settings ----------------------------------------------------------------------
    @property
    def num_host_transfers(self) -> int:
        return self._data.num_host_transfers

    @num_host_transfers.setter
    def num_host_transfers(self, n: int) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"num_host_transfers must be a positive int, got {n!r}")
        self._check_not_frozen("setting num_host_transfers")
        self._data.num_host_transfers = n

    @property
    def replication_factor(self) -> int:
        """The replica count. As upstream, where it is kept in the Ir's SessionOptions, setting
        `replicatedGraphCount` there (with `enableReplicatedGraphs`) before a Session is made
        sets it too."""
        opts = self._session_options
        if (opts is not None and not self._prepared and not self._use_popdist
                and self._data.instance is None):
            count = opts.replicatedGraphCount if opts.enableReplicatedGraphs else 1
            if isinstance(count, int) and count >= 1 and count != self._data.replication_factor:
                self._data.replication_factor = count
        return self._data.replication_factor

    @replication_factor.setter
    def replication_factor(self, r: int) -> None:
        if self._prepared:
            raise RuntimeError("replication_factor cannot change after a Session has prepared "
                               "the Ir")
        if self._data.instance is not None and r != self._data.replication_factor:
            raise ValueError(f"replication_factor of an Ir(replication='popdist') is the "
                             f"launcher's global count ({self._data.replication_factor}); "
                             f"got {r!r}")
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            raise ValueError(f"replication_factor must be a positive int, got {r!r}")
        self._data.replication_factor = r
        if self._session_options is not None:
            self._set_replication_options(self._session_options)

    def _set_replication_options(self, opts: SessionOptions) -> None:
        if not self._use_popdist:
            r = self._data.replication_factor
            opts.replicatedGraphCount = r
            opts.enableReplicatedGraphs = r > 1

    def _session_opts(self) -> SessionOptions:
        """The `popart.SessionOptions` of this Ir, with the options upstream's Ir sets."""
        if self._session_options is None:
            opts = SessionOptions()
            opts.virtualGraphMode = VirtualGraphMode.Manual
            for flag in ("useHostCopyOps", "aliasZeroCopy", "enableExplicitMainLoops",
                         "explicitRecomputation", "enableInplaceAmbiguityChecking",
                         "decomposeGradSum"):
                setattr(opts, flag, True)
            opts.enableVariablesCaching = False
            self._set_replication_options(opts)
            self._session_options = opts
        return self._session_options

    @property
    def instance_replication_factor(self) -> int:
        """The replicas this process holds (the global count unless a popdist instance)."""
        placement = self._data.instance
        return self.replication_factor if placement is None else placement.local

    def replica_grouping(self, stride: int = 1, group_size: Optional[int] = None):
        """A constant-stride grouping of this Ir's replicas (default: one group of all)."""
        from .replica_grouping import ReplicaGrouping

        return ReplicaGrouping._from_params(self, stride, group_size)

    def replica_grouping_from_assignments(self, assignment: List[int]):
        from .replica_grouping import ReplicaGrouping

        return ReplicaGrouping._from_assignment(self, assignment)

    # --- streams -----------------------------------------------------------------------
    def _streams_used_by(self, op_type: str) -> Set:
        from .streams import _stream_for

        used = []
        for gd in self._data.graphs.values():
            for op in gd.ops:
                if op.type == op_type and op.attrs["stream"] not in used:
                    used.append(op.attrs["stream"])
        return {_stream_for(self, s) for s in used}

    def get_all_h2d_streams(self) -> Set:
        return self._streams_used_by("HostLoad")

    def get_all_d2h_streams(self) -> Set:
        return self._streams_used_by("HostStore")

    def dot_checkpoint(self, check: str, save_dir=None) -> None:
        """Graphviz dumps are not produced by the emulator; accepted as a no-op."""

    # --- identity ----------------------------------------------------------------------
    @property
    def id(self) -> int:
        return self._id

    def __eq__(self, value: object) -> bool:
        if not isinstance(value, Ir):
            raise TypeError(f"Value must be of type popxl.Ir. Type: {type(value)}. Value: "
                            f"{value}.")
        return value is self

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        return f"Ir[id={self._id}]"

    @property
    def _pb_ir(self):
        from ._pb_shim import PbIr

        return PbIr(self)

    @classmethod
    def _from_pb(cls, pb_ir) -> "Ir":
        """The Ir of an `_pb_ir` view."""
        ir = cls._ir_cache.get(pb_ir.getId())
        if ir is None:
            raise ValueError(f"Ir._from_pb: no live Ir with id {pb_ir.getId()}")
        return ir

    @property
    def _graph_cache(self) -> Dict[str, Graph]:
        """{graph id: Graph} of every graph of this Ir."""
        return {gid: self._graph(gid) for gid in self._data.graphs}

    @property
    def _tensor_cache(self) -> Dict[str, Any]:
        """{tensor id: Tensor} of the tensors that already have popxl wrappers, all graphs."""
        return {tid: t for g in self._graphs.values() for tid, t in g._wrappers.items()}
