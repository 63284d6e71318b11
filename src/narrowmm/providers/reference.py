"""The reference provider: pure Python, one element at a time, exact by construction.

It is the tests' oracle, so it shares no code or trick with the fast paths: codecs work on
integer fields, and every fused multiply-add is done in exact rational arithmetic
(:class:`fractions.Fraction`) and rounded once. It is slow (microseconds per element) and
meant for small problems.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction
from typing import ClassVar

import numpy as np

from .._formats import Format
from ._base import Kernel, Provider, row_major_operands

_INF32 = 0x7F800000


def f32_from_bits(u: int) -> float:
    """The float32 with bit pattern ``u``, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0]


def bits_from_f32(x: float) -> int:
    """Bit pattern of the float32 ``x`` (which must be exactly representable, or NaN)."""
    if math.isnan(x):
        return 0x7FC00000 | (0x80000000 if math.copysign(1.0, x) < 0 else 0)
    if math.isinf(x):
        return _INF32 | (0x80000000 if x < 0 else 0)
    return struct.unpack("<I", struct.pack("<f", x))[0]


def round_binary(q: Fraction, mant_bits: int, exp_bits: int) -> int:
    """Bits (sign excluded) of the non-negative rational ``q`` rounded to nearest even in the
    binary format with ``mant_bits`` stored mantissa bits and ``exp_bits`` exponent bits,
    with gradual underflow and overflow to infinity."""
    if q == 0:
        return 0
    bias = (1 << (exp_bits - 1)) - 1
    emin = 1 - bias
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1  # now 2**e <= q < 2**(e+1)
    e = max(e, emin)
    n = round(q / Fraction(2) ** (e - mant_bits))  # Fraction rounds half to even
    if n >= 1 << (mant_bits + 1):  # rounded up into the next binade
        e += 1
        n >>= 1
    if n < 1 << mant_bits:  # subnormal (e == emin)
        return n
    if e > bias:
        return ((1 << exp_bits) - 1) << mant_bits
    return ((e + bias) << mant_bits) | (n - (1 << mant_bits))


# ---- codecs: integer fields in, integer fields out ------------------------------------

def fp16_to_f32_bits(h: int) -> int:
    sign = (h >> 15) & 1
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        mag = _INF32 if m == 0 else _INF32 | 0x400000 | (m << 13)  # NaN comes back quiet
    elif e == 0:
        if m == 0:
            mag = 0
        else:  # m * 2**-24, normalised
            top = m.bit_length() - 1
            mag = ((top - 24 + 127) << 23) | ((m << (23 - top)) & 0x7FFFFF)
    else:
        mag = ((e - 15 + 127) << 23) | (m << 13)
    return (sign << 31) | mag


def bf16_to_f32_bits(h: int) -> int:
    u = (h & 0xFFFF) << 16
    if (u & 0x7FFFFFFF) > _INF32:
        u |= 0x400000
    return u


def _split(u: int) -> tuple[int, Fraction | None]:
    """(sign bit, |value| as a Fraction or None for Inf/NaN) of float32 bits."""
    sign = u >> 31
    a = u & 0x7FFFFFFF
    if a >= _INF32:
        return sign, None
    return sign, Fraction(f32_from_bits(a))


def f32_bits_to_fp16(u: int) -> int:
    sign, q = _split(u)
    a = u & 0x7FFFFFFF
    if q is None:
        mag = 0x7C00 if a == _INF32 else 0x7C00 | 0x200 | ((a >> 13) & 0x3FF)
    else:
        mag = round_binary(q, 10, 5)
    return (sign << 15) | mag


def f32_bits_to_bf16(u: int) -> int:
    sign, q = _split(u)
    a = u & 0x7FFFFFFF
    if q is None:
        mag = 0x7F80 if a == _INF32 else (a >> 16) | 0x40
    else:
        mag = round_binary(q, 7, 8)
    return (sign << 15) | mag


