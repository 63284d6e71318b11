"""GGUF's block types as narrowmm weights: each converter takes a tensor's blocks, shape
``(rows, blocks, type size)`` (PyTorch's (out, in) reading: a row's blocks along ``in``), and
gives the narrowmm format, its stored codes in that reading, and the float32 grids of scales
(and offsets) per ``block_rows`` input features, such that every weight is the type's formula
as ``ggml-quants.c`` writes it down, bit for bit:

| ggml type | narrowmm format | weight |
|---|---|---|
| Q8_0 | q8_0 | ``q * d`` |
| Q4_0 | q4_0 | ``(q - 8) * d`` |
| Q4_1 | q4_1 | ``d * q + m`` = fma(q, d, m) |
| Q5_0 | q8_0 (codes q - 16) | ``(q - 16) * d`` |
| Q5_1 | q5_1 | ``d * q + m`` = fma(q, d, m) |
| Q2_K | q4_1 (per 16: d * sc, -(dmin * m)) | ``(d * sc) * q - dmin * m`` |
| Q3_K | q8_0 (codes q - 4 or q, per 16: d * (sc - 32)) | ``(d * (sc - 32)) * q`` |
| Q4_K | q4_1 (per 32: d * sc, -(dmin * m)) | ``(d * sc) * q - dmin * m`` |
| Q5_K | q5_1 (per 32: d * sc, -(dmin * m)) | ``(d * sc) * q - dmin * m`` |
| Q6_K | q8_0 (codes q - 32, per 16: d * sc) | ``(d * sc) * q`` |
| IQ4_NL | q8_0 (codes the type's 16 values) | ``d * v[q]`` |
| IQ4_XS | q8_0 (codes v[q], per 32: d * (sc - 32)) | ``(d * (sc - 32)) * v[q]`` |

The products ``d * sc`` and ``dmin * m`` of a K type are exact in float32 (an fp16 times a
4-, 6- or 8-bit integer), so a K type's sub-block is a scale (and offset) of the narrower
format, and its weight the same rounding: one, of the exact value, wherever GGUF rounds
once (Q6_K's ``(d * sc) * q`` can round: the scale is made first, as ggml does; Q5_K's,
Q3_K's and IQ4_XS's cannot: at most 11 + 6 + 5, 11 + 6 + 3 and 11 + 6 + 7 significant
bits). Codes of 5 bits and more, and the IQ4 types' values, take a byte each (q8_0's int8
codes, or q5_1's): more bytes a weight than the file, the same values.
"""

from __future__ import annotations

import numpy as np

from .._scales import Scales
from .._weights import TorchWeights
from ..providers.native import core

# (format, codes, scales, offsets or None, rows a scale covers)
Converted = tuple[str, np.ndarray, np.ndarray, "np.ndarray | None", int]


