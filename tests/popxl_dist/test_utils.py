"""`popxl.utils.to_numpy`: upstream's copy rules (a copy unless copy=False; a downcast is always
a new array), C order, and torch tensors (whose `.numpy()` shares the tensor's memory)."""
import numpy as np
import pytest

from popxl.utils import downcast_np_dtypes, to_numpy


class FakeTorchTensor:
    """Stands for a CPU torch tensor: `.detach().cpu().numpy()` shares its storage."""
    __module__ = "torch"

    def __init__(self, storage: np.ndarray):
        self.storage = storage

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.storage


DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_]


@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("src", ["np", "torch"])
def test_copy_unless_asked_not_to_and_no_conversion_is_needed(src, dtype, copy):
    storage = np.ones((2, 2), dtype)
    x = storage if src == "np" else FakeTorchTensor(storage)
    out = to_numpy(x, copy=copy)
    should_alias = not copy and np.dtype(dtype) not in downcast_np_dtypes
    assert np.shares_memory(out, storage) == should_alias
    want = downcast_np_dtypes.get(np.dtype(dtype), np.dtype(dtype))
    assert out.dtype == want
    np.testing.assert_array_equal(out, storage.astype(want))


def test_the_result_is_c_ordered():
    f = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    for copy in (True, False):
        out = to_numpy(f, copy=copy)
        assert out.flags.c_contiguous and not np.shares_memory(out, f)
        np.testing.assert_array_equal(out, f)
    c = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert to_numpy(c, copy=False) is c or np.shares_memory(to_numpy(c, copy=False), c)
