"""Softmax cross entropy over vocabulary-sharded logits (upstream custom op)."""
from .cross_entropy_sharded_loss import REDUCTION_TYPE, cross_entropy_sharded_loss

__all__ = ["cross_entropy_sharded_loss", "REDUCTION_TYPE"]
