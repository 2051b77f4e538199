"""Type aliases used in popxl signatures, and `NewAliasAnnotation` (how `TensorByRef` is made)."""
from typing import Any, Callable, TypeVar, Union

from .tensor import HostTensor, Tensor, TensorLike

__all__ = ["HostTensor", "TensorLike", "GraphFunction", "NewAliasAnnotation", "T"]

T = TypeVar("T")
GraphFunction = Callable[..., Union[None, Tensor]]


def NewAliasAnnotation(name: str, tp: Any):  # noqa: N802 - upstream's name
    """An annotation-only alias of `tp` (like `typing.NewType`), e.g. `TensorByRef`: usable in
    annotations, it cannot be called."""

    def new_type(*args: Any, **kwargs: Any):
        raise NotImplementedError(f"{name} is an annotation only; it cannot be instantiated")

    new_type.__name__ = name
    new_type.__qualname__ = name
    new_type.__supertype__ = tp
    return new_type
