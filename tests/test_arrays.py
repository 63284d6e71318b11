"""The array helpers the API and the layouts share (narrowmm._arrays)."""

import numpy as np
import pytest

from narrowmm._arrays import CACHE_LINE, aligned_empty, line_aligned


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float16, np.float32, np.int64])
@pytest.mark.parametrize("shape", [0, 1, 7, (3, 5), (2, 0, 4), (4, 3, 128)])
def test_aligned_empty_starts_on_the_boundary(shape, dtype):
    for alignment in (8, CACHE_LINE, 256, 4096):
        a = aligned_empty(shape, dtype, alignment)
        dims = (shape,) if isinstance(shape, int) else shape
        assert a.shape == dims and a.dtype == np.dtype(dtype) and a.flags.c_contiguous
        assert a.flags.writeable and (a.size == 0 or a.ctypes.data % alignment == 0)
        a[...] = 3  # every element is inside the buffer
        assert (a == 3).all()


def test_aligned_empty_refuses_an_alignment_that_is_not_a_power_of_two():
    for alignment in (0, -64, 48, 100):
        with pytest.raises(ValueError, match=f"power of two, got {alignment}"):
            aligned_empty(4, np.float32, alignment)


def test_line_aligned_copies_only_what_starts_off_a_line():
    empty = np.empty((0, 3), np.float32)  # no element to align: itself
    assert line_aligned(empty) is empty
    a = aligned_empty((6, 10), np.float32)
    a[...] = np.arange(60, dtype=np.float32).reshape(6, 10)
    assert line_aligned(a) is a
    buf = aligned_empty(80, np.float32)
    for start in (1, 4, 15):  # 4, 16 and 60 bytes past a line
        off = buf[start:start + 60].reshape(6, 10)
        off[...] = a
        got = line_aligned(off)
        assert got is not off and got.ctypes.data % CACHE_LINE == 0
        assert np.array_equal(got, a) and got.flags.c_contiguous
    strided = aligned_empty((6, 20), np.float32)[:, ::2]  # aligned but not contiguous
    strided[...] = a
    got = line_aligned(strided)
    assert got.flags.c_contiguous and np.array_equal(got, a)
