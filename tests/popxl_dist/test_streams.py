"""Host streams: shapes that cannot exist are refused where the stream is made, naming it."""
import numpy as np
import pytest

import popxl
import popxl.ops as ops


@pytest.mark.parametrize("make", [popxl.h2d_stream, popxl.d2h_stream])
@pytest.mark.parametrize("shape,dtype,nbytes", [((2**62, 2), popxl.float32, 2**65),
                                                ((2**61, 2**2), popxl.float16, 2**64),
                                                ((2**31, 2**31, 2**2), popxl.uint8, 2**64)])
def test_a_stream_larger_than_int64_bytes_is_refused_when_made(make, shape, dtype, nbytes):
    kind = make.__name__
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(ValueError, match=rf"^{kind} 'big': shape \({shape[0]}, .* of "
                                             rf"{dtype.name} is {nbytes} bytes a transfer, more "
                                             rf"than a tensor can hold"):
            make(shape, dtype, "big")
        ok = make((2**61 - 1, 4), popxl.uint8, "ok")        # 2**63 - 4 bytes fit
    assert ok.shape == (2**61 - 1, 4)


def test_a_host_output_buffer_that_cannot_be_allocated_names_its_stream():
    """2 PiB, beyond any process's address space: NumPy's MemoryError gains the stream."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = ops.init((2**48, 2), popxl.float32, "x", "zero")
        y_s = popxl.d2h_stream(x.shape, x.dtype, "huge_out")
        ops.host_store(y_s, x)
    sess = popxl.Session(ir, "cpu")
    with pytest.raises(MemoryError, match=r"^Session: the host buffer of d2h_stream 'huge_out' "
                                          r"\(shape \(281474976710656, 2\), float32\) cannot be "
                                          r"allocated: "):
        sess.create_host_outputs()
