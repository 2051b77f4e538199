"""popxl_addons ops. As upstream, the custom ops (`replicated_all_reduce_TP`,
`cross_entropy_sharded_loss`, `layer_norm_distributed`, `rotary_pos_embed`, ...) are sub-packages
imported explicitly, e.g. `from popxl_addons.ops.rotary_pos_embed import rotary_pos_embed`."""
from .cross_entropy import cross_entropy, cross_entropy_with_grad
from .fp8_amax_scale import fp8_amax_scale
from .streams import host_load, host_store

__all__ = ["cross_entropy", "cross_entropy_with_grad", "host_load", "host_store",
           "fp8_amax_scale"]
