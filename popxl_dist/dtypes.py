"""PopXL data types (`popxl.float32`, `popxl.int32`, ...) and their NumPy equivalents."""
from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, Dict, Optional

import numpy as np

__all__ = [
    "np_dtype_float8_143", "np_dtype_float8_152", "dtype", "bool", "int8", "int16", "int32",
    "int64", "uint8", "uint16", "uint32", "uint64",
    "half", "float8_143", "float8_152", "float16", "float", "float32", "double", "float64",
    "complex64", "complex128",
]


class dtype:
    """A PopXL data type. Instances are singletons: compare them with `==` or `is`."""

    _by_name: Dict[str, "dtype"] = {}
    _by_numpy: Dict[np.dtype, "dtype"] = {}

    def __init__(self, name: str, np_type: Optional[np.dtype], is_complex: builtins.bool,
                 is_int: builtins.bool, is_floating_point: builtins.bool,
                 is_signed: builtins.bool, torch_name: Optional[str]):
        self._name = name
        self._np = np_type
        self._is_complex = is_complex
        self._is_int = is_int
        self._is_floating_point = is_floating_point
        self._is_signed = is_signed
        self._torch_name = torch_name
        dtype._by_name[name] = self
        if np_type is not None and np_type.fields is None:
            dtype._by_numpy.setdefault(np_type, self)

    name = property(lambda self: self._name)
    # PopART's name of this type (upstream: the `_ir.DataType` value), e.g. "FLOAT16"
    _pb_dtype = property(lambda self: _PB_NAMES.get(self._name, self._name.upper()))
    is_complex = property(lambda self: self._is_complex)
    is_int = property(lambda self: self._is_int)
    is_floating_point = property(lambda self: self._is_floating_point)
    is_signed = property(lambda self: self._is_signed)

    def as_numpy(self) -> np.dtype:
        """The NumPy dtype of this type (float8 types are structured `u1` dtypes)."""
        if self._np is None:
            raise TypeError(f"popxl.dtypes.{self._name} has no NumPy equivalent")
        return self._np

    def as_torch(self):
        """The torch dtype of this type (needs torch)."""
        import torch  # optional dependency

        if self._torch_name is None:
            raise TypeError(f"popxl.dtypes.{self._name} has no torch equivalent")
        return getattr(torch, self._torch_name)

    @classmethod
    def from_name(cls, name: str) -> "dtype":
        try:
            return cls._by_name[name]
        except KeyError:
            raise ValueError(f"There is no popxl dtype named '{name}'") from None

    @classmethod
    def as_dtype(cls, type_value: Any) -> "dtype":
        """Convert a str, Python type, NumPy dtype/array, or torch dtype/tensor to a popxl dtype."""
        x = type_value
        if isinstance(x, dtype):
            return x
        if isinstance(x, str):
            return cls.from_name(_ALIASES.get(x, x))
        if x is builtins.bool:
            return bool
        if x is builtins.float:
            return float32
        if x is builtins.int:
            return int64
        if isinstance(x, np.ndarray):
            x = x.dtype
        if isinstance(x, np.dtype) or (isinstance(x, type) and issubclass(x, np.generic)):
            npd = np.dtype(x)
            if npd.fields is not None:
                for d in (float8_143, float8_152):
                    if d._np == npd:
                        return d
            try:
                return cls._by_numpy[npd]
            except KeyError:
                raise ValueError(f"There is no popxl dtype for NumPy dtype {npd}") from None
        torch_dtype = getattr(x, "dtype", x)
        mod = type(torch_dtype).__module__
        if mod.startswith("torch"):
            name = str(torch_dtype).replace("torch.", "")
            return cls.from_name(_ALIASES.get(name, name))
        raise ValueError(f"Cannot convert {x!r} to a popxl dtype")

    def __repr__(self) -> str:
        return f"popxl.dtypes.{self._name}"

    def __reduce__(self):
        return (dtype.from_name, (self._name,))

    def __hash__(self) -> int:
        return hash(self._name)

    def __eq__(self, other: object) -> builtins.bool:
        return self is other


