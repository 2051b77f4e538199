"""`GraphCache`: reuse a graph when a function/module is built again with equal arguments."""
from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any, Callable, Dict

import popxl
from popxl import ops

from .graph import BoundGraph, GraphWithNamedArgs

__all__ = ["GraphCache", "function", "bound_arguments", "tensor_hash", "argument_hash",
           "get_function_hash"]


def _tensor_key(t: Any) -> Any:
    return ("tensor", tuple(t.shape), t.dtype, tuple(t.meta_shape or ()))


def _arg_hash(x: Any) -> Any:
    """A hashable key for one bound argument (tensors by spec, graphs by graph, ...)."""
    if isinstance(x, (popxl.Tensor, popxl.TensorSpec)):
        return _tensor_key(x)
    if isinstance(x, BoundGraph):
        return ("bound", x.graph, tuple((k.id, _arg_hash(v)) for k, v in x.args.items()))
    if isinstance(x, GraphWithNamedArgs):
        return ("gwna", x.graph)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_arg_hash(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((_arg_hash(k), _arg_hash(v)) for k, v in x.items()))
    try:
        hash(x)
    except TypeError:
        raise TypeError(f"GraphCache: argument {x!r} of type {type(x).__name__} is not "
                        f"hashable, so the graph cannot be cached") from None
    return x


def _build_fn(fn: Callable) -> Callable:
    return fn.build if isinstance(fn, popxl.Module) else fn


def bound_arguments(fn: Callable, *args: Any, **kwargs: Any) -> inspect.BoundArguments:
    """`args`/`kwargs` bound to `fn`'s parameters (a Module's `build`), defaults applied."""
    bound = inspect.signature(_build_fn(fn)).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


def tensor_hash(t: Any) -> int:
    """Hash of a Tensor or TensorSpec by shape, dtype and meta_shape (what a graph input is)."""
    return hash(_tensor_key(t))


def argument_hash(arg: Any) -> int:
    """Hash of one argument as the cache sees it (tensors by spec, graphs by identity, other
    values by value; unhashable values raise TypeError)."""
    return hash(_arg_hash(arg))


def _function_key(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """The cache key of building `fn` with these arguments in the current context."""
    ctx = popxl.context.get_current_context()
    try:
        items = tuple((k, _arg_hash(v)) for k, v in
                      bound_arguments(fn, *args, **kwargs).arguments.items())
    except (TypeError, ValueError) as e:
        if "not hashable" in str(e):
            raise
        items = (tuple(_arg_hash(a) for a in args),
                 tuple((k, _arg_hash(v)) for k, v in sorted(kwargs.items())))
    # `fn` by its hash, as upstream: two instances of a Module that hash alike (a `__hash__`
    # of their configuration) share one graph.
    return (hash(fn), ctx.ipu_id, ctx.tile_set, items)


def get_function_hash(fn: Callable, *args: Any, **kwargs: Any) -> int:
    """Hash of building `fn` with these arguments here: equal hashes reuse the same graph."""
    return hash(_function_key(fn, *args, **kwargs))


class GraphCache:
    """Per-Ir cache {hash(fn, ipu, tile set, bound arguments): Graph}.

    Example:
        >>> cache = GraphCache()
        >>> g1 = cache.create_graph(fn, x.spec)
        >>> g2 = cache.create_graph(fn, x.spec)   # same shapes and dtypes: g2 is g1
    """

    def __init__(self) -> None:
        self._cache: "weakref.WeakKeyDictionary[popxl.Ir, Dict[Any, popxl.Graph]]" = \
            weakref.WeakKeyDictionary()

    def create_graph(self, fn: Callable, *args: Any, **kwargs: Any) -> popxl.Graph:
        """The cached graph for these arguments, or a new one from `ir.create_graph`."""
        ir = popxl.gir()
        cache = self._cache.setdefault(ir, {})
        key = _function_key(fn, *args, **kwargs)     # the full key: no hash collisions
        graph = cache.get(key)
        if graph is None:
            graph = ir.create_graph(fn, *args, **kwargs)
            cache[key] = graph
        return graph


def function(fn: Callable) -> Callable:
    """Decorator: build `fn` once per distinct argument specs and call the graph."""
    cache = GraphCache()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        graph = cache.create_graph(fn, *args, **kwargs)
        sig = inspect.signature(fn)
        bound = sig.bind(*args, **kwargs)
        tensors = []
        for v in bound.arguments.values():
            vs = v if isinstance(v, (list, tuple)) else (v.values() if isinstance(v, dict) else [v])
            tensors.extend(t for t in vs if isinstance(t, popxl.Tensor))
        outs = ops.call(graph, *tensors)
        return outs[0] if len(outs) == 1 else outs

    return wrapper
