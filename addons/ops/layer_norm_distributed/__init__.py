"""Layer norm over a hidden axis sharded across replicas (upstream custom op)."""
from .layer_norm_distributed import layer_norm_distributed

__all__ = ["layer_norm_distributed"]
