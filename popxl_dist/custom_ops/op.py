"""`CustomOp`: an op defined in Python (shape inference, NumPy kernel, gradient), and the
`CustomOpRef` that marks its ops in the IR.

A subclass plays the part of upstream's C++ op pair: `setup` is `Op::setup` (output shapes and
dtypes from the inputs'), `compute` is the Opx's `grow` (here NumPy), `grad` is `getGradOps`
(here the gradient built from popxl ops, often another CustomOp). Instances hold the op's
attributes: one instance per op, made when the op is built, compiled and differentiated.
"""
from __future__ import annotations

import importlib
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..engine.kernels.registry import CUSTOM_OP_ATTR
from ..tensor import Tensor, TensorSpec

__all__ = ["CustomOp", "CustomOpRef", "GradInputs"]

_RESERVED_ATTR_PREFIX = "__"


class GradInputs:
    """What `CustomOp.grad` reads of the forward op: its inputs and outputs, as tensors of the
    gradient graph (forward tensors the gradient needs become inputs of that graph, as upstream's
    grad ops name them in `gradInputInfo`)."""

    def __init__(self, ctx) -> None:
        self._ctx = ctx

    def input(self, index: int) -> Tensor:
        """Forward input `index`."""
        return self._ctx.fwd_in(index)

    def output(self, index: int) -> Tensor:
        """Forward output `index`."""
        return self._ctx.fwd_out(index)

    def requires_grad(self, index: int) -> bool:
        """Whether forward input `index` needs a gradient (others may return None)."""
        return self._ctx.needs(index)

    @property
    def num_inputs(self) -> int:
        return self._ctx.num_inputs


