"""`popart.getLogger`: PopART's logger, as upstream's (spdlog) behaves: its own sink, not
Python's logging tree; stderr by default (`POPART_LOG_DEST`: "stdout", "stderr" or a file);
level WARN by default (`POPART_LOG_LEVEL`: TRACE, DEBUG, INFO, WARN, ERR, CRITICAL, OFF);
lines as upstream's default format: `<UTC time> popart:<module> <pid>.<tid> <L>: <message>`.
"""
from __future__ import annotations

import datetime
import logging
import os
import sys
import threading

__all__ = ["getLogger", "Logger"]

_LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "ERR": logging.ERROR, "CRITICAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10}
_LETTERS = {5: "T", logging.DEBUG: "D", logging.INFO: "I", logging.WARNING: "W",
            logging.ERROR: "E", logging.CRITICAL: "C"}


class _Sink(logging.Handler):
    """Writes each record to the destination as it is at that moment (so a redirected
    sys.stderr, e.g. pytest's capture, receives it)."""

    def emit(self, record: logging.LogRecord) -> None:
        when = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        line = (f"{when.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} {record.name.replace('.', ':', 1)} "
                f"{record.process}.{threading.get_native_id()} "
                f"{_LETTERS.get(record.levelno, 'W')}: {record.getMessage()}\n")
        dest = os.environ.get("POPART_LOG_DEST", "stderr")
        if dest in ("stderr", "stdout"):
            stream = sys.stderr if dest == "stderr" else sys.stdout
            stream.write(line)
            stream.flush()
        else:
            with open(dest, "a") as f:
                f.write(line)


def _level(name: str) -> int:
    try:
        return _LEVELS[name.upper()]
    except KeyError:
        raise ValueError(f"popart logger: unknown level {name!r}, expected one of "
                         f"{sorted(_LEVELS)}") from None


_root = logging.getLogger("popart")
_root.propagate = False
_root.addHandler(_Sink())
_configured = False


def _configure() -> None:
    """Read POPART_LOG_LEVEL when PopART first logs (upstream's logging context is made then,
    so a level set in the environment after `import popart` still counts)."""
    global _configured
    if not _configured:
        _configured = True
        _root.setLevel(_level(os.environ.get("POPART_LOG_LEVEL", "WARN")))


class Logger:
    """One of PopART's module loggers ("all" sets every module's level)."""

    def __init__(self, name: str = "all") -> None:
        _configure()
        self._log = _root if name == "all" else _root.getChild(name.lower())

    def setLevel(self, level: str) -> None:
        self._log.setLevel(_level(level))

    def debug(self, info: str) -> None:
        self._log.debug(info)

    def info(self, info: str) -> None:
        self._log.info(info)

    def warn(self, info: str) -> None:
        self._log.warning(info)

    def error(self, info: str) -> None:
        self._log.error(info)

    def critical(self, info: str) -> None:
        self._log.critical(info)


def getLogger(name: str = "all") -> Logger:
    """PopART's logger for module `name` (upstream `popart.getLogger`)."""
    return Logger(name)