_ALIASES = {"half": "float16", "float": "float32", "double": "float64"}
_PB_NAMES = {"float32": "FLOAT", "float64": "DOUBLE"}

bool = dtype("bool", np.dtype(np.bool_), False, False, False, False, "bool")
int8 = dtype("int8", np.dtype(np.int8), False, True, False, True, "int8")
int16 = dtype("int16", np.dtype(np.int16), False, True, False, True, "int16")
int32 = dtype("int32", np.dtype(np.int32), False, True, False, True, "int32")
int64 = dtype("int64", np.dtype(np.int64), False, True, False, True, "int64")
uint8 = dtype("uint8", np.dtype(np.uint8), False, True, False, False, "uint8")
uint16 = dtype("uint16", np.dtype(np.uint16), False, True, False, False, None)
uint32 = dtype("uint32", np.dtype(np.uint32), False, True, False, False, None)
uint64 = dtype("uint64", np.dtype(np.uint64), False, True, False, False, None)
# float8 NumPy dtypes (upstream's): structured dtypes with one `u1` field holding the code.
np_dtype_float8_143 = np.dtype([("float8_143", "u1")])
np_dtype_float8_152 = np.dtype([("float8_152", "u1")])
float8_143 = dtype("float8_143", np_dtype_float8_143, False, False, True, True, None)
float8_152 = dtype("float8_152", np_dtype_float8_152, False, False, True, True, None)
float16 = dtype("float16", np.dtype(np.float16), False, False, True, True, "float16")
float32 = dtype("float32", np.dtype(np.float32), False, False, True, True, "float32")
float64 = dtype("float64", np.dtype(np.float64), False, False, True, True, "float64")
complex64 = dtype("complex64", np.dtype(np.complex64), True, False, False, True, "complex64")
complex128 = dtype("complex128", np.dtype(np.complex128), True, False, False, True, "complex128")
half = float16
float = float32
double = float64

FLOAT8_DTYPES = (float8_143, float8_152)

# NumPy dtype -> popxl dtype (the float8 types are the structured `u1` dtypes)
_NP_TO_POPXL: Dict[np.dtype, dtype] = {**dtype._by_numpy, np_dtype_float8_143: float8_143,
                                       np_dtype_float8_152: float8_152}


class _TorchDtypes(Mapping):
    """torch dtype -> popxl dtype. Keys are looked up by name (`torch.float16`), so torch is
    imported only when this is iterated."""

    def __getitem__(self, key: Any) -> dtype:
        name = str(key).replace("torch.", "")
        d = dtype._by_name.get(_ALIASES.get(name, name))
        if d is None or d._torch_name is None:
            raise KeyError(key)
        return d

    def __iter__(self):
        import torch  # optional dependency

        return iter([getattr(torch, d._torch_name) for d in dtype._by_name.values()
                     if d._torch_name is not None])

    def __len__(self) -> int:
        return sum(d._torch_name is not None for d in dtype._by_name.values())


_PT_TO_POPXL = _TorchDtypes()


_UINT8 = np.dtype(np.uint8)


def storage_numpy(d: dtype) -> np.dtype:
    """The NumPy dtype arrays of `d` are held in by the engine: `as_numpy()`, except float8,
    whose values are held as their uint8 codes."""
    return _UINT8 if d in FLOAT8_DTYPES else d.as_numpy()


def host_view(arr: np.ndarray, d: dtype) -> np.ndarray:
    """`arr` (held in `storage_numpy(d)`) as the user sees it: float8 codes as an array of the
    structured float8 dtype (a view, as upstream's host arrays are), other dtypes unchanged."""
    return arr.view(d.as_numpy()) if d in FLOAT8_DTYPES else arr


def storage_view(arr: np.ndarray, d: dtype) -> np.ndarray:
    """The inverse of `host_view`: float8 data of `d`'s structured dtype as a uint8 view of its
    codes (arrays of other dtypes unchanged)."""
    return arr.view(_UINT8) if d in FLOAT8_DTYPES and arr.dtype == d.as_numpy() else arr