def _round_unbounded(q: Fraction, mant_bits: int, emin: int) -> Fraction:
    """The non-negative rational ``q`` rounded to nearest even on ``mant_bits`` stored
    mantissa bits with smallest normal exponent ``emin`` and no largest one."""
    if q == 0:
        return Fraction(0)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    e = max(e, emin)
    step = Fraction(2) ** (e - mant_bits)
    return round(q / step) * step  # Fraction rounds half to even


def _fp8_fields(v: Fraction, mant_bits: int, bias: int) -> int:
    """The 7 magnitude bits of a value representable in the FP8 format."""
    if v == 0:
        return 0
    sub = Fraction(2) ** (1 - bias - mant_bits)  # the subnormal step
    if v < Fraction(2) ** (1 - bias):
        return int(v / sub)
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if Fraction(2) ** e > v:
        e -= 1
    m = int((v / Fraction(2) ** e - 1) * (1 << mant_bits))
    return ((e + bias) << mant_bits) | m


def e4m3fn_to_f32_bits(q: int) -> int:
    """OCP E4M3 (fn: finite, S.1111.111 is NaN), from its fields."""
    sign, e, m = (q >> 7) & 1, (q >> 3) & 0xF, q & 7
    if e == 15 and m == 7:
        return (sign << 31) | 0x7FC00000
    if e == 0:
        v = Fraction(m, 8) * Fraction(2) ** -6  # subnormal
    else:
        v = (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)
    return (sign << 31) | bits_from_f32(float(v))


def e5m2_to_f32_bits(q: int) -> int:
    """OCP E5M2: a binary16 whose low byte is zero."""
    return fp16_to_f32_bits((q & 0xFF) << 8)


def _f32_bits_to_fp8(u: int, saturate: bool, mant_bits: int, bias: int, largest: int,
                     nan: int, overflow: int, saturated: int) -> int:
    """A float32 (bits) to an FP8 code of ``mant_bits`` mantissa bits and ``bias``: NaN
    gives ``nan``; past ``largest`` (Inf included) ``overflow``, or ``saturated`` (the
    largest finite code) with ``saturate``; else round to nearest even (sign kept)."""
    sign, q = _split(u)
    if q is None and u & 0x7FFFFFFF > _INF32:
        return (sign << 7) | nan
    r = None if q is None else _round_unbounded(q, mant_bits, 1 - bias)
    if r is None or r > largest:
        return (sign << 7) | (saturated if saturate else overflow)
    return (sign << 7) | _fp8_fields(r, mant_bits, bias)


def f32_bits_to_e4m3fn(u: int, saturate: bool = False) -> int:
    """OCP E4M3FN: no infinity, so overflow and Inf give NaN (0x7F) unless saturating."""
    return _f32_bits_to_fp8(u, saturate, 3, 7, 448, nan=0x7F, overflow=0x7F, saturated=0x7E)


def f32_bits_to_e5m2(u: int, saturate: bool = False) -> int:
    """OCP E5M2: overflow gives Inf (0x7C) unless saturating; NaN is 0x7E."""
    return _f32_bits_to_fp8(u, saturate, 2, 15, 57344, nan=0x7E, overflow=0x7C,
                            saturated=0x7B)


def q8_0_to_f32_bits(q: int) -> int:
    """GGUF Q8_0's code: the byte as a two's-complement integer."""
    q &= 0xFF
    return bits_from_f32(float(q - 256 if q >= 128 else q))


def f32_bits_to_q8_0(u: int, saturate: bool = False) -> int:
    """The nearest integer, halves away from zero, clamped to [-128, 127]; NaN gives 0
    (the API refuses NaN and, unless saturating, values out of range)."""
    sign, q = _split(u)
    if q is None and u & 0x7FFFFFFF > _INF32:
        return 0
    r = 129 if q is None else int(q + Fraction(1, 2))  # floor(|x| + 1/2), exactly
    r = min(r, 128 if sign else 127)
    return (-r if sign else r) & 0xFF


