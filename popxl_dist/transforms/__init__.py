"""`popxl.transforms`: autodiff and the exchange-merging contexts."""
from .autodiff import ExpectedConnection, ExpectedConnectionType, GradGraphInfo, autodiff
from .decompose_sum import decompose_sum
from .merge_exchange import io_tile_exchange, merge_exchange

__all__ = ["autodiff", "GradGraphInfo", "ExpectedConnection", "ExpectedConnectionType",
           "merge_exchange", "io_tile_exchange", "decompose_sum"]
