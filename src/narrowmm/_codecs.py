"""The public codecs, encode and decode: validation, then the kernel that serves the format."""

from __future__ import annotations

import numpy as np

from ._arrays import check_float32, flat_aligned
from ._formats import Format, get_format
from .providers import resolve


def _codec_format(format: str | Format) -> Format:
    fmt = get_format(format)
    if not fmt.has_codec:
        raise ValueError(f"format {fmt.name!r} is stored as is and has no codec")
    return fmt


def encode(values: np.ndarray, format: str | Format, *, saturate: bool = False) -> np.ndarray:
    """Round float32 ``values`` to ``format`` (nearest even) and return the bits: uint16 for
    fp16/bf16, uint8 for e4m3fn/e5m2.

    Tiny values underflow gradually through subnormals. Overflow gives +-Inf, except in
    e4m3fn, which has none: there it gives NaN (ml_dtypes' rule). ``saturate=True`` (FP8
    only) clamps overflow, infinities included, to the largest finite value instead. A NaN
    stays a NaN keeping its sign (and, in the 16-bit formats, its top payload bits). Any
    shape; the result has the same shape. docs/contracts.md lists each format's rules.
    """
    fmt = _codec_format(format)
    a = check_float32(values, "values")
    if not a.dtype.isnative:
        raise TypeError("values must have native byte order")
    if saturate and fmt.itemsize != 1:
        raise ValueError(f"saturate applies to the FP8 formats, not {fmt.name!r}")
    flat = flat_aligned(a)
    _, kernel = resolve("encode", fmt)
    out = kernel.fn(flat, bool(saturate)) if fmt.itemsize == 1 else kernel.fn(flat)
    return out.reshape(a.shape)


def decode(bits: np.ndarray, format: str | Format) -> np.ndarray:
    """Exact float32 values of bit patterns in ``format`` (uint16 for fp16/bf16, uint8 for
    e4m3fn/e5m2); NaNs come back quiet. Scales are not applied here (see
    :meth:`Weights.decode`)."""
    fmt = _codec_format(format)
    want = "uint16 (or int16/float16)" if fmt.itemsize == 2 else "uint8 (or int8)"
    if not isinstance(bits, np.ndarray):
        raise TypeError(f"bits must be a numpy.ndarray of {want}, got {type(bits).__name__}")
    if (bits.dtype.itemsize != fmt.itemsize or not bits.dtype.isnative
            or bits.dtype.kind not in ("uif" if fmt.itemsize == 2 else "uiV")):
        raise TypeError(f"{fmt.name} bits must be {want}, got {bits.dtype}")
    flat = flat_aligned(bits).view(fmt.storage)
    _, kernel = resolve("decode", fmt)
    return kernel.fn(flat).reshape(bits.shape)
