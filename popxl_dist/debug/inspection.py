"""Building a script's Irs without running them (`popxl-inspect`): while `inspecting()` is
active, every `popxl.Session` records its Ir and gets a runtime that holds nothing; the first
thing that would touch the device (attaching, a run, a weight transfer) stops the script with
`StopInspection`. So a script is inspected as it is, up to its first device operation: every Ir
it built and every Session it created by then."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List

from .._ir.records import IrData
from ..engine.compile import stream_slots
from ..runtime.base import Runtime

__all__ = ["StopInspection", "InspectionRuntime", "inspecting"]


class StopInspection(BaseException):
    """The inspected script reached its first device operation (a BaseException, so that the
    script's own `except Exception` does not keep it going)."""


class InspectionRuntime(Runtime):
    """A Session's runtime under `popxl-inspect`: records the Ir, allocates nothing."""

    name = "inspection"

    def __init__(self, ir: IrData, seen: List[IrData]):
        super().__init__(ir)
        seen.append(ir)
        self.h2d_streams, self.d2h_streams = stream_slots(ir)

    def _stop(self, *_args, **_kwargs):
        raise StopInspection("the script reached its first device operation")

    attach = run = run_fragment = read_variables = write_variables = memory_report = _stop

    def close(self) -> None:
        pass


@contextmanager
def inspecting() -> Iterator[List[IrData]]:
    """While active, Sessions record their Irs (into the yielded list) and stop the script at
    their first device operation."""
    from .. import runtime

    seen: List[IrData] = []
    before = runtime._INSPECTING
    runtime._INSPECTING = lambda ir: InspectionRuntime(ir, seen)
    try:
        yield seen
    finally:
        runtime._INSPECTING = before