class CustomOp:
    """Base class of a custom op for the emulator. Subclass it, then build ops with
    `MyOp.create(...)` or bind it to a C++ binding with `popxl.custom_ops.register`.

    Class attributes:
        op_type: the op's type, as its C++ `OperatorIdentifier` names it (`op.opType()`).
        domain, version: the rest of the identifier (default "custom.ops", 1).
        attributes: the names of the op's attributes, in the order a binding's
            `createOpInGraph(graph, inputs, outputs, *attributes, settings)` takes them.
        num_outputs: how many outputs `setup` returns (default 1).

    Methods to define:
        setup(self, *inputs: TensorSpec) -> TensorSpec or a sequence of them: check the inputs
            (raise ValueError/TypeError naming what is wrong) and give the outputs' shapes and
            dtypes. Runs when the op is built.
        compute(self, *inputs: np.ndarray) -> np.ndarray or a tuple: the NumPy kernel. Inputs
            are read-only; results are cast to the dtypes `setup` gave (their shapes must match).
        grad(self, grad_outputs, fwd: GradInputs) -> one entry per input: the gradient of
            each input (a popxl Tensor built with popxl ops or other custom ops) or None.
            `grad_outputs[i]` is the gradient of output i (None when none reaches it). Without
            `grad`, autodiff through the op raises.

    Attributes are instance attributes (`self.rotary_dim`) and `self.attrs`.

    Ops are out of place: `compute` returns new arrays and never writes its inputs. A class
    whose ops run on worker processes (single-controller `mpi` / `ray` backends) must be
    importable there: define it in a module, not in the script run as `__main__`.
    """

    op_type: ClassVar[str] = ""
    domain: ClassVar[str] = "custom.ops"
    version: ClassVar[int] = 1
    attributes: ClassVar[Tuple[str, ...]] = ()
    num_outputs: ClassVar[int] = 1

    def __init__(self, **attrs: Any) -> None:
        cls = type(self)
        missing = [a for a in cls.attributes if a not in attrs]
        extra = [a for a in attrs if a not in cls.attributes]
        if missing or extra:
            what = "; ".join(s for s in (
                f"missing {missing}" if missing else "",
                f"unknown {extra}" if extra else "") if s)
            raise TypeError(f"custom op {cls._describe()}: attributes are {list(cls.attributes)}"
                            f" ({what})")
        self.attrs: Dict[str, Any] = dict(attrs)
        for name, value in attrs.items():
            setattr(self, name, value)

    # --- to define ---------------------------------------------------------------------------
    def setup(self, *inputs: TensorSpec) -> Union[TensorSpec, Sequence[TensorSpec]]:
        raise NotImplementedError(f"custom op {type(self)._describe()} defines no setup()")

    def compute(self, *inputs: np.ndarray) -> Union[np.ndarray, Tuple[np.ndarray, ...]]:
        raise NotImplementedError(f"custom op {type(self)._describe()} defines no compute()")

    def grad(self, grad_outputs: Sequence[Optional[Tensor]],
             fwd: GradInputs) -> Sequence[Optional[Tensor]]:
        raise NotImplementedError(f"custom op {type(self)._describe()} defines no grad()")

    # --- building ----------------------------------------------------------------------------
    @classmethod
    def create(cls, *inputs: Tensor, name: Optional[str] = None,
               **attrs: Any) -> Union[Tensor, Tuple[Tensor, ...]]:
        """Build one op of this type in the current graph: its output Tensor (a tuple when
        `num_outputs` is not 1)."""
        from ..context import get_current_context

        ctx = get_current_context()
        outs = cls._append(ctx.graph, list(inputs), attrs, name or f"{cls.op_type}Op")
        return outs[0] if cls.num_outputs == 1 else tuple(outs)

    @classmethod
    def _append(cls, graph, inputs: List[Tensor], attrs: Dict[str, Any], settings_name: str,
                out_ids: Optional[Sequence[str]] = None, notify: bool = True) -> List[Tensor]:
        """Check, infer and append one op to `graph` (the shared path of `create` and the
        bindings' `createOpInGraph`)."""
        from ..ops._builder import Out, add_op, check_tensor

        cls._check_class()
        opname = cls._describe()
        for i, t in enumerate(inputs):
            check_tensor(t, opname, f"input {i}")
        impl = cls(**attrs)
        specs = [TensorSpec(t.shape, t.dtype, t.meta_shape) for t in inputs]
        outs = impl.setup(*specs)
        outs = [outs] if isinstance(outs, (TensorSpec, Tensor)) else list(outs)
        if len(outs) != cls.num_outputs:
            raise ValueError(f"custom op {opname}: setup() returned {len(outs)} outputs, "
                             f"num_outputs is {cls.num_outputs}")
        outputs = []
        for i, o in enumerate(outs):
            if not isinstance(o, (TensorSpec, Tensor)):
                raise TypeError(f"custom op {opname}: setup() must return TensorSpecs, got "
                                f"{type(o).__name__} for output {i}")
            outputs.append(Out(f"{cls.op_type}_out{i}" if len(outs) > 1 else cls.op_type,
                               tuple(o.shape), o.dtype, tuple(o.meta_shape or ())))
        op_attrs = dict(attrs)
        op_attrs[CUSTOM_OP_ATTR] = CustomOpRef.of(cls)
        return add_op(cls.op_type, settings_name, inputs, outputs, op_attrs, graph=graph,
                      out_ids=out_ids, notify=notify)

    # --- checks and names --------------------------------------------------------------------
    @classmethod
    def _describe(cls) -> str:
        return f"'{cls.op_type or '?'}' ({cls.__module__}.{cls.__qualname__})"

    @classmethod
    def _check_class(cls) -> None:
        if cls.__dict__.get("_checked_class"):
            return
        if not isinstance(cls.op_type, str) or not cls.op_type.isidentifier():
            raise TypeError(f"custom op class {cls.__module__}.{cls.__qualname__}: op_type must "
                            f"be a name such as 'LeakyScale', got {cls.op_type!r}")
        if not isinstance(cls.domain, str) or not isinstance(cls.version, int):
            raise TypeError(f"custom op {cls._describe()}: domain must be a str and version an "
                            f"int, got {cls.domain!r} and {cls.version!r}")
        names = cls.attributes
        if isinstance(names, str) or not all(isinstance(a, str) and a.isidentifier()
                                             and not a.startswith(_RESERVED_ATTR_PREFIX)
                                             for a in names):
            raise TypeError(f"custom op {cls._describe()}: attributes must be a tuple of "
                            f"names (not starting with '__'), got {names!r}")
        if not isinstance(cls.num_outputs, int) or cls.num_outputs < 1:
            raise TypeError(f"custom op {cls._describe()}: num_outputs must be a positive int, "
                            f"got {cls.num_outputs!r}")
        from ..engine.kernels import load_all
        from ..engine.kernels.registry import CONTROL_FLOW_TYPES, KERNELS

        load_all()
        builtin = KERNELS.get(cls.op_type)
        if cls.op_type in CONTROL_FLOW_TYPES or (builtin is not None and (
                builtin.context or builtin.collective or builtin.modifies or builtin.view
                or builtin.alias or builtin.external)):
            raise ValueError(f"custom op {cls._describe()}: op_type '{cls.op_type}' is a "
                             f"built-in op the emulator treats specially (control flow, host "
                             f"or remote I/O, collectives, in-place or views): choose another "
                             f"name")
        cls._checked_class = True

    # --- what the engine and autodiff use ----------------------------------------------------
    @classmethod
    def _kernel_factory(cls, attrs, ins, outs):
        """The kernel registry's factory: one instance per compiled op; its `compute` wrapped to
        give read-only inputs and results of the declared shapes and dtypes."""
        from ..engine.kernels._util import np_dtype

        impl = cls(**{k: v for k, v in attrs.items() if not k.startswith(_RESERVED_ATTR_PREFIX)})
        compute = impl.compute
        want = [(tuple(o.shape), np_dtype(o)) for o in outs]
        single = len(want) == 1
        where = cls._describe()

        def run(*arrays):
            views = []
            for a in arrays:
                v = a.view()
                v.flags.writeable = False
                views.append(v)
            res = compute(*views)
            res = (res,) if single and not isinstance(res, (tuple, list)) else tuple(res)
            if len(res) != len(want):
                raise ValueError(f"custom op {where}: compute() returned {len(res)} arrays, "
                                 f"setup() declared {len(want)}")
            out = []
            for i, (r, (shape, dt)) in enumerate(zip(res, want)):
                r = np.asarray(r)
                if r.shape != shape:
                    raise ValueError(f"custom op {where}: compute() output {i} has shape "
                                     f"{r.shape}, setup() declared {shape}")
                if r.dtype != dt or any(np.may_share_memory(r, a) for a in arrays):
                    r = r.astype(dt)      # a new array: never an alias of an input
                out.append(r)
            return out[0] if single else tuple(out)
        return run

    @classmethod
    def _grad_rule(cls):
        """The grad rule autodiff calls: `rule(ctx, dys) -> one gradient per input`."""
        if cls.grad is CustomOp.grad:
            def no_grad(ctx, dys):
                from ..errors import popart_exception

                raise popart_exception(
                    f"autodiff: custom op {cls._describe()} ({ctx.op.describe()}) defines no "
                    f"grad(), so it cannot be differentiated through")
            return no_grad

        def rule(ctx, dys):
            attrs = {k: v for k, v in ctx.attrs.items()
                     if not k.startswith(_RESERVED_ATTR_PREFIX)}
            dxs = list(cls(**attrs).grad(list(dys), GradInputs(ctx)))
            if len(dxs) != len(ctx.op.inputs):
                raise ValueError(f"custom op {cls._describe()}: grad() returned {len(dxs)} "
                                 f"gradients for {len(ctx.op.inputs)} inputs")
            for i, dx in enumerate(dxs):
                if dx is None:
                    continue
                info = ctx.in_info(i)
                if not isinstance(dx, Tensor) or dx.shape != tuple(info.shape) \
                        or dx.dtype != info.dtype:
                    got = (f"{dx.shape} {dx.dtype.name}" if isinstance(dx, Tensor)
                           else type(dx).__name__)
                    raise ValueError(f"custom op {cls._describe()}: grad() entry {i} must be "
                                     f"a Tensor {tuple(info.shape)} {info.dtype.name} (the "
                                     f"gradient of input '{info.id}'), got {got}")
            return dxs
        return rule


