"""`popxl.testing`: helpers for tests of popxl programs (the dtype lists)."""
from ._dtypes import *  # noqa: F401,F403 - upstream's layout
from ._dtypes import __all__  # noqa: F401
