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
