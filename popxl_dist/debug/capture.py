"""`popxl.debug.capture`: read any tensor of a running program, on every replica, without
editing the program."""
from __future__ import annotations

from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import numpy as np

__all__ = ["capture", "TapCall"]


class TapCall(NamedTuple):
    """One value a captured tensor took in a run: `site` names the calls it was computed in
    (outermost first, empty for the main graph), `value` is `(R, *shape)`, one row per
    replica."""

    site: Tuple[str, ...]
    value: np.ndarray


class capture:
    """Keep the values of `tensors` in the runs made inside the `with` block (popxl-dist
    extension).

    The program is compiled again with taps for the block (on every worker; the bits do not
    change) and back without them after it. Tensors may belong to the main graph or to called
    graphs; a tensor of a called graph is kept at every call (and loop iteration).

    Example:
        >>> with popxl.debug.capture(session, [hidden, probs]) as cap:
        ...     session.run(inputs)
        >>> cap[hidden].shape        # (replicas, *hidden.shape): the last run's value
        >>> cap.calls(attn_scores)   # [TapCall(site, value), ...] one per call

    Values are those of the last run in the block, for the replicas this process feeds (all
    replicas, or this instance's under popdist); a variable's value is the one it had when the
    run started.
    """

    def __init__(self, session, tensors: Iterable):
        from ..session import Session
        from ..tensor import Tensor

        if not isinstance(session, Session):
            raise TypeError(f"popxl.debug.capture: `session` must be a popxl.Session, got "
                            f"{type(session).__name__}")
        if isinstance(tensors, Tensor):
            tensors = [tensors]
        self._session = session
        self._tensors: List = []
        taps: Dict[str, List[str]] = {}
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"popxl.debug.capture: every tensor must be a popxl.Tensor, got "
                                f"{t!r}")
            if t.ir is not session.ir:
                raise ValueError(f"popxl.debug.capture: tensor '{t.id}' belongs to another Ir "
                                 f"than the Session's")
            gid = t._graph._data.id
            taps.setdefault(gid, []).append(t.id)
            self._tensors.append(t)
        self._taps = taps
        self._calls: Optional[Dict[Tuple[str, str], List[TapCall]]] = None
        self._open = False

    def __enter__(self) -> "capture":
        self._session._runtime.set_taps(self._taps)
        self._open = True
        self._calls = None
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self._fetch()
        finally:
            self._open = False
            try:
                self._session._runtime.set_taps(None)
            except Exception:  # noqa: BLE001 - a failed runtime has nothing to restore
                if exc[0] is None:
                    raise

    # --- results -------------------------------------------------------------------------
    def _fetch(self) -> Dict[Tuple[str, str], List[TapCall]]:
        if self._calls is not None and not self._open:
            return self._calls
        per_replica = self._session._runtime.take_taps()
        replicas = sorted(per_replica)
        by_key: Dict[Tuple[str, str], Dict[int, list]] = {}
        for r in replicas:
            for gid, tid, sites, value in per_replica[r]:
                by_key.setdefault((gid, tid), {}).setdefault(r, []).append((sites, value))
        ops = _op_descriptions(self._session.ir._data)
        calls: Dict[Tuple[str, str], List[TapCall]] = {}
        for key, got in by_key.items():
            counts = {r: len(v) for r, v in got.items()}
            if len(set(counts.values())) > 1 or set(got) != set(replicas):
                raise ValueError(f"popxl.debug.capture: tensor '{key[1]}' was computed a "
                                 f"different number of times on different replicas "
                                 f"({counts}), e.g. in a conditional: its values cannot be "
                                 f"stacked by replica")
            rows = [got[r] for r in replicas]
            calls[key] = [TapCall(tuple(ops.get(i, f"op {i}") for i in rows[0][k][0]),
                                  np.stack([row[k][1] for row in rows]))
                          for k in range(len(rows[0]))]
        self._calls = calls
        return calls

    def _key(self, t) -> Tuple[str, str]:
        key = (t._graph._data.id, t.id)
        if key not in {(k._graph._data.id, k.id) for k in self._tensors}:
            raise KeyError(f"popxl.debug.capture: tensor '{t.id}' was not captured (pass it "
                           f"to capture(session, tensors))")
        return key

    def calls(self, tensor) -> List[TapCall]:
        """Every value `tensor` took in the last run, in order (one per call of its graph, per
        loop iteration)."""
        key = self._key(tensor)
        got = self._fetch().get(key)
        if not got:
            raise KeyError(f"popxl.debug.capture: tensor '{tensor.id}' was not computed in the "
                           f"last run inside the capture (no run yet, or its graph was not "
                           f"called)")
        return got

    def __getitem__(self, tensor) -> np.ndarray:
        """The `(R, *shape)` value of a tensor computed once per run."""
        got = self.calls(tensor)
        if len(got) > 1:
            raise ValueError(f"popxl.debug.capture: tensor '{tensor.id}' was computed "
                             f"{len(got)} times in the run (its graph is called several "
                             f"times or in a loop): use capture.calls(tensor)")
        return got[0].value


def _op_descriptions(ir) -> Dict[int, str]:
    return {op.id: op.describe() for gd in ir.graphs.values() for op in gd.ops
            if op.type in ("Call", "Loop", "If")}
