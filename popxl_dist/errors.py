"""Exceptions of the popxl API.

Errors upstream raises from PopART (`popart.popart_exception`) are raised here as
`popart_exception` or a subclass (`EngineError` and the worker errors), so `except
popart.popart_exception` catches them as it does upstream; they are also `RuntimeError`s.
"""
from popart import popart_exception

__all__ = ["UndefinedValue", "popart_exception", "EngineError", "WorkerError", "WorkerDied",
           "InstanceFailed", "CollectiveTimeout", "RunAborted"]


class UndefinedValue(ValueError):
    """A tensor attribute (such as its ipu) has no defined value."""


class EngineError(popart_exception):
    """An op failed while the emulator executed it; the message names the op and where it was built."""


class WorkerError(EngineError):
    """A worker (thread, MPI rank or Ray actor) failed; the message names its replicas and the op."""


class WorkerDied(WorkerError):
    """A worker process died; the pool that held it cannot be used again."""


class InstanceFailed(WorkerError):
    """Another popdist instance failed (raised, exited or died); `instance` is its index."""

    def __init__(self, message: str, instance: int = -1):
        super().__init__(message)
        self.instance = instance


class CollectiveTimeout(EngineError):
    """A collective waited longer than `POPXL_COLLECTIVE_TIMEOUT` seconds for its peers."""


class RunAborted(RuntimeError):
    """This worker's run was stopped because another worker failed (internal)."""
