"""The kernel registry: op type -> KernelSpec (a factory of bound NumPy callables plus aliasing facts).

A factory is called once per op at compile time with the op's attributes and the TensorInfos of its
inputs and outputs, and returns the callable the program runs:

* plain kernels:    ``factory(attrs, ins, outs) -> fn(*arrays) -> array | tuple``
* context kernels:  ``factory(attrs, ins, outs, env) -> fn(ctx, *arrays)`` (host I/O, remote memory)

In-place op types (``modifies``) write into those inputs' arrays and return input 0. ``view`` kernels
may return a NumPy view of input 0 (the compiler copies when aliasing would be observable);
``alias`` kernels return a view on purpose (upstream's reshape_/transpose_ family);
``external`` kernels return memory the program does not own (read-only host input data), which
the compiler copies if the program writes to it.

``writes_out`` kernels also accept a preallocated result: ``fn(*arrays, out=buffer)`` (a tuple of
arrays or None per output for several outputs) writes the result into ``buffer`` and returns it;
without ``out`` they return a fresh array. Their outputs never alias their inputs. The compiler's
memory plan (see ``engine/memory_plan.py``) hands them buffers it reuses across values and runs.
``inplace`` (with ``writes_out``): the output may be the very buffer of an input of the same shape
and dtype (True: any input; a tuple: those input indices), e.g. element-wise kernels.
Kernels without ``writes_out`` are called exactly as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Tuple, Union

__all__ = ["KernelSpec", "KERNELS", "kernel", "CONTROL_FLOW_TYPES", "CUSTOM_OP_ATTR", "spec_of"]


@dataclass(frozen=True)
class KernelSpec:
    op_type: str
    factory: Callable
    # input indices written in place, or `fn(attrs, n_inputs) -> indices` when it depends on
    # the op (e.g. the optimiser updaters' optional step input)
    modifies: Union[Tuple[int, ...], Callable] = ()
    view: bool = False
    alias: bool = False
    context: bool = False
    collective: bool = False
    external: bool = False
    returns_input: bool = True   # a modifying op's output 0 is its (modified) input 0
    writes_out: bool = False     # fn(*arrays, out=...) writes into preallocated outputs
    inplace: Union[bool, Tuple[int, ...]] = False   # out may be (these) inputs' own buffer
    settings: bool = False       # the factory also takes the CompileEnv (the Session's options)

    def modified_inputs(self, op) -> Tuple[int, ...]:
        m = self.modifies(op.attrs, len(op.inputs)) if callable(self.modifies) else self.modifies
        n = len(op.inputs)
        return tuple(i % n for i in m) if n else ()


KERNELS: Dict[str, KernelSpec] = {}

# Op types the compiler executes itself (they call other graphs).
CONTROL_FLOW_TYPES = frozenset({"Call", "Loop", "If"})

# The attribute that marks an op made by a registered custom op (`popxl.custom_ops`): its value
# (a `CustomOpRef`) finds the op's kernel and grad rule, whatever the op's type string says
# (two custom ops, or a custom op and a built-in one, may share a type name, as upstream ops of
# different domains do).
CUSTOM_OP_ATTR = "__custom_op__"


def spec_of(op) -> "KernelSpec | None":
    """The kernel of an IR op: its custom op's, else the one registered for its type."""
    custom = op.attrs.get(CUSTOM_OP_ATTR)
    if custom is not None:
        return custom.kernel_spec()
    return KERNELS.get(op.type)


def kernel(op_type: str, *, modifies: Union[Tuple[int, ...], Callable] = (), view: bool = False,
           alias: bool = False, context: bool = False, collective: bool = False,
           external: bool = False, returns_input: bool = True, writes_out: bool = False,
           inplace: Union[bool, Tuple[int, ...]] = False, settings: bool = False):
    """Register the decorated factory as the kernel of `op_type` (duplicates are refused)."""
    if inplace and not writes_out:
        raise ValueError(f"kernel '{op_type}': inplace=True needs writes_out=True")

    def deco(factory: Callable) -> Callable:
        if op_type in KERNELS:
            raise ValueError(f"kernel for op type '{op_type}' is already registered")
        KERNELS[op_type] = KernelSpec(op_type, factory,
                                      modifies if callable(modifies) else tuple(modifies), view,
                                      alias, context, collective, external, returns_input,
                                      writes_out, inplace, settings)
        return factory

    return deco
