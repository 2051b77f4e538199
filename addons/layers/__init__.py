"""popxl_addons layers."""
from .conv import Conv2D
from .embedding import Embedding
from .layer_norm import GroupNorm, LayerNorm
from .linear import Linear

__all__ = ["Embedding", "LayerNorm", "GroupNorm", "Linear", "Conv2D"]
