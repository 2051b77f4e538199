"""popxl_addons layers."""
from popxl.ops.conv import PadType
from popxl.replica_grouping import ReplicaGrouping
from popxl.utils import to_numpy

from ..named_tensors import NamedTensors
from ..utils import WeightsDict
from .conv import Conv2D
from .embedding import MULTISLICE_MAGIC_NUMBER, Embedding
from .group_norm import GroupNorm
from .layer_norm import LayerNorm
from .linear import Linear

__all__ = ["Embedding", "LayerNorm", "GroupNorm", "Linear", "Conv2D", "MULTISLICE_MAGIC_NUMBER",
           "NamedTensors", "PadType", "ReplicaGrouping", "WeightsDict", "to_numpy"]