def q4_0_to_f32_bits(q: int) -> int:
    """A Q4_0 code (4 bits) stands for q - 8."""
    return bits_from_f32(float((q & 15) - 8))


def q4_1_to_f32_bits(q: int) -> int:
    """A Q4_1 code (4 bits) stands for q."""
    return bits_from_f32(float(q & 15))


def q5_1_to_f32_bits(q: int) -> int:
    """A Q5_1 code (a byte; the API refuses bytes past 31) stands for q."""
    return bits_from_f32(float(q & 0xFF))


def _nibble_code(u: int, bias: Fraction, top: int = 15) -> int:
    """trunc(fl32(v + bias)) clamped to 0..top for the float32 bits u; NaN gives 0."""
    sign, q = _split(u)
    if q is None:
        return 0 if u & 0x7FFFFFFF > _INF32 else (0 if sign else top)
    s = (-q if sign else q) + bias
    mag = f32_from_bits(round_binary(abs(s), 23, 8))  # the float32 sum
    r = math.trunc(-mag if s < 0 else mag) if math.isfinite(mag) else (top if s > 0 else 0)
    return min(max(r, 0), top)


def f32_bits_to_q4_0(u: int) -> int:
    return _nibble_code(u, Fraction(17, 2))


def f32_bits_to_q4_1(u: int) -> int:
    return _nibble_code(u, Fraction(1, 2))


def f32_bits_to_q5_1(u: int, saturate: bool = False) -> int:
    """trunc(fl32(v + 0.5)) clamped to 0..31 (``saturate`` changes nothing: the API checks
    the range)."""
    return _nibble_code(u, Fraction(1, 2), 31)


def mul_f32(a: float, b: float) -> float:
    """a * b rounded once to float32 (a, b float32 values; the double product is exact)."""
    with np.errstate(all="ignore"):
        return float(np.float32(a * b))


def fma_f32(a: float, b: float, c: float) -> float:
    """fma(a, b, c) rounded once to float32; a, b, c are float32 values."""
    if math.isnan(a) or math.isnan(b) or math.isnan(c):
        return math.nan
    if math.isinf(a) or math.isinf(b):
        if a == 0 or b == 0:
            return math.nan  # Inf * 0
        prod_inf = math.copysign(math.inf, a) * math.copysign(1.0, b)
        if math.isinf(c) and c != prod_inf:
            return math.nan  # Inf - Inf
        return prod_inf
    if math.isinf(c):
        return c
    prod = Fraction(a) * Fraction(b)
    total = prod + Fraction(c)
    if total == 0:
        if prod == 0 and c == 0:
            prod_neg = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
            both_neg = prod_neg and math.copysign(1.0, c) < 0
            return -0.0 if both_neg else 0.0
        return 0.0  # exact cancellation is +0 when rounding to nearest
    mag = f32_from_bits(round_binary(abs(total), 23, 8))  # may overflow to Inf
    return -mag if total < 0 else mag


# ---- kernels ------------------------------------------------------------------------

_DECODERS = {"fp16": fp16_to_f32_bits, "bf16": bf16_to_f32_bits,
             "e4m3fn": e4m3fn_to_f32_bits, "e5m2": e5m2_to_f32_bits,
             "q8_0": q8_0_to_f32_bits, "q4_0": q4_0_to_f32_bits, "q4_1": q4_1_to_f32_bits,
             "q5_1": q5_1_to_f32_bits}
_NIBBLE_ENCODERS = {"q4_0": f32_bits_to_q4_0, "q4_1": f32_bits_to_q4_1}
_ENCODERS = {"fp16": f32_bits_to_fp16, "bf16": f32_bits_to_bf16,
             "e4m3fn": f32_bits_to_e4m3fn, "e5m2": f32_bits_to_e5m2,
             "q8_0": f32_bits_to_q8_0, "q5_1": f32_bits_to_q5_1}


