"""Type aliases used in popxl signatures."""
from typing import Callable, Union

from .tensor import HostTensor, Tensor, TensorLike

__all__ = ["HostTensor", "TensorLike", "GraphFunction"]

GraphFunction = Callable[..., Union[None, Tensor]]
