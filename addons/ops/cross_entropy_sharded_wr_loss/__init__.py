"""Cross entropy over class shards held by the IPUs of one replica (upstream custom op)."""
from .cross_entropy_sharded_wr_loss import cross_entropy_sharded_wr_loss

__all__ = ["cross_entropy_sharded_wr_loss"]
