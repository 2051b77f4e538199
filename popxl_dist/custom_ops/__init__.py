"""Custom ops for the emulator (a popxl-dist extension; upstream writes them in C++).

Upstream users add an op as a PopART op in C++ plus a pybind11 binding compiled by `cppimport`,
and a Python wrapper that calls `<binding>.<OpClass>.createOpInGraph(...)`. Here the op is a
`CustomOp` subclass (shape inference, NumPy kernel, gradient, in Python) and `register` binds it
to the binding's module and class names, so the wrapper runs unchanged: `import
cppimport.import_hook` and `from . import my_op_binding` give a module whose `MyOp` builds the
registered op (the real cppimport package is not needed; if it is installed nothing is
compiled). A binding nobody registered fails to import with `UnknownBindingError`, naming it and
saying how to register it. Graphcore's applications' own bindings are registered already
(`popxl.custom_ops.known`).

Example (`my_ops.py`, imported by the program, or named in POPXL_CUSTOM_OPS)::

    import numpy as np
    import popxl
    import popxl.ops as ops
    from popxl.custom_ops import CustomOp, register

    @register(binding="leaky_binding")                 # class name: op_type + "Op"
    class Leaky(CustomOp):
        op_type = "Leaky"
        domain = "my.ops"
        attributes = ("alpha",)                         # createOpInGraph's attribute order

        def setup(self, x):                             # output shape and dtype
            return x

        def compute(self, x):                           # NumPy kernel
            return np.where(x > 0, x, self.alpha * x)

        def grad(self, grad_outputs, fwd):              # one entry per input
            x, dy = fwd.input(0), grad_outputs[0]
            positive = ops.greater(x, popxl.constant(0.0, x.dtype))
            return [ops.where(positive, dy, dy * self.alpha)]

Ops can also be built directly: `y = Leaky.create(x, alpha=0.1)`.
"""
from .bindings import (BindingModule, UnknownBindingError, register, registrations,
                       sources_digest)
from .op import CustomOp, GradInputs

__all__ = ["CustomOp", "GradInputs", "register", "sources_digest", "registrations",
           "UnknownBindingError", "BindingModule"]
