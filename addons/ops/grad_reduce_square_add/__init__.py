"""Sum of squared (loss-scaled) gradients, for global-norm clipping (upstream custom op)."""
from .grad_reduce_square_add import grad_reduce_square_add

__all__ = ["grad_reduce_square_add"]
