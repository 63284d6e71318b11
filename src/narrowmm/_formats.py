"""The weight formats: one table, so that a new format is a new row, not new branches.

Each provider keeps its own kernel table keyed by these names, and the C core keeps the same
list under the same codes (``csrc/include/nm_formats.h``); a test checks that they agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Format:
    """A storage format for weights.

    Attributes:
        name: canonical name (``"f32"``, ``"fp16"``, ``"bf16"``, ``"e4m3fn"``, ``"e5m2"``,
            ``"q8_0"``, ``"q4_0"``, ``"q4_1"``, ``"q5_1"``).
        code: the C core's ``nm_format`` code.
        itemsize: bytes per stored element.
        storage: NumPy dtype that holds the raw stored elements (bits for the narrow formats).
        exponent_bits, mantissa_bits: the layout, for documentation and range checks (an
            integer format: 0 and its magnitude bits).
        numpy_names: dtype names whose arrays wrap as this format without a copy.
        description: one line for ``narrowmm info``.
        scaled: weights in this format carry float32 scales (:class:`~narrowmm.Scales`),
            each weight being ``fl32(decode(q) * scale)``.
        max_finite: the largest finite value (of a code, before its scale).
        scale_exponent: r, for a scaled format: the C kernels take ``scale * 2**r`` (so
            scales must stay below ``2**(128 - r)``; docs/kernels.md says why).
        special_bits: the magnitude bits that every NaN/Inf code of the format has (a code
            with all of them set is NaN or Inf), or 0 when every code is finite.
        integer: the codes are integers (the GGUF formats): decoded, a code is the integer
            it stands for, ``min_code`` to ``max_finite``; encoding rounds as GGUF does.
        min_code: the smallest value a code of an integer format stands for.
        code_bias: how an integer format's encoder rounds: 0 for halves away from zero
            (Q8_0's ``roundf``), else ``trunc(fl32(v + code_bias))`` (GGUF's 4-bit
            quantizers), then the codes' range.
        gguf_block: for a GGUF type, the input features a block holds (its scale's rows);
            ``Weights.quantize`` makes such blocks by default.
        kpack: rows of the matrix one stored element holds: 2 for the 4-bit formats (the
            low nibble row 2r, the high one row 2r + 1), so bits have ``k / 2`` rows.
        offsets: the weights also carry offsets, a second grid of the scales' shape:
            weight = fma(decode(q), scale, offset) (Q4_1, Q5_1).
        half_scales: the native kernels take the scales (and offsets) of packed weights as a
            binary16 grid when every one of them is a binary16 number, as GGUF's are (Q8_0,
            Q4_0, Q4_1, Q5_1): the same weights, half the grid's bytes for the m <= 2 walks to
            read (``PackedWeights.kernel_scales``).
        code_bits: the low bits of a stored byte that make its code, when the codes do not
            use all eight (Q5_1: 5, so a byte past 31 is refused); 0 when every byte is one.
        packed_xor: packed weights (:meth:`Weights.pack`) hold each stored byte XOR-ed with
            this: Q4_0's 0x88 makes each nibble q - 8 in two's complement, which the avx2
            row decodes in fewer operations (docs/contracts.md); 0 for the others.
    """

    name: str
    code: int
    itemsize: int
    storage: np.dtype
    exponent_bits: int
    mantissa_bits: int
    numpy_names: tuple[str, ...]
    description: str
    scaled: bool = False
    max_finite: float = 0.0
    scale_exponent: int = 0
    special_bits: int = 0
    integer: bool = False
    min_code: float = 0.0
    code_bias: float = 0.0
    gguf_block: int = 0
    kpack: int = 1
    offsets: bool = False
    half_scales: bool = False
    code_bits: int = 0
    packed_xor: int = 0

    @property
    def max_scale(self) -> float:
        """Scales must be finite and smaller than this in magnitude (scaled formats)."""
        return float(2.0 ** (128 - self.scale_exponent)) if self.scaled else float("inf")

    @property
    def has_codec(self) -> bool:
        """True when values must be encoded/decoded (every format but f32)."""
        return self.name != "f32"

    def __repr__(self) -> str:
        return f"Format({self.name!r})"


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("f32", 0, 4, np.dtype(np.float32), 8, 23, ("float32",), "IEEE binary32",
               max_finite=3.4028234663852886e38),
        Format("fp16", 1, 2, np.dtype(np.uint16), 5, 10, ("float16",), "IEEE binary16",
               max_finite=65504.0),
        Format("bf16", 2, 2, np.dtype(np.uint16), 8, 7, ("bfloat16",), "bfloat16 (Brain)",
               max_finite=3.3895313892515355e38),
        Format("e4m3fn", 3, 1, np.dtype(np.uint8), 4, 3, ("float8_e4m3fn",),
               "OCP FP8 E4M3, no infinities, with float32 scales", scaled=True,
               max_finite=448.0, scale_exponent=8, special_bits=0x7F),
        Format("e5m2", 4, 1, np.dtype(np.uint8), 5, 2, ("float8_e5m2",),
               "OCP FP8 E5M2, with float32 scales", scaled=True, max_finite=57344.0,
               scale_exponent=0, special_bits=0x7C),
        Format("q8_0", 5, 1, np.dtype(np.uint8), 0, 7, (),
               "GGUF Q8_0: int8 codes, a float32 (GGUF: fp16) scale per 32 input features",
               scaled=True, max_finite=127.0, integer=True, min_code=-128.0, gguf_block=32,
               half_scales=True),
        Format("q4_0", 6, 1, np.dtype(np.uint8), 0, 4, (),
               "GGUF Q4_0: 4-bit codes, two rows a byte, (q - 8) times a scale per 32 inputs",
               scaled=True, max_finite=7.0, integer=True, min_code=-8.0, code_bias=8.5,
               gguf_block=32, kpack=2, half_scales=True, packed_xor=0x88),
        Format("q4_1", 7, 1, np.dtype(np.uint8), 0, 4, (),
               "GGUF Q4_1: 4-bit codes, two rows a byte, q times a scale plus an offset per "
               "32 inputs", scaled=True, max_finite=15.0, integer=True, min_code=0.0,
               code_bias=0.5, gguf_block=32, kpack=2, offsets=True, half_scales=True),
        Format("q5_1", 8, 1, np.dtype(np.uint8), 0, 5, (),
               "GGUF Q5_1 (and Q5_K): 5-bit codes, one a byte, q times a scale plus an offset "
               "per 32 inputs", scaled=True, max_finite=31.0, integer=True, min_code=0.0,
               code_bias=0.5, gguf_block=32, offsets=True, half_scales=True, code_bits=5),
    )
}

_ALIASES = {"float32": "f32", "fp32": "f32", "float16": "fp16", "f16": "fp16",
            "half": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3fn",
            "f8_e4m3": "e4m3fn", "float8_e5m2": "e5m2", "f8_e5m2": "e5m2"}

OPERATIONS = ("matmul", "encode", "decode")


def get_format(fmt: str | Format) -> Format:
    """Return the :class:`Format` named ``fmt`` (a name, an alias, or a Format)."""
    if isinstance(fmt, Format):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"format must be a string, got {type(fmt).__name__}")
    key = fmt.lower()
    key = _ALIASES.get(key, key)
    try:
        return FORMATS[key]
    except KeyError:
        raise ValueError(
            f"unknown format {fmt!r}; known formats: {', '.join(FORMATS)}"
        ) from None


def operations() -> list[tuple[str, Format]]:
    """Every (operation, format) pair the library promises to serve."""
    pairs = []
    for op in OPERATIONS:
        for f in FORMATS.values():
            if op == "matmul" or f.has_codec:
                pairs.append((op, f))
    return pairs
