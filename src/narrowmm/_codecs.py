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
    fp16/bf16, uint8 for the 8-bit formats.

    Tiny values underflow gradually through subnormals. Overflow gives +-Inf, except in
    e4m3fn, which has none: there it gives NaN (ml_dtypes' rule). ``saturate=True`` (the
    8-bit formats) clamps overflow, infinities included, to the largest finite value
    instead. A NaN stays a NaN keeping its sign (and, in the 16-bit formats, its top payload
    bits). An integer format rounds as GGUF does (no scale applied here): ``q8_0`` halves
    away from zero to -128..127; ``q4_0`` and ``q4_1`` to ``trunc(v + 8.5) - 8`` and
    ``trunc(v + 0.5)``, the sum in float32, within 16 codes, two a byte: their values' last
    axis is 2 (the low nibble first) and the bits drop it; ``q5_1`` to ``trunc(v + 0.5)``
    within 32 codes, one a byte. A NaN, or a value outside the
    codes without ``saturate``, raises ValueError. Any shape; the result has the same
    shape. docs/contracts.md lists each format's rules.
    """
    fmt = _codec_format(format)
    a = check_float32(values, "values")
    if not a.dtype.isnative:
        raise TypeError("values must have native byte order")
    if saturate and fmt.itemsize != 1:
        raise ValueError(f"saturate applies to the FP8 formats, not {fmt.name!r}")
    if fmt.kpack > 1 and (a.ndim == 0 or a.shape[-1] != fmt.kpack):
        raise ValueError(f"{fmt.name} holds {fmt.kpack} codes a byte: values need a last axis "
                         f"of {fmt.kpack}, got shape {a.shape}")
    if fmt.integer:
        _check_integer_range(a, fmt, saturate)
    flat = flat_aligned(a)
    _, kernel = resolve("encode", fmt)
    out = kernel.fn(flat, bool(saturate)) if fmt.itemsize == 1 else kernel.fn(flat)
    return out.reshape(a.shape[:-1] if fmt.kpack > 1 else a.shape)


def _check_integer_range(a: np.ndarray, fmt: Format, saturate: bool) -> None:
    """An integer format's codes cannot hold NaN, nor (unless saturating) values that round
    outside ``[min_code, max_finite]``: name the first such value."""
    with np.errstate(invalid="ignore", over="ignore"):
        if saturate:
            bad = np.isnan(a)
        elif fmt.code_bias:  # trunc(fl32(v + bias)) must be a code: the sum in (-1, 16)
            biased = a + np.float32(fmt.code_bias)
            bad = ~((biased > -1) & (biased < fmt.max_finite - fmt.min_code + 1))
        else:
            bad = ~((a > fmt.min_code - 0.5) & (a < fmt.max_finite + 0.5))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        value = float(a[where])
        limits = f"[{fmt.min_code:g}, {fmt.max_finite:g}]"
        why = "NaN has no code" if np.isnan(value) else f"outside the codes {limits}"
        hint = "" if saturate else " (saturate=True clamps to them)"
        raise ValueError(f"cannot encode values[{', '.join(map(str, where))}] = {value!r} "
                         f"as {fmt.name}: {why}{hint}")


def check_codes(bits: np.ndarray, fmt: Format, what: str = "bits") -> None:
    """A format whose codes use only some bits of a byte (``Format.code_bits``: Q5_1)
    refuses a byte past its largest code, naming where it is and its value."""
    if fmt.code_bits and bits.size:
        u = bits.view(np.uint8)
        bad = (u >> fmt.code_bits) != 0
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{what}[{', '.join(map(str, where))}] = {int(u[where])} is "
                             f"not a {fmt.name} code (0 to {(1 << fmt.code_bits) - 1})")


def decode(bits: np.ndarray, format: str | Format) -> np.ndarray:
    """Exact float32 values of bit patterns in ``format`` (uint16 for fp16/bf16, uint8 for
    e4m3fn/e5m2/q8_0/q4_0/q4_1/q5_1: the integer a code stands for, for the GGUF formats,
    and for the 4-bit ones a last axis of 2, the low nibble first); NaNs come back quiet.
    Scales are not applied here (see :meth:`Weights.decode`). A q5_1 byte past 31 is not a
    code: ValueError."""
    fmt = _codec_format(format)
    want = "uint16 (or int16/float16)" if fmt.itemsize == 2 else "uint8 (or int8)"
    if not isinstance(bits, np.ndarray):
        raise TypeError(f"bits must be a numpy.ndarray of {want}, got {type(bits).__name__}")
    if (bits.dtype.itemsize != fmt.itemsize or not bits.dtype.isnative
            or bits.dtype.kind not in ("uif" if fmt.itemsize == 2 else "uiV")):
        raise TypeError(f"{fmt.name} bits must be {want}, got {bits.dtype}")
    flat = flat_aligned(bits).view(fmt.storage)
    check_codes(bits, fmt)
    _, kernel = resolve("decode", fmt)
    return kernel.fn(flat).reshape(bits.shape + ((fmt.kpack,) if fmt.kpack > 1 else ()))