def fp16_field(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 at byte ``start`` of every block, as float32 (rows, blocks)."""
    return np.ascontiguousarray(blocks[:, :, start:start + 2]).view("<f2")[..., 0].astype(
        np.float32)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """Bytes (..., 16 or 32) holding codes i (low nibble) and i + len (high nibble), as the
    codes in order (..., 2 len): GGUF's Q4/Q5 layout."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def nibble_pairs(qs: np.ndarray) -> np.ndarray:
    """Bytes (..., L) of GGUF's Q4 layout (codes i low, i + L high) straight as narrowmm's
    4-bit bytes (codes 2j and 2j + 1 in byte j, low nibble first): ``pairs(nibbles(qs))``
    without the codes one a byte in between."""
    even, odd = qs[..., 0::2], qs[..., 1::2]
    return np.concatenate([(even & 15) | (odd << 4), (even >> 4) | (odd & 0xF0)], axis=-1)


def block_nibble_pairs(blocks: np.ndarray, offset: int, run: int, runs: int = 1) -> np.ndarray:
    """:func:`nibble_pairs` of the ``runs`` runs of ``run`` bytes from byte ``offset`` of
    every block (rows, blocks, type size), as (rows, blocks * runs * run) bytes. Through the
    native core's ``nm_nibble_pairs`` when it is loaded (one pass in C: Q4_0's and Q4_1's
    blocks 4-5x faster, Q4_K's 13x, docs/results/load-gguf-zen3-2026-12-06.txt), else
    NumPy; the same bytes."""
    rows, nb, size = blocks.shape
    c = core()
    if c is not None and blocks.dtype == np.uint8:
        out = np.empty((rows, nb * runs * run), np.uint8)
        c.nibble_pairs(np.ascontiguousarray(blocks), size, offset, run, runs, out)
        return out
    qs = blocks[:, :, offset:offset + runs * run].reshape(rows, nb, runs, run)
    return nibble_pairs(qs).reshape(rows, nb * runs * run)


def pairs(codes: np.ndarray) -> np.ndarray:
    """4-bit codes (rows, in) as narrowmm's bytes (rows, in / 2): codes 2j and 2j + 1 of a
    row in byte j, the low nibble first."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def int8_codes(values: np.ndarray) -> np.ndarray:
    """Small signed integers (rows, in) as the bytes of q8_0's int8 codes."""
    return values.astype(np.int8).view(np.uint8)


def q8_0(blocks: np.ndarray) -> Converted:
    rows, nb, _ = blocks.shape
    codes = np.ascontiguousarray(blocks[:, :, 2:]).reshape(rows, nb * 32)
    return "q8_0", codes, fp16_field(blocks, 0), None, 32


def q4_0(blocks: np.ndarray) -> Converted:
    return "q4_0", block_nibble_pairs(blocks, 2, 16), fp16_field(blocks, 0), None, 32


def q4_1(blocks: np.ndarray) -> Converted:
    return "q4_1", block_nibble_pairs(blocks, 4, 16), fp16_field(blocks, 0), \
        fp16_field(blocks, 2), 32


def fifth_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes (..., 4) of high bits, bit i (little-endian) code i's fifth bit, as 0/16 for
    each of the 32 codes (..., 32): Q5_0's and Q5_1's layout."""
    high = np.ascontiguousarray(qh).view("<u4")[..., 0]
    return (((high[..., None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def q5_0(blocks: np.ndarray) -> Converted:
    """d, 4 bytes of high bits (bit i: code i's fifth bit, little-endian), 16 bytes of low
    nibbles (codes i and i + 16)."""
    rows, nb, _ = blocks.shape
    codes = (nibbles(blocks[:, :, 6:]) | fifth_bits(blocks[:, :, 2:6])).astype(np.int16)
    return "q8_0", int8_codes((codes - 16).reshape(rows, nb * 32)), fp16_field(blocks, 0), \
        None, 32


def q5_1(blocks: np.ndarray) -> Converted:
    """d, m, 4 bytes of high bits, 16 bytes of low nibbles (as Q5_0, with an offset m)."""
    rows, nb, _ = blocks.shape
    codes = nibbles(blocks[:, :, 8:]) | fifth_bits(blocks[:, :, 4:8])
    return "q5_1", codes.reshape(rows, nb * 32), fp16_field(blocks, 0), fp16_field(blocks, 2), \
        32


def _k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes of eight 6-bit scales and eight 6-bit mins (ggml's get_scale_min_k4):
    bytes 0-3 and 4-7 hold scales and mins 0-3 in their low 6 bits and the top 2 bits of
    scales and mins 4-7; bytes 8-11 hold the low 4 bits of scales 4-7 (low nibble) and mins
    4-7 (high nibble)."""
    lo, mid, top = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([lo & 63, (top & 15) | ((lo >> 6) << 4)], axis=-1)
    mins = np.concatenate([mid & 63, (top >> 4) | ((mid >> 6) << 4)], axis=-1)
    return scales.astype(np.float32), mins.astype(np.float32)


def two_bit_codes(qs: np.ndarray) -> np.ndarray:
    """Q2_K's and Q3_K's 64 bytes of 2-bit codes (..., 64) as the 256 codes in order: in each
    half of 32 bytes, bits 2s..2s+1 of byte l hold code 32s + l."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    halves = qs.reshape(*qs.shape[:-1], 2, 1, 32)
    return ((halves >> shifts) & 3).reshape(*qs.shape[:-1], 256)


def bit_planes(mask: np.ndarray) -> np.ndarray:
    """32 bytes (..., 32) as their 8 bit planes (..., 8, 32): plane s holds bit s of each
    byte, the high bit of code 32s + l (Q3_K's and Q5_K's layout)."""
    return (mask[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1


def q2_k(blocks: np.ndarray) -> Converted:
    """16 bytes of sub-block scales (low nibble) and mins (high), 64 bytes of 2-bit codes,
    d, dmin: per 16 inputs the scale ``d * sc`` and the offset ``-(dmin * m)``, exact."""
    rows, nb, _ = blocks.shape
    sub = blocks[:, :, :16]
    d = fp16_field(blocks, 80)[..., None] * (sub & 15).astype(np.float32)  # exact
    dm = fp16_field(blocks, 82)[..., None] * (sub >> 4).astype(np.float32)
    codes = two_bit_codes(blocks[:, :, 16:80]).reshape(rows, nb * 256)
    return "q4_1", pairs(codes), d.reshape(rows, nb * 16), (-dm).reshape(rows, nb * 16), 16


def q3_k(blocks: np.ndarray) -> Converted:
    """32 bytes of high bits (bit s of byte l: code 32s + l's third bit, which, clear,
    takes 4 off the code), 64 bytes of 2-bit codes, 12 bytes of 6-bit scales (bytes 0-7: the
    low 4 bits of scales 0-7 and, in the high nibbles, 8-15; bytes 8-11: the top 2 bits, bits
    2s..2s+1 of byte i for scale 4s + i), d: codes -4..3 as q8_0's, per 16 inputs the scale
    ``d * (sc - 32)``, exact."""
    rows, nb, _ = blocks.shape
    high = bit_planes(blocks[:, :, :32]).reshape(rows, nb, 256)
    codes = two_bit_codes(blocks[:, :, 32:96]).astype(np.int16) - 4 * (1 - high.astype(np.int16))
    packed = blocks[:, :, 96:108]
    low = np.concatenate([packed[..., :8] & 15, packed[..., :8] >> 4], axis=-1)
    top = ((packed[..., 8:12, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3)
    top = np.swapaxes(top, -1, -2).reshape(rows, nb, 16)
    sc = (low | (top << 4)).astype(np.float32) - 32
    d = fp16_field(blocks, 108)[..., None] * sc  # exact: fp16 x 6-bit integer
    return "q8_0", int8_codes(codes.reshape(rows, nb * 256)), d.reshape(rows, nb * 16), \
        None, 16


def q4_k(blocks: np.ndarray) -> Converted:
    """d, dmin, 12 bytes of sub-block scales and mins, 128 bytes of codes: four chunks of 32
    bytes, chunk c holding codes 64c + l (low nibble, sub-block 2c) and 64c + 32 + l (high
    nibble, sub-block 2c + 1)."""
    rows, nb, _ = blocks.shape
    sc, mins = _k_scales_mins(blocks[:, :, 4:16])
    d = fp16_field(blocks, 0)[..., None] * sc  # exact: fp16 x 6-bit integer
    dm = fp16_field(blocks, 2)[..., None] * mins
    codes = block_nibble_pairs(blocks, 16, 32, 4)
    return "q4_1", codes, d.reshape(rows, nb * 8), (-dm).reshape(rows, nb * 8), 32


def q5_k(blocks: np.ndarray) -> Converted:
    """d, dmin, 12 bytes of sub-block scales and mins (Q4_K's), 32 bytes of high bits, 128
    of low nibbles: the low nibbles as Q4_K's (chunk c: sub-blocks 2c and 2c + 1), and bit i
    of high byte l the fifth bit of code l of sub-block i."""
    rows, nb, _ = blocks.shape
    sc, mins = _k_scales_mins(blocks[:, :, 4:16])
    d = fp16_field(blocks, 0)[..., None] * sc  # exact: fp16 x 6-bit integer
    dm = fp16_field(blocks, 2)[..., None] * mins
    low = nibbles(blocks[:, :, 48:].reshape(rows, nb, 4, 32)).reshape(rows, nb, 8, 32)
    codes = (low | (bit_planes(blocks[:, :, 16:48]) << 4)).reshape(rows, nb * 256)
    return "q5_1", codes, d.reshape(rows, nb * 8), (-dm).reshape(rows, nb * 8), 32


def q6_k(blocks: np.ndarray) -> Converted:
    """128 bytes of low nibbles, 64 of high bit pairs, 16 int8 sub-block scales, d: in each
    half of 128 codes, ql byte l holds the low 4 bits of codes l (low nibble) and l + 64
    (high), l < 64; qh byte l holds the top 2 bits of codes l, l + 32, l + 64 and l + 96
    (bits 0-1, 2-3, 4-5, 6-7), l < 32."""
    rows, nb, _ = blocks.shape
    ql = blocks[:, :, :128].reshape(rows, nb, 2, 1, 64)
    qh = blocks[:, :, 128:192].reshape(rows, nb, 2, 1, 32)
    low = (ql >> np.array([0, 4], np.uint8)[:, None]) & 15  # codes l, then l + 64
    high = (qh >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3  # codes 32s + l
    codes = low.reshape(rows, nb * 256) | (high.reshape(rows, nb * 256) << 4)
    codes -= 32  # 0..63 -> the bytes of int8 q - 32 (uint8 arithmetic wraps)
    sc = np.ascontiguousarray(blocks[:, :, 192:208]).view(np.int8).astype(np.float32)
    d = fp16_field(blocks, 208)[..., None] * sc  # exact: fp16 x int8
    return "q8_0", codes, d.reshape(rows, nb * 16), None, 16


# IQ4_NL's and IQ4_XS's 16 code values (ggml-common.h, kvalues_iq4nl)
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                       113], dtype=np.int8)


def iq4_nl(blocks: np.ndarray) -> Converted:
    """d, 16 bytes of 4-bit indices (codes i and i + 16) into IQ4_VALUES: q8_0's codes are
    the values themselves."""
    rows, nb, _ = blocks.shape
    codes = IQ4_VALUES[nibbles(blocks[:, :, 2:])].reshape(rows, nb * 32)
    return "q8_0", codes.view(np.uint8), fp16_field(blocks, 0), None, 32


def iq4_xs(blocks: np.ndarray) -> Converted:
    """d, a little-endian 16-bit word of the sub-block scales' top 2 bits (bits 2j..2j+1 for
    sub-block j), 4 bytes of their low 4 bits (sub-block 2i low nibble, 2i + 1 high), then per
    sub-block of 32 16 bytes of 4-bit indices into IQ4_VALUES (codes i and i + 16): per 32
    inputs the scale ``d * (sc - 32)``, exact."""
    rows, nb, _ = blocks.shape
    top = np.ascontiguousarray(blocks[:, :, 2:4]).view("<u2")[..., 0]
    top = (top[..., None] >> (2 * np.arange(8, dtype=np.uint16))) & 3
    low = blocks[:, :, 4:8]
    low = np.stack([low & 15, low >> 4], axis=-1).reshape(rows, nb, 8)
    sc = (low | (top.astype(np.uint8) << 4)).astype(np.float32) - 32
    d = fp16_field(blocks, 0)[..., None] * sc  # exact: fp16 x 6-bit integer
    codes = IQ4_VALUES[nibbles(blocks[:, :, 8:].reshape(rows, nb, 8, 16))]
    return "q8_0", codes.reshape(rows, nb * 256).view(np.uint8), d.reshape(rows, nb * 8), \
        None, 32


CONVERTERS = {"Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1,
              "Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k,
              "IQ4_NL": iq4_nl, "IQ4_XS": iq4_xs}
# where each block type keeps its fp16 fields (d, and m or dmin), in bytes from the block's
# start: what a maker of blocks must set to finite values
FP16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
               "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
               "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,)}


# Bytes of a tensor's blocks that convert() hands a converter at a time: the converters'
# temporaries, several times their input, then stay a few tens of MB for a tensor of any
# size (a Llama-3 embedding table's Q6_K blocks are 430 MB).
_CONVERT_BYTES = 1 << 22


def convert(type_name: str, blocks: np.ndarray) -> Converted:
    """``CONVERTERS[type_name](blocks)``, a slice of rows at a time into arrays made once
    (every converter works row by row)."""
    converter = CONVERTERS[type_name]
    rows = blocks.shape[0]
    step = max(1, _CONVERT_BYTES // max(1, blocks.shape[1] * blocks.shape[2]))
    if step >= rows:
        return converter(blocks)
    fmt, *grids, block_rows = converter(blocks[:step])
    whole = [None if g is None else np.empty((rows, *g.shape[1:]), g.dtype) for g in grids]
    for r0 in range(0, rows, step):
        part = grids if r0 == 0 else converter(blocks[r0:r0 + step])[1:4]
        for out, g in zip(whole, part, strict=True):
            if out is not None:
                out[r0:r0 + step] = g
    codes, scales, offsets = whole
    return fmt, codes, scales, offsets, block_rows


def as_torch_weights(converted: Converted) -> TorchWeights:
    """A converter's result as narrowmm weights in PyTorch's ``(out, in)`` reading."""
    fmt, codes, scales, offsets, rows = converted
    return TorchWeights(codes, fmt, Scales.blocks(scales, (1, rows)),
                        None if offsets is None else Scales.blocks(offsets, (1, rows)))
