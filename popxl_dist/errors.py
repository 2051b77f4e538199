"""Exceptions of the popxl API.

Errors upstream raises from PopART (`popart.popart_exception`) are raised here as
`popart_exception` or a subclass (`EngineError` and the worker errors), so `except
popart.popart_exception` catches them as it does upstream; they are also `RuntimeError`s.
"""
from popart import poplar_application_runtime_error, popart_exception

__all__ = ["UndefinedValue", "popart_exception", "OpSetupError", "OpSetupTypeError",
           "EngineError", "EngineRuntimeError", "DeviceRuntimeError", "WorkerError", "WorkerDied",
           "HostUnreachable", "InstanceFailed", "CollectiveTimeout", "SessionFailed", "RunAborted",
           "NonFiniteError", "ReplicaDivergenceError", "ReplicaDivergenceWarning"]


class UndefinedValue(ValueError):
    """A tensor attribute (such as its ipu) has no defined value."""


class OpSetupError(popart_exception, ValueError):
    """An op PopART refuses when it sets the op up (upstream: a `popart_exception` from the
    builder, e.g. a matmul whose contracting dimensions differ); also a ValueError, as the
    emulator raised these before."""


class OpSetupTypeError(popart_exception, TypeError):
    """An op PopART refuses for its operands' dtypes (a `popart_exception` upstream); also a
    TypeError."""


class EngineError(popart_exception):
    """An op failed while the emulator executed it; the message names the op and where it was built."""


class DeviceRuntimeError(poplar_application_runtime_error):
    """A run-time check the IPU itself makes failed (upstream: a Poplar application runtime
    error from the device, e.g. a float8 log2 scale out of range); kernels raise it."""


class EngineRuntimeError(EngineError, poplar_application_runtime_error):
    """An EngineError (naming the op) for a `DeviceRuntimeError`: caught by `except
    popart.poplar_application_runtime_error`, as upstream's device error is."""


class WorkerError(EngineError):
    """A worker (thread, MPI rank or Ray actor) failed; the message names its replicas and the op."""


class WorkerDied(WorkerError):
    """A worker process died; the pool that held it cannot be used again."""


class HostUnreachable(WorkerDied):
    """A host of the job stopped answering (its network link is down, or it crashed): nothing
    came from it for `POPXL_PEER_TIMEOUT` seconds. The message names the host and the workers
    (or instances) on it; `hosts` lists the hosts, `workers` their workers."""

    host = ""
    hosts: list = []
    workers: list = []


class InstanceFailed(WorkerError):
    """Another popdist instance failed (raised, or exited); `instance` is its index. An instance
    that died is reported as `WorkerDied` (its `instance` set too), whichever way the others
    learn of it."""

    def __init__(self, message: str, instance: int = -1):
        super().__init__(message)
        self.instance = instance


class CollectiveTimeout(WorkerError):
    """A collective waited longer than `POPXL_COLLECTIVE_TIMEOUT` seconds for a worker that sent
    nothing (stopped, hung, or far slower than its peers). The message names the op, the
    replicas that waited and the silent worker; `op`, `replicas` and `workers` (the silent
    workers) are set when known."""

    op = None
    replicas: tuple = ()
    workers: tuple = ()


class SessionFailed(EngineError):
    """A device operation of a Session whose earlier run (or weight transfer) failed: its
    replicas may be out of step. `first_error` is the failure; `Session.reset()` or a new
    Session clears it."""

    first_error = None


class RunAborted(RuntimeError):
    """This worker's run was stopped because another worker failed (internal)."""


class NonFiniteError(EngineError, FloatingPointError):
    """An op produced a NaN or an infinity that none of its inputs held (`POPXL_DEBUG_NANS=1`),
    or an IEEE invalid / overflow / divide-by-zero result under
    `SessionOptions.enableFloatingPointChecks`. A popxl-dist extension (upstream's floating-point
    checks raise a Poplar exception). The message names the op, the `file:line` that built it
    (for a backward op also the forward op it differentiates), the replica, the run and a
    summary of its inputs; the same facts are attributes: `op` (the IR op), `graph`, `replica`,
    `run`, `source`, `forward`, `inputs` and `outputs` (summaries, one line each)."""

    op = None
    graph = ""
    replica = -1
    run = -1
    source = ""
    forward = ""
    inputs: tuple = ()
    outputs: tuple = ()


class ReplicaDivergenceError(EngineError):
    """Variables that must hold the same value on every replica of their group differ after a
    run (`POPXL_CHECK_REPLICAS=1`; a popxl-dist extension). `variables` maps each variable id to
    the groups of replicas whose values agree; `run` is the run after which they differed."""

    variables: dict = {}
    run = -1


class ReplicaDivergenceWarning(UserWarning):
    """A variable that must hold the same value on every replica of its group is updated from
    values that can differ between them, with no collective to make them equal: the replicas
    will diverge (found when the Session is created; a popxl-dist extension)."""
