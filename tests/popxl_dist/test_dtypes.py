"""popxl.dtypes: conversions from Python types as upstream maps them."""
import builtins

import pytest

import popxl


@pytest.mark.parametrize("py_type,want", [(builtins.bool, popxl.bool),
                                          (builtins.float, popxl.float32),
                                          (builtins.int, popxl.int64)])
def test_python_types_convert_as_upstream(py_type, want):
    assert popxl.dtype.as_dtype(py_type) == want
