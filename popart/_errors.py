"""The exception classes upstream's `popart_core` registers, as the emulator raises them.

`popart_exception` is what PopXL raises for user errors the PopART layer detects (autodiff of a
graph with modifying ops, a required gradient that cannot be provided, ...). Deliberate
difference: upstream's classes derive from `Exception` only; here `popart_exception` also derives
from `RuntimeError`, so code written against either base catches the emulator's errors.
"""
from __future__ import annotations

__all__ = ["popart_exception", "popart_internal_exception", "poplar_exception",
           "poplibs_exception", "poplar_runtime_error", "poplar_application_runtime_error",
           "poplar_recoverable_runtime_error", "poplar_unrecoverable_runtime_error",
           "OutOfMemoryException"]


class popart_exception(RuntimeError):  # noqa: N801 - upstream's name
    """An error reported by PopART (upstream `popart.popart_exception`)."""


class popart_internal_exception(popart_exception):  # noqa: N801
    """An internal PopART error (upstream `popart.popart_internal_exception`)."""


class poplar_exception(RuntimeError):  # noqa: N801
    """An error reported by Poplar (upstream `popart.poplar_exception`)."""


class poplibs_exception(RuntimeError):  # noqa: N801
    """An error reported by PopLibs (upstream `popart.poplibs_exception`)."""


class poplar_runtime_error(poplar_exception):  # noqa: N801
    """A Poplar runtime error (upstream `popart.poplar_runtime_error`)."""


class poplar_application_runtime_error(poplar_runtime_error):  # noqa: N801
    """Upstream `popart.poplar_application_runtime_error`."""


class poplar_recoverable_runtime_error(poplar_runtime_error):  # noqa: N801
    """Upstream `popart.poplar_recoverable_runtime_error`."""


class poplar_unrecoverable_runtime_error(poplar_runtime_error):  # noqa: N801
    """Upstream `popart.poplar_unrecoverable_runtime_error`."""


class OutOfMemoryException(popart_exception):
    """Upstream `popart.OutOfMemoryException`: graph compilation ran out of tile memory.

    The emulator has no tile memory, so it never raises this; it exists so that programs'
    `except popart.OutOfMemoryException` clauses import and work.
    """

    def __init__(self, e: BaseException | str = "out of memory") -> None:
        super().__init__(str(e))
        self.error = e

    def getSummaryReport(self) -> str:
        return str(self.error)

    def getProfilePath(self) -> str:
        return ""
