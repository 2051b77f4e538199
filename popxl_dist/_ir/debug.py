"""What a Session was asked to watch while it runs: plain data carried by the IR to every worker.

The host reads the `POPXL_*` debugging variables once, when a Session is created (`from_env`),
so every worker (MPI rank, Ray actor, popdist instance) runs with the same settings whatever
its own environment says. All are off by default; when off, the compiled program is exactly
the one that runs without debugging.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Optional, Tuple

from .._env import positive_int

__all__ = ["DebugOptions", "FLIGHT_RECORDER_DEFAULT_SIZE"]

FLIGHT_RECORDER_DEFAULT_SIZE = 64


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), got {value!r}")


def _directory(name: str) -> Optional[str]:
    value = os.environ.get(name, "").strip()
    return os.path.abspath(value) if value else None


@dataclass(frozen=True)
class DebugOptions:
    """The debugging a Session does (see docs/debugging.md).

    Attributes:
        nans: stop at the first op whose output holds a NaN or infinity that none of its inputs
            held (`POPXL_DEBUG_NANS=1`), raising `popxl.errors.NonFiniteError`.
        fp_checks: upstream's `SessionOptions.enableFloatingPointChecks`: raise for every op
            that produces an IEEE invalid / overflow / divide-by-zero result.
        check_replicas: after each run compare every variable across the replicas that must
            hold the same value (`POPXL_CHECK_REPLICAS=1`), raising
            `popxl.errors.ReplicaDivergenceError`.
        record_dir: keep what is needed to replay the latest run; a failing run's bundle is
            written here (`POPXL_RECORD=DIR`).
        flight_dir: write every worker's flight recorder (its last collectives) here when a
            run fails (`POPXL_FLIGHT_RECORDER=DIR`).
        flight_size: collectives kept per replica (`POPXL_FLIGHT_RECORDER_SIZE`, default 64).
        profile_dir: time every op on every replica and write the job's trace and table
            here (`POPXL_PROFILE=DIR`, see docs/profiling.md).
        session_tag: names this Session's bundles and dumps (`session<k>`), the same in every
            popdist instance of a job (instances create their Sessions in the same order).
        scratch_variables: variables whose replicas may differ (written only by stores of
            differing data, e.g. pipeline stashes; found by the replica-consistency pass):
            not compared by `check_replicas`.
    """

    nans: bool = False
    fp_checks: bool = False
    check_replicas: bool = False
    record_dir: Optional[str] = None
    flight_dir: Optional[str] = None
    flight_size: int = FLIGHT_RECORDER_DEFAULT_SIZE
    session_tag: str = "session0"
    profile_dir: Optional[str] = None
    scratch_variables: Tuple[str, ...] = ()

    @classmethod
    def from_env(cls, fp_checks: bool = False, session_tag: str = "session0") -> "DebugOptions":
        return cls(nans=_flag("POPXL_DEBUG_NANS"), fp_checks=bool(fp_checks),
                   check_replicas=_flag("POPXL_CHECK_REPLICAS"),
                   record_dir=_directory("POPXL_RECORD"),
                   flight_dir=_directory("POPXL_FLIGHT_RECORDER"),
                   flight_size=(positive_int("POPXL_FLIGHT_RECORDER_SIZE")
                                or FLIGHT_RECORDER_DEFAULT_SIZE),
                   session_tag=session_tag, profile_dir=_directory("POPXL_PROFILE"))

    @property
    def checks_values(self) -> bool:
        """Whether every op's outputs are checked for new NaNs / infinities."""
        return self.nans or self.fp_checks

    def with_(self, **changes) -> "DebugOptions":
        return replace(self, **changes)
