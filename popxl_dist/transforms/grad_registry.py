"""The grad-rule table: op type -> rule emitting the gradient ops (one entry per op input).

A rule is ``rule(g: GradContext, dys: list[Tensor | None]) -> list[Tensor | None]``: `dys[i]` is
the gradient of output i (None when no gradient reaches it) and the result has one entry per op
input (None = no gradient). Rules build ops with the public builders; the current graph is the
gradient graph. `g.fwd_in(i)` / `g.fwd_out(i)` make forward tensors available there.

Op types registered with `no_grad` stop the gradient silently (upstream: no grad op); `throws`
types raise if autodiff has to go through them (upstream's `getGradOps` throws).

The rules live in `transforms/grads/<family>.py`, the family of the op (see docs/development.md, Layout
section), including the second-order rules of the family's dedicated grad op types (autodiff of
a gradient graph): linear maps get their adjoint (a slice's gradient pads, so its adjoint slices;
a conv's data gradient is the transposed conv, ...), activation gradients their derivative in
both arguments. The other grad op types (normalisation, nll, max-pool, top-k/median/max/min
selection, scatter-reduce, pow/fmod, swish, one-hot and the other reductions' gradients) have no
rule: autodiff raises NotImplementedError naming the op.
"""
from __future__ import annotations

import sys
from typing import Callable, Dict, Set

__all__ = ["GRAD_RULES", "NO_GRAD", "THROWS", "REGISTERED_IN", "grad_rule", "no_grad", "throws",
           "load_all"]

GRAD_RULES: Dict[str, Callable] = {}
NO_GRAD: Set[str] = set()
THROWS: Set[str] = set()
# op type -> the module that registered its rule / mark (the op family's grads module)
REGISTERED_IN: Dict[str, str] = {}


def _check_new(op_type: str, module: str) -> None:
    if op_type in GRAD_RULES or op_type in NO_GRAD or op_type in THROWS:
        raise ValueError(f"a grad rule for op type '{op_type}' is already registered")
    REGISTERED_IN[op_type] = module


def _caller_module() -> str:
    return sys._getframe(2).f_globals.get("__name__", "")


def grad_rule(*op_types: str):
    """Register the decorated rule for each of `op_types`."""
    module = _caller_module()

    def deco(fn: Callable) -> Callable:
        for t in op_types:
            _check_new(t, module)
            GRAD_RULES[t] = fn
        return fn

    return deco


def no_grad(*op_types: str) -> None:
    """Mark op types whose inputs never receive a gradient."""
    module = _caller_module()
    for t in op_types:
        _check_new(t, module)
        NO_GRAD.add(t)


def throws(*op_types: str) -> None:
    """Mark op types that autodiff must not differentiate through."""
    module = _caller_module()
    for t in op_types:
        _check_new(t, module)
        THROWS.add(t)


_loaded = False


def load_all() -> None:
    """Import every rule module in `popxl_dist.transforms.grads`."""
    global _loaded
    if _loaded:
        return
    import importlib
    import pkgutil

    from . import grads

    for m in pkgutil.iter_modules(grads.__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"{grads.__name__}.{m.name}")
    _loaded = True
