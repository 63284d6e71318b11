"""The NumPy provider: vectorised and still bit-exact, for where the extension is missing.

The fused multiply-add ``fma(a, b, c)`` in float32 is built from float64 operations:
  * ``a * b`` is exact in float64 (24 + 24 significant bits at most);
  * ``s = c + a*b`` in float64 plus its exact error term (TwoSum, Knuth);
  * ``s`` is moved to round-to-odd: when the sum was inexact and ``s`` has an even last
    bit, step it one ulp towards the exact value;
  * rounding that to float32 is then the correctly rounded result, because float64 keeps
    at least two more bits than float32 (Boldo & Melquiond, "When double rounding is odd").
Each step is vectorised over the m x n output for one ``p``, in ascending ``p``.
"""

from __future__ import annotations

import numpy as np

from .._exact import fma_f32, round_sum_to_f32
from .._formats import Format
from ._base import Kernel, Provider, row_major_operands

_QUIET = np.uint32(0x00400000)
_ABS = np.uint32(0x7FFFFFFF)
_INF = np.uint32(0x7F800000)


def _quiet_nans(words: np.ndarray) -> np.ndarray:
    nan = (words & _ABS) > _INF
    words[nan] |= _QUIET
    return words


def decode_fp16(bits: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        words = bits.astype(np.uint16, copy=False).view(np.float16).astype(np.float32)
    return _quiet_nans(words.view(np.uint32)).view(np.float32)


def decode_bf16(bits: np.ndarray) -> np.ndarray:
    words = bits.astype(np.uint32) << np.uint32(16)
    return _quiet_nans(words).view(np.float32)


def _nan_mask(words: np.ndarray) -> np.ndarray:
    """True where the float32 bit pattern is a NaN."""
    return np.greater(words & _ABS, _INF)


_FP16_TINY = np.uint32(0x33000000)  # 2^-25: at or below it, every input rounds to +-0


def encode_fp16(values: np.ndarray) -> np.ndarray:
    words = values.view(np.uint32)
    # NumPy's cast raises an underflow flag per element on tiny inputs, which makes it ~50x
    # slower there; those all round to a signed zero, so cast zeros instead.
    tiny = (words & _ABS) <= _FP16_TINY
    with np.errstate(all="ignore"):
        out = np.where(tiny, np.float32(0), values).astype(np.float16).view(np.uint16)
    out |= ((words >> 16) & 0x8000).astype(np.uint16) * tiny
    nan = _nan_mask(words)
    if nan.any():  # NumPy keeps signalling NaNs signalling; F16C quiets them
        quiet = ((words >> 16) & 0x8000) | 0x7E00 | ((words >> 13) & 0x3FF)
        np.copyto(out, quiet.astype(np.uint16), where=nan)
    return out


def encode_bf16(values: np.ndarray) -> np.ndarray:
    words = values.view(np.uint32)
    r = words >> 16
    r &= 1
    r += 0x7FFF
    r += words  # wraps only for NaN patterns, which are replaced below
    r >>= 16
    out = r.astype(np.uint16)
    nan = _nan_mask(words)
    if nan.any():
        np.copyto(out, ((words >> 16) | 0x40).astype(np.uint16), where=nan)
    return out


def _e4m3fn_table() -> np.ndarray:
    """The 256 e4m3fn values: the 7 magnitude bits << 7 are a binary16 of value / 2^8."""
    q = np.arange(256, dtype=np.uint16)
    with np.errstate(all="ignore"):
        mag = ((q & 0x7F) << 7).view(np.float16).astype(np.float32) * np.float32(256)
    sign = (q.astype(np.uint32) & 0x80) << 24
    words = mag.view(np.uint32) | sign
    nan = (q & 0x7F) == 0x7F
    words[nan] = 0x7FC00000 | sign[nan]
    return words.view(np.float32)


_E4M3FN = _e4m3fn_table()
_E5M2 = decode_fp16(np.arange(256, dtype=np.uint16) << 8)


def decode_e4m3fn(bits: np.ndarray) -> np.ndarray:
    return _E4M3FN[bits]


def decode_e5m2(bits: np.ndarray) -> np.ndarray:
    return _E5M2[bits]


def _encode8(values: np.ndarray, saturate: bool, shift: int, bias_add: int, normal_min: int,
             step_add: float, big: int, top: int, nan_code: int) -> np.ndarray:
    """The branch-free float32 -> FP8 rounding of codecs/codec_scalar.h, on whole arrays
    (uint32 arithmetic wraps as C's does)."""
    words = values.view(np.uint32)
    sign = (words >> 24) & 0x80
    a = words & _ABS
    odd = (a >> shift) & 1
    normal = (a + np.uint32(bias_add) + odd) >> shift
    with np.errstate(all="ignore"):
        aligned = (a.view(np.float32) + np.float32(step_add)).view(np.uint32)
    subnormal = aligned - np.float32(step_add).view(np.uint32)
    r = np.where(a < normal_min, subnormal, normal)
    nan = a > _INF
    over = ~nan & ((a >= big) | (r > top))
    r = np.where(over, top if saturate else top + 1, r)
    r = np.where(nan, nan_code, r)
    return (sign | (r & 0x7F)).astype(np.uint8)


def encode_e4m3fn(values: np.ndarray, saturate: bool = False) -> np.ndarray:
    return _encode8(values, saturate, 20, 0xC407FFFF, 0x3C800000, 16384.0, 0x44000000, 0x7E,
                    0x7F)


def encode_e5m2(values: np.ndarray, saturate: bool = False) -> np.ndarray:
    return _encode8(values, saturate, 21, 0xC80FFFFF, 0x38800000, 128.0, 0x47800000, 0x7B,
                    0x7E)


def decode_q8_0(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.int8).astype(np.float32)


def encode_q8_0(values: np.ndarray, saturate: bool = False) -> np.ndarray:
    """codec_scalar.h's nm_f32_to_q8_0: halves away from zero, clamped to [-128, 127],
    NaN as 0 (``saturate`` changes nothing: the API checks the range)."""
    a = np.nan_to_num(np.abs(values), nan=0.0, posinf=129.0)
    a = np.minimum(a, np.float32(129))
    whole = np.floor(a)
    r = whole + (a - whole >= np.float32(0.5))
    neg = np.signbit(values)
    r = np.minimum(r, np.where(neg, np.float32(128), np.float32(127)))
    return np.where(neg, -r, r).astype(np.int16).astype(np.int8).view(np.uint8)


def _nibbles(shift: float):
    """The decoder of a 4-bit format: each byte's two codes, low nibble first, minus
    ``shift``, as a flat array twice as long."""
    def decode(bits: np.ndarray) -> np.ndarray:
        pairs = np.stack([bits & 15, bits >> 4], axis=-1).astype(np.float32)
        return (pairs - np.float32(shift)).reshape(-1)
    return decode


def _nibble_encoder(bias: float):
    """codec_scalar.h's nm_f32_to_q4_0 / _q4_1 on pairs of values: trunc(fl32(v + bias))
    clamped to 0..15, NaN as 0, two codes a byte."""
    def encode(values: np.ndarray, saturate: bool = False) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            f = values + np.float32(bias)
            f = np.where(f > 0, f, np.float32(0))  # NaN too
            codes = np.minimum(f, np.float32(15)).astype(np.uint8).reshape(-1, 2)
        return codes[:, 0] | (codes[:, 1] << 4)
    return encode


def decode_q5_1(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.float32)


def encode_q5_1(values: np.ndarray, saturate: bool = False) -> np.ndarray:
    """codec_scalar.h's nm_f32_to_q5_1: trunc(fl32(v + 0.5)) clamped to 0..31, NaN as 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        f = values + np.float32(0.5)
        f = np.where(f > 0, f, np.float32(0))  # NaN too
        return np.minimum(f, np.float32(31)).astype(np.uint8)


_DECODE = {"fp16": decode_fp16, "bf16": decode_bf16, "e4m3fn": decode_e4m3fn,
           "e5m2": decode_e5m2, "q8_0": decode_q8_0, "q4_0": _nibbles(8.0),
           "q4_1": _nibbles(0.0), "q5_1": decode_q5_1}
_ENCODE = {"fp16": encode_fp16, "bf16": encode_bf16, "e4m3fn": encode_e4m3fn,
           "e5m2": encode_e5m2, "q8_0": encode_q8_0, "q4_0": _nibble_encoder(8.5),
           "q4_1": _nibble_encoder(0.5), "q5_1": encode_q5_1}


def fma_rows(x64: np.ndarray, w_row: np.ndarray, c64: np.ndarray) -> np.ndarray:
    """float32 fma(x64[:, None], w_row[None, :], c64) for all pairs, as float64 values."""
    return round_sum_to_f32(x64[:, None] * w_row[None, :].astype(np.float64), c64)


def _matmul(fmt: Format):
    def run(x: np.ndarray, w, out: np.ndarray, accumulate: bool,
            bias: np.ndarray | None = None) -> None:
        rows, scales, accumulate = row_major_operands(w, out, accumulate, bias)
        bits, offsets = rows.bits, rows.provider_offsets()
        k, n = rows.shape
        if fmt.kpack > 1:  # two rows a byte: their raw values, all at once
            raw = rows.raw_rows(_DECODE[fmt.name](bits.reshape(-1)).reshape(*bits.shape, 2))
        c64 = out.astype(np.float64) if accumulate else np.zeros(out.shape, np.float64)
        x64 = x.astype(np.float64)
        with np.errstate(all="ignore"):
            for p in range(k):
                if fmt.kpack > 1:
                    row = raw[p]
                else:
                    row = bits[p] if fmt.name == "f32" else _DECODE[fmt.name](bits[p])
                if offsets is not None:  # fma(q, scale, offset): one rounding
                    row = fma_f32(row, scales[0][p // scales[1], :n], offsets[p // scales[1], :n])
                elif scales is not None:  # one float32 rounding per weight
                    row = row * scales[0][p // scales[1], :n]
                c64 = fma_rows(x64[:, p], row, c64)
            out[...] = c64.astype(np.float32)

    return run


class NumpyProvider(Provider):
    """Vectorised NumPy, priority 50."""

    name = "numpy"
    priority = 50

    def lookup(self, op: str, fmt: Format) -> Kernel | None:
        if op == "matmul":
            return Kernel(f"numpy_matmul_{fmt.name}", _matmul(fmt))
        table = _ENCODE if op == "encode" else _DECODE if op == "decode" else {}
        fn = table.get(fmt.name)
        return Kernel(f"numpy_{op}_{fmt.name}", fn) if fn else None
