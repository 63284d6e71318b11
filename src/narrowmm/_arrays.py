"""Checks and views of the arrays the public operations take, shared by the API modules."""

from __future__ import annotations

import numpy as np

from ._interop import from_dlpack

F32 = np.dtype(np.float32)


def check_float32(a: object, what: str) -> np.ndarray:
    """``a`` as a float32 NumPy array (a DLPack producer imported without a copy, except
    for ``out``), or a TypeError that names ``what`` and says how to convert it."""
    if not isinstance(a, np.ndarray):
        if what != "out" and hasattr(a, "__dlpack__"):
            a = from_dlpack(a, what)  # e.g. a PyTorch float32 tensor, zero-copy
        else:
            raise TypeError(
                f"{what} must be a numpy.ndarray of float32, got {type(a).__name__}")
    if a.dtype != F32:
        if a.dtype.kind == "f" and a.dtype.itemsize == 4 and not a.dtype.isnative:
            raise TypeError(f"{what} is float32 of non-native byte order ({a.dtype.str}); "
                            f"use {what}.astype(numpy.float32)")
        raise TypeError(f"{what} must be float32, got {a.dtype}; convert with "
                        f"{what}.astype(numpy.float32)")
    return a


def flat_aligned(a: np.ndarray) -> np.ndarray:
    """A contiguous, aligned 1-D view of ``a``, copying only when it is neither (a view
    at an odd offset of a memory-mapped file, say)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    return flat if flat.flags.aligned else flat.copy()


# The kernels' vector loads are as wide as a cache line (avx512: 64 bytes); a grid or a
# packed matrix that starts off a line splits some of them over two lines, which cold cost
# Q6_K-shaped weights (float32 scales every 16 rows) much of their batch-1 speed
# (docs/kernels.md, "Pairs of rows").
CACHE_LINE = 64


def array_bytes(shape: int | tuple[int, ...],
                dtype: object) -> tuple[tuple[int, ...], np.dtype, int]:
    """``shape`` as a tuple, ``dtype`` as a NumPy dtype, and the bytes of such an array.

    Raises:
        ValueError: a negative dimension.
    """
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimensions are not allowed: {dims}")
    return dims, dt, int(np.prod(dims, dtype=np.int64)) * dt.itemsize


def aligned_empty(shape: int | tuple[int, ...], dtype: object,
                  alignment: int = CACHE_LINE) -> np.ndarray:
    """An uninitialised C-contiguous array whose first element (an empty one has none)
    starts on an ``alignment``-byte boundary (a power of two), like ``numpy.empty``: NumPy
    itself only promises the element size."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    dims, dt, nbytes = array_bytes(shape, dtype)
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes].view(dt).reshape(dims)


def line_aligned(a: np.ndarray) -> np.ndarray:
    """``a`` when it is C-contiguous and starts on a cache line (CACHE_LINE), else a copy
    that does."""
    if a.flags.c_contiguous and (a.size == 0 or a.ctypes.data % CACHE_LINE == 0):
        return a
    out = aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out
