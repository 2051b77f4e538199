"""popxl_addons optimizers."""
from .adam import AdamOptimizerStep

__all__ = ["AdamOptimizerStep"]
