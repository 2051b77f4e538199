"""How a worker reports a failure to the host: the debugging errors travel as themselves (the
host raises the very error the worker raised, with its attributes), every other failure as its
one-line description, which the host wraps in a WorkerError naming the worker."""
from __future__ import annotations

import pickle
from typing import Callable, Iterable, Union

from ...engine.flight import attach, merge_peers
from ...errors import NonFiniteError, ReplicaDivergenceError

__all__ = ["reported", "host_error", "flight_of", "with_flights", "message_of"]

# Their messages already name the replica, the op and the run: raised unchanged on the host.
_AS_THEY_ARE = (NonFiniteError, ReplicaDivergenceError)


def message_of(exc: BaseException) -> str:
    """`exc`'s message without its flight-recorder summary (the records travel beside it and
    the host summarises every worker's together)."""
    base = getattr(exc, "flight_base", None)
    return str(exc) if base is None else base


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {message_of(exc)}"


def reported(exc: BaseException) -> Union[str, BaseException]:
    """What a worker sends the host for `exc`: the error itself when the host re-raises it as
    it is (and it pickles), else its description."""
    if isinstance(exc, _AS_THEY_ARE):
        try:
            pickle.dumps(exc)
            return exc.with_traceback(None)
        except Exception:  # noqa: BLE001 - an attribute that does not pickle: describe it
            pass
    return _describe(exc)


def host_error(value: Union[str, BaseException],
               wrap: Callable[[str], BaseException]) -> BaseException:
    """The error the host raises for a worker's report: the worker's own error, or `wrap` of
    its description."""
    return value if isinstance(value, BaseException) else wrap(value)


def flight_of(exc: BaseException):
    """The flight records a worker's failure carries (see `engine/flight.py`), or None."""
    return getattr(exc, "flight", None)


def with_flights(err: BaseException, flights: Iterable) -> BaseException:
    """`err` with other workers' flight records added (when `err` carries its own, the summary
    in its message then covers every replica), or given them when it has none."""
    flights = [f for f in flights if f]
    if not flights:
        return err
    if getattr(err, "flight", None) is None:
        first, flights = flights[0], flights[1:]
        attach(err, first)
    return merge_peers(err, flights)
