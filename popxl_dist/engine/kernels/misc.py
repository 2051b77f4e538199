"""Kernels: the ops that pass a tensor through: Identity, Detach(Inplace), Cast, IpuCopy and
IoTileCopy (identities), PrintTensor."""
from __future__ import annotations

import numpy as np

from ._util import cast_into, np_dtype, without_out
from .registry import kernel

__all__ = ["format_tensor"]


def format_tensor(a: np.ndarray, fmt: dict) -> str:
    """`a` as text, NumPy-like, with upstream print_tensor's formatting options."""
    digits = int(fmt.get("digits", 8))
    ff = fmt.get("float_format", "auto")
    formatter = None
    if a.dtype.kind == "f":
        if ff == "fixed":
            formatter = {"float_kind": lambda x: f"{x:.{digits}f}"}
        elif ff == "scientific":
            formatter = {"float_kind": lambda x: f"{x:.{digits}e}"}
        elif ff == "none":
            formatter = {"float_kind": repr}
    s = np.array2string(np.asarray(a), max_line_width=int(fmt.get("max_line_width", 75)),
                        precision=digits, separator=fmt.get("separator", " "),
                        threshold=int(fmt.get("summarise_threshold", 1000)),
                        edgeitems=int(fmt.get("edge_items", 3)), formatter=formatter)
    ob, cb = fmt.get("open_bracket", "["), fmt.get("close_bracket", "]")
    if (ob, cb) != ("[", "]"):
        s = s.replace("[", "\0").replace("]", cb).replace("\0", ob)
    return s


def passthrough(attrs, ins, outs):
    """Factory of ops that are numerically the identity; the compiler copies if needed."""
    return _same


def _same(x):
    return x


kernel("Identity", view=True)(passthrough)


@kernel("Cast", writes_out=True)
def _cast(attrs, ins, outs):
    dt = np_dtype(outs[0])
    if dt.kind in "iu" and np_dtype(ins[0]).kind == "f":
        def float_to_int(x):
            # poplar casts truncate toward zero; NaN/inf saturate is undefined upstream
            with np.errstate(invalid="ignore"):
                return np.trunc(x).astype(dt)
        return without_out(float_to_int)
    return lambda x, out=None: cast_into(x, dt, out)


kernel("Detach", view=True)(passthrough)
kernel("DetachInplace", alias=True)(passthrough)


@kernel("PrintTensor", context=True)
def _print_tensor(attrs, ins, outs, env):
    """Records `<title>: <values>` for the host to print (to stderr, after the run: where
    Poplar's PrintTensor stream goes), whichever process runs the replica."""
    if not attrs.get("print_self", True):
        return lambda ctx, x: x.copy()
    title = attrs["title"]
    fmt = attrs.get("fmt", {})

    def run(ctx, x):
        ctx.prints.append(f"{title}: {format_tensor(x, fmt)}\n")
        return x.copy()
    return run


# Copies between IPUs or tile sets are numerically the identity.
kernel("IpuCopy", view=True)(passthrough)
kernel("IoTileCopy", view=True)(passthrough)