def _weight_values(bits: np.ndarray, fmt: Format, scales: tuple[np.ndarray, int] | None,
                   offsets: np.ndarray | None = None) -> list[list[float]]:
    if fmt.name == "f32":
        return [[float(v) for v in row] for row in bits]
    dec = _DECODERS[fmt.name]
    if fmt.kpack > 1:  # byte (r, j): row 2r's code in the low nibble, row 2r + 1's high
        codes = [[(int(h) >> (4 * half)) & 15 for h in row] for row in bits
                 for half in (0, 1)]
    else:
        codes = [[int(h) for h in row] for row in bits]
    w = [[f32_from_bits(dec(q)) for q in row] for row in codes]
    if offsets is not None:  # one rounding of q * scale + offset
        grid, bk = scales
        w = [[fma_f32(v, float(grid[p // bk, j]), float(offsets[p // bk, j]))
              for j, v in enumerate(row)] for p, row in enumerate(w)]
    elif scales is not None:
        grid, bk = scales
        w = [[mul_f32(v, float(grid[p // bk, j])) for j, v in enumerate(row)]
             for p, row in enumerate(w)]
    return w


def _matmul(fmt: Format):
    def run(x: np.ndarray, w, out: np.ndarray, accumulate: bool,
            bias: np.ndarray | None = None) -> None:
        rows, scales, accumulate = row_major_operands(w, out, accumulate, bias)
        m, k = x.shape
        n = rows.shape[1]
        w = _weight_values(rows.bits, fmt, scales, rows.provider_offsets())
        xs = [[float(v) for v in row] for row in x]
        result = [[0.0] * n for _ in range(m)]
        for i in range(m):
            for j in range(n):
                c = float(out[i, j]) if accumulate else 0.0
                for p in range(k):
                    c = fma_f32(xs[i][p], w[p][j], c)
                result[i][j] = c
        for i in range(m):
            for j in range(n):
                out[i, j] = np.uint32(bits_from_f32(result[i][j])).view(np.float32)

    return run


def _decode(fmt: Format):
    dec = _DECODERS[fmt.name]

    def run(bits: np.ndarray) -> np.ndarray:
        codes = [int(h) for h in bits.astype(fmt.storage, copy=False)]
        if fmt.kpack > 1:  # two codes a byte, the low nibble first
            codes = [c for h in codes for c in (h & 15, h >> 4)]
        return np.array([dec(c) for c in codes], dtype=np.uint32).view(np.float32)

    return run


def _encode(fmt: Format):
    if fmt.kpack > 1:
        nib = _NIBBLE_ENCODERS[fmt.name]

        def run_pairs(values: np.ndarray, saturate: bool = False) -> np.ndarray:
            codes = [nib(int(u)) for u in values.view(np.uint32)]
            return np.array([lo | hi << 4 for lo, hi in zip(codes[::2], codes[1::2], strict=True)],
                            dtype=np.uint8)
        return run_pairs
    enc = _ENCODERS[fmt.name]

    if fmt.itemsize == 1:
        def run8(values: np.ndarray, saturate: bool = False) -> np.ndarray:
            return np.array([enc(int(u), saturate) for u in values.view(np.uint32)],
                            dtype=np.uint8)
        return run8

    def run(values: np.ndarray) -> np.ndarray:
        return np.array([enc(int(u)) for u in values.view(np.uint32)], dtype=np.uint16)

    return run


class ReferenceProvider(Provider):
    """Pure Python, priority 0: always available, exact, slow."""

    name = "reference"
    priority = 0
    _builders: ClassVar[dict] = {"matmul": _matmul, "encode": _encode, "decode": _decode}

    def lookup(self, op: str, fmt: Format) -> Kernel | None:
        if op != "matmul" and not fmt.has_codec:
            return None
        return Kernel(f"reference_{op}_{fmt.name}", self._builders[op](fmt))
