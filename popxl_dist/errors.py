"""Exceptions of the popxl API."""

__all__ = ["UndefinedValue", "EngineError"]


class UndefinedValue(ValueError):
    """A tensor attribute (such as its ipu) has no defined value."""


class EngineError(RuntimeError):
    """An op failed while the emulator executed it; the message names the op and where it was built."""
