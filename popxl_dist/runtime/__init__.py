"""Runtimes place an Ir's replicas on workers. `create_runtime` picks the backend named by
`POPXL_BACKEND` (default `local`) with `POPXL_WORKERS` workers."""
from __future__ import annotations

from .._ir.records import IrData
from .base import Runtime
from .env import backend_name, worker_count

__all__ = ["create_runtime", "Runtime"]


def create_runtime(ir: IrData) -> Runtime:
    name = backend_name()
    if name == "local":
        from .local import LocalRuntime

        return LocalRuntime(ir, worker_count(default=1))
    raise NotImplementedError(
        f"POPXL_BACKEND={name!r}: the '{name}' backend is not implemented yet; only 'local' is "
        f"available in this version")
