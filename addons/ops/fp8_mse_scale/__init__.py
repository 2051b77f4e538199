"""`fp8_mse_scale` (upstream: a C++ custom op; here popxl ops)."""
from .fp8_mse_scale import *  # noqa: F401,F403
from .fp8_mse_scale import __all__  # noqa: F401