@dataclass(frozen=True)
class CustomOpRef:
    """Plain data naming a CustomOp class (an IR attribute that pickles to worker processes):
    `module.qualname`, the folder to import the module from, and the op identifier for views."""

    module: str
    qualname: str
    root: Optional[str]
    op_type: str
    domain: str
    version: int

    @classmethod
    def of(cls, op_cls: type) -> "CustomOpRef":
        ref = op_cls.__dict__.get("_popxl_ref")
        if ref is None:
            ref = cls(op_cls.__module__, op_cls.__qualname__, _import_root(op_cls),
                      op_cls.op_type, op_cls.domain, op_cls.version)
            _RESOLVED[(ref.module, ref.qualname)] = op_cls
            op_cls._popxl_ref = ref
        return ref

    def resolve(self) -> type:
        key = (self.module, self.qualname)
        op_cls = _RESOLVED.get(key)
        if op_cls is None:
            with _LOCK:
                op_cls = _RESOLVED.get(key) or self._import()
                _RESOLVED[key] = op_cls
        return op_cls

    def _import(self) -> type:
        where = f"{self.module}.{self.qualname}"
        if self.module == "__main__" and self.module in sys.modules:
            obj = _lookup(sys.modules["__main__"], self.qualname)
            if obj is None:
                raise RuntimeError(
                    f"custom op '{self.op_type}': its class {where} is defined in the script run "
                    f"as __main__, which this worker process does not run. Define custom ops in "
                    f"an importable module (the script imports it) so that worker processes "
                    f"can import them too")
            return obj
        try:
            module = importlib.import_module(self.module)
        except ImportError:
            if not self.root or self.root in sys.path:
                raise
            sys.path.append(self.root)
            module = importlib.import_module(self.module)
        obj = _lookup(module, self.qualname)
        if obj is None:
            raise RuntimeError(f"custom op '{self.op_type}': module {self.module} has no class "
                               f"{self.qualname}")
        return obj

    # used through `op.attrs[CUSTOM_OP_ATTR]` by the kernel registry and autodiff
    def kernel_spec(self):
        op_cls = self.resolve()
        spec = op_cls.__dict__.get("_popxl_kernel_spec")
        if spec is None:
            from ..engine.kernels.registry import KernelSpec

            spec = KernelSpec(self.op_type, op_cls._kernel_factory)
            op_cls._popxl_kernel_spec = spec
        return spec

    def grad_rule(self, op=None):
        return self.resolve()._grad_rule()


_RESOLVED: Dict[Tuple[str, str], type] = {}
_LOCK = threading.Lock()


def _lookup(module, qualname: str):
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _import_root(op_cls: type) -> Optional[str]:
    """The sys.path folder the class's module is imported from (for worker processes)."""
    module = sys.modules.get(op_cls.__module__)
    path = getattr(module, "__file__", None)
    if not path or op_cls.__module__ == "__main__":
        return None
    root = os.path.dirname(os.path.abspath(path))
    depth = op_cls.__module__.count(".") + (os.path.basename(path).startswith("__init__."))
    for _ in range(depth):
        root = os.path.dirname(root)
    return root
