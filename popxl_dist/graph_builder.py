"""`Ir.create_graph`: turn a Python function or Module into a subgraph."""
from __future__ import annotations

import inspect
import typing
from typing import TYPE_CHECKING, Any, Callable, Tuple

from .tensor import Tensor, TensorByRef, TensorSpec, graph_input, graph_output

if TYPE_CHECKING:
    from .graph import Graph
    from .ir import Ir


def _graph_name(fn: Callable) -> Tuple[str, Callable]:
    from .module import Module

    if isinstance(fn, Module):
        return type(fn).__qualname__.replace(".<locals>", ""), fn.build
    if not callable(fn):
        raise TypeError("Callable `fn` must be either a function or a class that extends "
                        f"popxl.Module (got {type(fn).__name__})")
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return qual.replace(".<locals>", ""), fn


def _is_by_ref(annotation: Any) -> bool:
    if annotation is TensorByRef:
        return True
    if isinstance(annotation, str):
        return "TensorByRef" in annotation
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, typing.Union):
        return any(_is_by_ref(a) for a in typing.get_args(annotation))
    return False


def _check_not_mixed(value: Any, name: str) -> None:
    """Upstream's rule for a list, tuple, *args or **kwargs argument: all Tensors or none."""
    items = list(value.values()) if isinstance(value, dict) else list(value)
    is_t = [isinstance(v, (Tensor, TensorSpec)) for v in items]
    if any(is_t) and not all(is_t):
        raise TypeError(f"A {type(value)} argument can't contain a mixture of Tensors and "
                        f"other types. Arg name: {name}. Value: {value}")


def _as_input(value: Any, name: str, by_ref: bool) -> Any:
    if isinstance(value, (Tensor, TensorSpec)):
        return graph_input(value.shape, value.dtype, name, by_ref=by_ref,
                           meta_shape=value.meta_shape or None)
    if isinstance(value, (list, tuple)) and value:
        _check_not_mixed(value, name)
        if all(isinstance(v, (Tensor, TensorSpec)) for v in value):
            return type(value)(_as_input(v, f"{name}_{i}", by_ref) for i, v in enumerate(value))
    return value


def build_graph(ir: "Ir", fn: Callable, args: tuple, kwargs: dict) -> "Graph":
    name, build = _graph_name(fn)
    try:
        sig = inspect.signature(build)
    except (TypeError, ValueError):
        sig = None
    g = ir._new_graph(name)
    with g:
        if sig is None:
            new_args = [_as_input(a, f"arg_{i}", False) for i, a in enumerate(args)]
            new_kwargs = {k: _as_input(v, k, False) for k, v in kwargs.items()}
        else:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise ValueError(f"The arguments, `args` and `kwargs`, do not match the "
                                 f"signature of the function `fn`. (create_graph: '{name}' "
                                 f"{sig}: {e})") from e
            # Defaults fill the gaps, so that an argument given by keyword after a defaulted
            # one is not passed on positionally into the defaulted parameter.
            bound.apply_defaults()
            new_args, new_kwargs = [], {}
            for pname, value in bound.arguments.items():
                p = sig.parameters[pname]
                by_ref = _is_by_ref(p.annotation)
                if p.kind == p.VAR_POSITIONAL:
                    _check_not_mixed(value, pname)
                    new_args.extend(_as_input(v, f"{pname}_{i}", by_ref)
                                    for i, v in enumerate(value))
                elif p.kind == p.VAR_KEYWORD:
                    _check_not_mixed(value, pname)
                    new_kwargs.update({k: _as_input(v, k, by_ref) for k, v in value.items()})
                elif p.kind == p.KEYWORD_ONLY:
                    new_kwargs[pname] = _as_input(value, pname, by_ref)
                else:
                    new_args.append(_as_input(value, pname, by_ref))
        out = build(*new_args, **new_kwargs)
        if out is None:
            outs: Tuple = ()
        elif isinstance(out, Tensor):
            outs = (out,)
        else:
            try:
                outs = tuple(out)
            except TypeError:
                outs = None
        if outs is None or not all(isinstance(o, Tensor) for o in outs):
            raise ValueError(f"Output of subgraph must be None, a Tensor or an iterable of "
                             f"Tensors. Output type: {type(out)}. Value {out} (create_graph: "
                             f"'{name}')")
        for o in outs:
            graph_output(o)
    return g
