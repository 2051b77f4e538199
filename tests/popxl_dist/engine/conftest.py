"""Fixtures of the engine tests."""
import pytest

from popxl.engine.kernels import _util


@pytest.fixture(params=["compiled", "numpy"])
def loops(request):
    """The kernels' compiled loops (numba, the `fast` extra), then NumPy's passes
    (`POPXL_NUMBA=0`)."""
    if request.param == "compiled":
        pytest.importorskip("numba")
        _util.use_compiled_converters(None)
    else:
        _util.use_compiled_converters(False)
    yield request.param
    _util.use_compiled_converters(None)
