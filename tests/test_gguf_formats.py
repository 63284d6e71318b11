"""GGUF's integer block formats as narrowmm formats: Q8_0 (int8 codes), Q4_0 and Q4_1 (4-bit
codes, two rows a byte) and Q5_1 (5-bit codes, one a byte), each with a float32 scale per
32 input features, Q4_1 and Q5_1 with an offset too.

The contract (docs/contracts.md): weight (p, j) is fl32(q * d) (Q8_0), fl32((q - 8) * d)
(Q4_0) or fma(q, d, m) (Q4_1, Q5_1), with d and m the block's scale and offset (fp16 in a
GGUF file, exact in float32), so every product is exact and the weight has at most the one
rounding of the sum; then the usual fma chain over p ascending. ``gguf.quants`` (the
GGUF project's NumPy implementation) is the outside oracle for the quantizers and the
decode; the reference provider for the chain."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import (
    K_BLOCK_BYTES,
    assert_oracle_bits_on_every_path,
    assert_same_bits,
    k_type_weights,
    require,
)

import narrowmm as nm
from narrowmm.providers import use_provider
from narrowmm.providers.native import core, use_isa

gguf = require("gguf")
gguf_quants = require("gguf.quants")
FORMATS = ["q8_0", "q4_0", "q4_1", "q5_1"]
GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q4_1": gguf.GGMLQuantizationType.Q4_1, "q5_1": gguf.GGMLQuantizationType.Q5_1}
CODES = np.arange(256, dtype=np.uint8)


def gguf_blocks(values: np.ndarray, fmt: str) -> np.ndarray:
    """GGUF's blocks of a (k, n) matrix, as a file stores it: PyTorch's (n, k) rows."""
    return gguf_quants.quantize(np.ascontiguousarray(values.T), GGML[fmt])


def gguf_values(values: np.ndarray, fmt: str) -> np.ndarray:
    """What GGUF's dequantize gives for the blocks of ``values``, back in (k, n)."""
    return np.ascontiguousarray(gguf_quants.dequantize(gguf_blocks(values, fmt), GGML[fmt]).T)


def test_the_rows_of_the_format_table():
    want = {"q8_0": (5, 1, 1, -128.0, 127.0), "q4_0": (6, 1, 2, -8.0, 7.0),
            "q4_1": (7, 1, 2, 0.0, 15.0), "q5_1": (8, 1, 1, 0.0, 31.0)}
    c_rows = {name: (code, size, scaled, kpack, offset, half, xor)
              for code, name, size, scaled, _, kpack, offset, half, xor in core().formats()}
    for name, (code, size, kpack, lo, hi) in want.items():
        f = nm.get_format(name)
        assert (f.code, f.itemsize, f.kpack, f.min_code, f.max_finite) == (code, size, kpack,
                                                                            lo, hi)
        assert f.scaled and f.integer and f.gguf_block == 32 and f.special_bits == 0
        assert f.offsets == (name in ("q4_1", "q5_1"))
        assert f.half_scales
        assert f.packed_xor == (0x88 if name == "q4_0" else 0)
        assert c_rows[name] == (code, size, 1, kpack, int(f.offsets), int(f.half_scales),
                                f.packed_xor)


def code_values(fmt: str) -> np.ndarray:
    """What each of the 256 bytes stands for: one int8, or two 4-bit codes, low first; Q5_1's
    32 codes, the bytes below 32."""
    if fmt == "q8_0":
        return CODES.view(np.int8).astype(np.float32)
    if fmt == "q5_1":
        return CODES[:32].astype(np.float32)
    shift = 8.0 if fmt == "q4_0" else 0.0
    return np.stack([CODES & 15, CODES >> 4], axis=-1).astype(np.float32) - np.float32(shift)


@pytest.mark.parametrize("provider", ["native", "numpy", "reference"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_byte_decodes_to_its_codes(fmt, provider, isa):
    codes = CODES[:32] if fmt == "q5_1" else CODES
    with use_provider(provider):
        got = nm.decode(codes, fmt)
        if fmt == "q5_1":  # a byte past 31 is no code: refused, never decoded
            for bad in (32, 200, 255):
                bits = CODES[:8].copy()
                bits[5] = bad
                with pytest.raises(ValueError, match=rf"bits\[5\] = {bad} is not a q5_1 "
                                                     r"code \(0 to 31\)"):
                    nm.decode(bits, fmt)
    assert_same_bits(got, code_values(fmt))


def c_roundf(x: float) -> float:
    """C's roundf: halves away from zero."""
    return math.copysign(math.floor(abs(x) + 0.5), x) if abs(x) < 2**23 else x


def gguf_code(v: np.ndarray, fmt: str) -> np.ndarray:
    """The value a code stands for after GGUF's rounding and clamp: roundf (Q8_0), or
    trunc of the float32 sum v + 8.5 (Q4_0, then - 8) and v + 0.5 (Q4_1, Q5_1)."""
    if fmt == "q8_0":
        return np.array([min(max(c_roundf(float(x)), -128.0), 127.0) for x in v], np.float32)
    bias, shift = (8.5, 8.0) if fmt == "q4_0" else (0.5, 0.0)
    with np.errstate(invalid="ignore"):
        codes = np.clip(np.trunc(v + np.float32(bias)), 0, 31 if fmt == "q5_1" else 15)
    return (codes - np.float32(shift)).astype(np.float32)


def encode_inputs(rng: np.random.Generator) -> np.ndarray:
    """Random values in and past the codes' range, every half and its float32 neighbours
    (an even count: the 4-bit formats take pairs)."""
    halves = np.arange(-130, 130, dtype=np.float32) + np.float32(0.5)
    near = np.concatenate([halves, np.nextafter(halves, np.float32(np.inf)),
                           np.nextafter(halves, np.float32(-np.inf)),
                           np.float32([0.0, -0.0, 0.49999997, -0.49999997, 127.0, -128.0,
                                       -8.5, 7.4999995, 15.4999995, 31.499998, 31.5, -0.5])])
    return np.concatenate([near, rng.uniform(-140, 140, 20000).astype(np.float32)])


@pytest.mark.parametrize("provider", ["native", "numpy", "reference"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_rounds_as_gguf_and_clamps_when_saturating(fmt, provider, isa):
    x = encode_inputs(np.random.default_rng(3))
    if provider == "reference":
        x = x[::7][:2000]
    want = gguf_code(x, fmt)
    f = nm.get_format(fmt)
    shaped = x.reshape(-1, 2) if f.kpack > 1 else x
    with use_provider(provider):
        bits = nm.encode(shaped, fmt, saturate=True)
        assert_same_bits(nm.decode(bits, fmt).reshape(-1), want + 0.0)
        biased = x + np.float32(f.code_bias) if f.code_bias else None
        inside = ((biased > -1) & (biased < f.max_finite - f.min_code + 1) if f.code_bias
                  else (x > -128.5) & (x < 127.5))
        if f.kpack > 1:  # both codes of a byte inside
            inside = inside.reshape(-1, 2).all(axis=1)
        np.testing.assert_array_equal(nm.encode(shaped[inside], fmt), bits[inside])


def test_encode_refuses_what_no_code_holds():
    with pytest.raises(ValueError, match=r"values\[1\] = 127\.5 as q8_0: outside the codes "
                                         r"\[-128, 127\] \(saturate=True clamps to them\)"):
        nm.encode(np.float32([1.0, 127.5]), "q8_0")
    with pytest.raises(ValueError, match=r"values\[0, 1\] = -inf"):
        nm.encode(np.float32([[0.0, -np.inf]]), "q8_0")
    with pytest.raises(ValueError, match="NaN has no code"):
        nm.encode(np.float32([np.nan]), "q8_0", saturate=True)
    with pytest.raises(ValueError, match=r"values\[0, 1\] = 7\.5 as q4_0: outside the codes "
                                         r"\[-8, 7\]"):
        nm.encode(np.float32([[0.0, 7.5]]), "q4_0")
    with pytest.raises(ValueError, match=r"q4_1 holds 2 codes a byte: values need a last axis "
                                         r"of 2, got shape \(3,\)"):
        nm.encode(np.float32([1, 2, 3]), "q4_1")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(32, 1), (64, 7), (256, 96), (96, 33)])
def test_quantize_gives_gguf_blocks_bit_for_bit(fmt, shape):
    """Codes, fp16 scales (and offsets) equal gguf.quants.quantize's, and decode equals its
    dequantize, on values of every magnitude, zero blocks and exact halves included."""
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    k, n = shape
    w = (rng.standard_normal(shape) * np.exp(rng.uniform(-12, 8, (1, n)))).astype(np.float32)
    w[:32, 0] = 0.0  # an all-zero block: d = 0
    if n > 1:
        w[:32, 1] = np.linspace(-127, 127, 32, dtype=np.float32) / 2  # halves of the step
    q = nm.Weights.quantize(w, fmt)
    assert q.scales.block == (32, 1) and q.scales.values.shape == (k // 32, n)
    blocks = gguf_blocks(w, fmt).reshape(n, k // 32, -1)
    d = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16)[..., 0]
    assert_same_bits(q.scales.values, d.T.astype(np.float32))
    if fmt == "q8_0":
        np.testing.assert_array_equal(q.bits, blocks[:, :, 2:].reshape(n, k).T)
    else:  # GGUF: byte i of a block holds codes i and i + 16; narrowmm: rows 2r and 2r + 1
        qs = blocks[:, :, -16:]
        codes = np.concatenate([qs & 15, qs >> 4], axis=2)
        if fmt == "q5_1":  # bit i of the 4 bytes after d and m: code i's fifth bit
            qh = np.ascontiguousarray(blocks[:, :, 4:8]).view("<u4")
            codes = codes | (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)
            np.testing.assert_array_equal(q.bits, codes.reshape(n, k).T)
        else:
            codes = codes.reshape(n, k).T
            np.testing.assert_array_equal(q.bits, codes[0::2] | (codes[1::2] << 4))
    if fmt in ("q4_1", "q5_1"):
        m = np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16)[..., 0]
        assert_same_bits(q.offsets.values, m.T.astype(np.float32))
    assert_same_bits(q.decode(), gguf_values(w, fmt))


@pytest.mark.parametrize("fmt", [*FORMATS, "e4m3fn", "e5m2"])
def test_quantize_takes_a_transposed_view(fmt):
    """Weights.quantize(w.T) of a PyTorch-layout array (a column-major view) gives the
    blocks of its contiguous copy (Q8_0's codes came out column-major and were refused)."""
    v = np.random.default_rng(3).standard_normal((96, 64), dtype=np.float32)
    got = nm.Weights.quantize(v.T, fmt)
    want = nm.Weights.quantize(np.ascontiguousarray(v.T), fmt)
    assert got.bits.flags.c_contiguous
    assert np.array_equal(got.bits, want.bits)
    assert_same_bits(got.decode(), want.decode())


def test_quantize_refuses_what_gguf_cannot_store():
    w = np.full((32, 2), 1.0, np.float32)
    w[3, 1] = 1e10
    with pytest.raises(ValueError, match=r"q8_0: a block's largest magnitude 10000000000\.0 "
                                         r"makes a scale past fp16's range"):
        nm.Weights.quantize(w, "q8_0")
    with pytest.raises(ValueError, match="q4_0: a block's range makes a scale past fp16's"):
        nm.Weights.quantize(w * 1e3, "q4_0")
    with pytest.raises(ValueError, match="q4_1 stores 2 rows a byte: k must be even, got 33"):
        nm.Weights.quantize(np.ones((33, 2), np.float32), "q4_1")
    with pytest.raises(ValueError, match="q5_1: a block's range makes a scale past fp16's"):
        nm.Weights.quantize(w * 1e3, "q5_1")


def random_weights(rng, fmt: str, k: int, n: int,
                   block: tuple[int, int] = (32, 1)) -> nm.Weights:
    """Any codes, with fp16-valued scales (and offsets) as a GGUF file holds them."""
    f = nm.get_format(fmt)
    rows = k // f.kpack
    q = rng.integers(0, 1 << (f.code_bits or 8), (rows, n), dtype=np.uint64).astype(np.uint8)
    grid = (-(-k // block[0]), -(-n // block[1]))

    def fp16s():
        return (rng.standard_normal(grid) * 2.0 ** rng.integers(-20, 4, grid)).astype(
            np.float16).astype(np.float32)

    offsets = nm.Scales.blocks(fp16s(), block) if f.offsets else None
    return nm.Weights.from_bits(q, fmt, nm.Scales.blocks(fp16s(), block), offsets)


@pytest.mark.parametrize("fmt", FORMATS)
def test_matmul_equals_the_oracle_on_every_path(fmt, isa):
    """m = 1 (gemv), 2 (two-row gemv), 5 (tiles; packed, pairs of rows through the two-row
    gemv and an odd one through the gemv) and 7 (tiles), row-major and packed, with GGUF blocks
    and other block shapes (a k that is not a multiple of 32 included): the native rows and
    the NumPy provider give the reference oracle's bits."""
    rng = np.random.default_rng(5)
    for k, n, block in ((64, 29, (32, 1)), (46, 17, (32, 1)), (24, 40, (4, 8))):
        w = random_weights(rng, fmt, k, n, block)
        for m in (1, 2, 5, 7):
            assert_oracle_bits_on_every_path(rng.standard_normal((m, k)).astype(np.float32), w)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("pack", [False, True])
def test_a_layer_on_torch_weights_holds_their_scales_once(fmt, pack):
    """nm.Linear on a checkpoint's TorchWeights (a GGUF tensor) transposes or packs them, and
    their scales with them: the layer's weights keep the kernels' grid only and read the
    float32 Scales from it when asked (GridScales), so no float32 copy of the grid stays
    beside the kernels' one (float16 for packed GGUF weights). The values, the NumPy
    provider's bits and the native bits are the TorchWeights' own."""
    import tracemalloc

    rng = np.random.default_rng(9)
    k, n = 2048, 384
    w = random_weights(rng, fmt, k, n)
    tw = nm.TorchWeights(np.ascontiguousarray(w.bits.T), fmt, w.scales.transpose(),
                         None if w.offsets is None else w.offsets.transpose())
    x = rng.standard_normal((1, k)).astype(np.float32)
    tracemalloc.start()
    try:
        layer = nm.Linear(tw, pack=pack)
        y = layer(x)  # the kernels' grid is made by now either way
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    grid, _, _ = layer.weights.kernel_scales()
    float32_copy = (k // 32) * n * 4 * (2 if w.offsets is not None else 1)
    extra = kept - layer.weights.bits.nbytes - grid.nbytes - y.nbytes
    assert extra < float32_copy // 4, (extra, float32_copy)
    assert_same_bits(layer.weights.decode(), np.ascontiguousarray(tw.decode().T))
    assert_same_bits(y, nm.matmul(x, w))
    with use_provider("numpy"):
        assert_same_bits(layer(x), y)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_weights_are_the_formula_so_the_chain_is_the_only_other_rounding(fmt):
    """q * d and (q - 8) * d are exact in float32, and fma(q, d, m) one rounding of the exact
    value (q * d is exact too, so d * q + m unfused, as gguf.quants computes it, is the same
    number): decode equals the formula in float64 rounded once, and a matmul with x = e_p
    reads each weight back exactly."""
    rng = np.random.default_rng(6)
    w = random_weights(rng, fmt, 64, 40)
    codes = nm.decode(w.bits, fmt)
    if codes.ndim == 3:
        codes = np.ascontiguousarray(codes.transpose(0, 2, 1)).reshape(64, 40)
    d = np.repeat(w.scales.values.astype(np.float64), 32, axis=0)
    exact = codes.astype(np.float64) * d
    if w.offsets is not None:
        m = np.repeat(w.offsets.values.astype(np.float32), 32, axis=0)
        unfused = (codes.astype(np.float32) * np.repeat(w.scales.values, 32, axis=0)) + m
        assert_same_bits(unfused, (exact + m).astype(np.float32))
        exact = exact + m
    assert_same_bits(w.decode(), exact.astype(np.float32))
    eye = np.eye(64, dtype=np.float32)
    assert_same_bits(nm.matmul(eye, w), exact.astype(np.float32) + np.float32(0.0))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k, n", [(512, 1100), (2112, 300)])
def test_rows_batches_threads_and_layouts_give_the_same_bits(fmt, isa, k, n):
    """A row's result does not depend on the batch it is in, the thread count or the
    layout: m = 1 to 8, 16 and 40, on 1 and 2 threads, row-major and packed (on avx2, packed
    Q8_0, Q4_0 and Q4_1 at m = 3 to 8 take the four-row walks: fours, three rows as a four on
    copies, pairs), on a matrix large enough to be split across threads. k = 2112 makes
    every row's packed slivers longer than 24 KiB (the frame's long slivers: other chunks of
    slivers at m = 1, no prefetch), and its 300 columns end in a partial chunk and a partial
    sliver."""
    rng = np.random.default_rng(7)
    w = nm.Weights.quantize((rng.standard_normal((k, n)) * 0.05).astype(np.float32), fmt)
    packed = w.pack()
    x = rng.standard_normal((40, k)).astype(np.float32)
    before = nm.get_num_threads()
    nm.set_num_threads(1)
    alone = np.concatenate([nm.matmul(x[i:i + 1], w) for i in range(40)])
    try:
        for threads in (1, 2):
            nm.set_num_threads(threads)
            for m in (1, 2, 3, 4, 5, 6, 7, 8, 16, 40):
                assert_same_bits(nm.matmul(x[:m], w), alone[:m])
                assert_same_bits(nm.matmul(x[:m], packed), alone[:m])
    finally:
        nm.set_num_threads(before)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_native_kernels_serve_them_on_every_row(fmt, isa):
    """No call falls back to a slower provider, and the row names its own kernels."""
    code = nm.get_format(fmt).code
    names = core().kernel_names("matmul", code) + core().kernel_names("matmul_packed", code)
    assert names and all(fmt in name or name.startswith("ukernel_") for name in names), names
    served = {(e["op"], e["format"]): e for e in nm.runtime_info()["kernels"]}
    for op in ("matmul", "encode", "decode"):
        assert served[(op, fmt)]["provider"] == "native"
    assert "finite_kernel" not in served[("matmul", fmt)]  # every code is finite


def test_4bit_weights_refuse_odd_rows_blocks_and_missing_offsets():
    bits = np.zeros((2, 3), np.uint8)
    with pytest.raises(ValueError, match="q4_1 weights need their offsets"):
        nm.Weights.from_bits(bits, "q4_1")
    with pytest.raises(ValueError, match="format 'q4_0' takes no offsets"):
        nm.Weights.from_bits(bits, "q4_0", offsets=nm.Scales.tensor(0.0))
    with pytest.raises(ValueError, match="blocks of scales must hold a multiple of 2 rows, "
                                         "got 1"):
        nm.Weights.from_bits(bits, "q4_0", nm.Scales.blocks(np.ones((4, 3)), (1, 1)))
    with pytest.raises(ValueError, match=r"offsets in blocks of \(0, 0\) do not match the "
                                         r"scales' \(2, 1\)"):
        nm.Weights.from_bits(bits, "q4_1", nm.Scales.blocks(np.ones((2, 3)), (2, 1)),
                             nm.Scales.tensor(0.0))
    with pytest.raises(ValueError, match=r"bits\[1, 2\] = 32 is not a q5_1 code \(0 to 31\)"):
        nm.Weights.from_bits(np.uint8([[0, 1, 31], [0, 0, 32]]), "q5_1",
                             nm.Scales.tensor(1.0), nm.Scales.tensor(0.0))
    with pytest.raises(ValueError, match=r"bits\[0, 1\] = 255 is not a q5_1 code"):
        nm.TorchWeights(np.int8([[0, -1]]), "q5_1", nm.Scales.tensor(1.0), nm.Scales.tensor(0.0))
    with pytest.raises(ValueError, match="q5_1 weights need their offsets"):
        nm.Weights.from_bits(bits, "q5_1")
    w = nm.Weights.from_bits(bits, "q4_0")
    assert w.shape == (4, 3) and nm.TorchWeights(bits, "q4_0").shape == (2, 6)
    with pytest.raises(ValueError, match=r"x has 3 columns but the weights have k=4 rows"):
        nm.matmul(np.ones((1, 3), np.float32), w)


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_layer_quantizes_to_gguf_blocks(fmt):
    torch = require("torch")
    import narrowmm.torch as nmt

    lin = torch.nn.Linear(64, 40, bias=True)
    w = nm.Weights.quantize(np.ascontiguousarray(lin.weight.detach().numpy().T), fmt)
    x = torch.randn(3, 64)
    for pack in (True, False):
        layer = nmt.Linear.from_torch(lin, fmt, pack=pack)
        with torch.inference_mode():
            got = layer(x).numpy()
        assert_same_bits(got, nm.matmul(x.numpy(), w, bias=lin.bias.detach().numpy()))


# ---- binary16 grids of scales (Format.half_scales) ------------------------------------------

HALF = ["q8_0", "q4_0", "q4_1", "q5_1"]


@pytest.mark.parametrize("fmt", HALF)
@pytest.mark.parametrize("k, n", [(512, 300), (2112, 300)])
def test_binary16_and_float32_grids_give_the_same_bits(fmt, isa, k, n):
    """GGUF's scales (and Q4_1's offsets) are binary16 numbers, so packed weights give the
    kernels a float16 grid (the packed gemvs read it as it is, the frame widens it for the
    tiles; a caller may pass one for row-major weights too, widened for their gemvs): the
    same bits as the float32 grid of the same values, at m = 1, 2, 3 and 16, row-major and
    packed, on 1 and 2 threads; k = 512 walks short slivers (a 4-bit format's prefetch, a
    call per block), 2112 long ones."""
    c = core()
    code = nm.get_format(fmt).code
    rng = np.random.default_rng(8)
    w = nm.Weights.quantize((rng.standard_normal((k, n)) * 0.05).astype(np.float32), fmt)
    packed = w.pack()
    x = rng.standard_normal((16, k)).astype(np.float32)
    before = nm.get_num_threads()
    try:
        for threads in (1, 2):
            nm.set_num_threads(threads)
            for m in (1, 2, 3, 16):
                for weights in (w, packed):
                    ld = packed.bits.shape[0] * packed.width if weights is packed else n
                    g16, bk, finite = weights.kernel_scales(ld)
                    assert g16.dtype == (np.float16 if weights is packed else np.float32)
                    g16 = g16.astype(np.float16)  # exact: GGUF's scales
                    got = {}
                    for grid in (g16, g16.astype(np.float32)):
                        out = np.empty((m, n), np.float32)
                        if weights is packed:
                            c.matmul_packed(code, x[:m], packed.sliver_rows, n, out, False,
                                            grid, bk, finite)
                        else:
                            c.matmul(code, x[:m], w.bits, out, False, grid, bk, finite)
                        got[grid.dtype] = out
                    assert_same_bits(got[np.dtype(np.float16)], got[np.dtype(np.float32)])
    finally:
        nm.set_num_threads(before)


@pytest.mark.parametrize("fmt", HALF)
def test_scales_that_are_not_binary16_keep_a_float32_grid(fmt, isa):
    """A scale or offset off binary16's numbers (the exact K-type conversions' d * sc, or a
    user's own) keeps the float32 grid, and the oracle's bits."""
    rng = np.random.default_rng(9)
    f = nm.get_format(fmt)
    q = rng.integers(0, 1 << (f.code_bits or 8), (64 // f.kpack, 40), dtype=np.uint8)
    scales = nm.Scales.blocks(np.full((1, 40), 0.1, np.float32), (64, 1))
    offsets = nm.Scales.blocks(np.full((1, 40), 0.5, np.float32), (64, 1))
    w = nm.Weights.from_bits(q, fmt, scales, offsets if f.offsets else None)
    assert w.kernel_scales(40)[0].dtype == np.float32
    assert w.pack().kernel_scales()[0].dtype == np.float32
    for m in (1, 2, 5):
        assert_oracle_bits_on_every_path(rng.standard_normal((m, 64)).astype(np.float32), w)


def test_binary16_grids_only_where_the_format_takes_them():
    c = core()
    x = np.ones((1, 32), np.float32)
    out = np.empty((1, 8), np.float32)
    with pytest.raises(TypeError, match="format 'e4m3fn' takes float32 scales, not float16"):
        c.matmul(nm.get_format("e4m3fn").code, x, np.zeros((32, 8), np.uint8), out, False,
                 np.ones((1, 8), np.float16), 32, True)
    with pytest.raises(TypeError, match="scales must be a 2-D aligned float32 or float16 "
                                        "array"):
        c.matmul(nm.get_format("q4_0").code, x, np.zeros((16, 8), np.uint8), out, False,
                 np.ones((1, 8), np.float64), 32, True)


def test_torch_layer_keeps_its_binary16_grid_through_dtype_casts():
    """narrowmm.torch.Linear stores a float16 grid as int16 bits, so module.float() or
    .to(bfloat16), which cast floating buffers, leave it (and the bits) alone."""
    torch = require("torch")
    import narrowmm.torch as nmt

    lin = torch.nn.Linear(64, 40, bias=False)
    x = torch.randn(2, 64)
    for fmt in HALF:
        layer = nmt.Linear.from_torch(lin, fmt)
        assert layer.weight_scales.dtype == torch.int16
        with torch.inference_mode():
            want = layer(x)
            layer.float()
            layer.to(torch.bfloat16)
            assert layer.weight_scales.dtype == torch.int16
            assert_same_bits(layer(x).numpy(), want.numpy())


def test_torch_layer_keeps_its_float32_grid_through_dtype_casts():
    """A float32 grid (Q4_K's exact d * sc row-major, FP8's scales) is stored as its int32
    bits, a factored one (Q4_K's, packed) as its int8 array: module.half() and
    .to(bfloat16), which would round a float32 buffer, leave either alone, and the layer
    gives its bits (rounded back to the input's dtype) after them. Before, half() made
    Q4_K's grid float16 and the weights silently wrong."""
    torch = require("torch")
    import narrowmm.torch as nmt
    from narrowmm.checkpoints import _gguf_blocks

    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, (40, 1, 144), dtype=np.uint8)
    for at in _gguf_blocks.FP16_FIELDS["Q4_K"]:
        blocks[:, :, at:at + 2] = np.frombuffer(np.float16(0.0123).tobytes(), np.uint8)
    q4_k = _gguf_blocks.as_torch_weights(_gguf_blocks.convert("Q4_K", blocks))
    layers = [nmt.Linear.from_weights(q4_k, pack=pack) for pack in (True, False)]
    layers.append(nmt.Linear.from_torch(torch.nn.Linear(256, 40, bias=False), "e4m3fn"))
    x = torch.randn(3, 256).half().float()  # float16 values: the half layer's input
    for layer, stored in zip(layers, (torch.int8, torch.int32, torch.int32), strict=True):
        assert layer.weight_scales.dtype == stored
        with torch.inference_mode():
            want = layer(x)
            for cast in (torch.nn.Module.half, lambda m: m.to(torch.bfloat16),
                         torch.nn.Module.float):
                cast(layer)
                assert layer.weight_scales.dtype == stored
                assert_same_bits(layer(x).numpy(), want.numpy())
            layer.half()
            assert torch.equal(layer(x.half()), want.half())


def test_torch_layer_buffers_start_on_a_cache_line():
    """narrowmm.torch.Linear holds packed codes and the kernels' grid as Weights made them
    (pack_slivers, kernel_scales): from a 64-byte line, which the kernels' scale loads need
    to stay inside one line each (tests/test_packed.py)."""
    torch = require("torch")
    import narrowmm.torch as nmt

    for n in (40, 41, 97):
        lin = torch.nn.Linear(64, n, bias=False)
        for fmt in HALF:
            for pack in (False, True):
                layer = nmt.Linear.from_torch(lin, fmt, pack=pack)
                assert layer.weight_scales.data_ptr() % 64 == 0, (fmt, n, pack)
                if pack:
                    assert layer.weight_bits.data_ptr() % 64 == 0, (fmt, n)


@pytest.mark.parametrize("fmt", ["q5_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl",
                                 "iq4_xs"])
def test_the_bench_times_the_gguf_block_types_as_a_file_loads_them(fmt):
    """`narrowmm bench --format q4_k` (and the other converted types) times random blocks of
    the GGUF type as load_gguf converts them: the weights it builds are GGUF's dequantized
    values bit for bit, in the narrowmm format the type runs as, and they multiply on every
    path."""
    from narrowmm.bench.kernels import gguf_converted_weights, random_blocks
    from narrowmm.bench.results import GGUF_CONVERTED_FORMATS

    ggml, runs_as = GGUF_CONVERTED_FORMATS[fmt]
    k, n = 512, 40
    blocks = random_blocks(k, n, fmt, np.random.default_rng(7))
    w = gguf_converted_weights(k, n, fmt, np.random.default_rng(7))
    assert w.format.name == runs_as and w.shape == (k, n)
    want = gguf_quants.dequantize(blocks.reshape(n, -1), gguf.GGMLQuantizationType[ggml]).T
    assert_same_bits(w.decode(), np.ascontiguousarray(want, np.float32))
    assert np.isfinite(want).all() and (want != 0).any()


@pytest.mark.parametrize("fmt,bk,half", [("q4_1", 32, False), ("q4_0", 32, True),
                                         ("q8_0", 16, False), ("q5_1", 32, True),
                                         ("e4m3fn", 64, False)])
def test_packed_grids_are_sliver_major_and_give_the_row_major_bits(isa, fmt, bk, half):
    """Packed weights hand the kernels their grid sliver-major (each sliver's blocks in a
    row, nm_scales.lsl), the same values as the row-major grid; the native core gives the
    same bits with either, at m = 1, 2 (the walks that stream it) and 5 (the tiles), on 1
    and 2 threads; the binding refuses a sliver-major grid that does not fit."""
    from narrowmm._weights import row_major

    rng = np.random.default_rng(12)
    f = nm.get_format(fmt)
    k, n = 192, 100  # 4 slivers of 32 (avx512; avx2 5 of 24; scalar's), the last partial
    q = rng.integers(0, 1 << (f.code_bits or 8), (k // f.kpack, n), dtype=np.uint8)
    if f.special_bits:
        q &= np.uint8(0x77)  # no NaN codes: the values below compare with ==
    grid = rng.integers(1, 2048, (k // bk, n)).astype(np.float32) * np.float32(2.0**-14)
    if not half:
        grid *= np.float32(37.0)  # off binary16's numbers: a float32 grid, as Q4_K's d * sc
    scales = nm.Scales(grid, (bk, 1))
    offsets = nm.Scales(-grid * np.float32(2.0), (bk, 1)) if f.offsets else None
    w = nm.Weights.from_bits(q, fmt, scales, offsets)
    with use_isa(isa):
        p = w.pack()
        got, got_bk, finite = p.kernel_scales()
        grids, slivers, blocks = 2 if f.offsets else 1, p.bits.shape[0], k // bk
        assert got.shape == (grids * slivers, blocks, p.width) and got_bk == bk
        assert got.dtype == (np.float16 if half and f.half_scales else np.float32)
        rows, _, _ = w.kernel_scales(slivers * p.width)  # row-major: float32, times 2^r
        assert_same_bits(row_major(got.astype(np.float32), grids), rows)
        t, b, j = slivers - 1, blocks - 1, (n - 1) % p.width  # the last real column
        assert got[t, b, j] == rows[b, n - 1]
        with pytest.raises(ValueError, match="not ld=7"):
            p.kernel_scales(7)
        c = core()
        x = rng.standard_normal((5, k)).astype(np.float32)
        before = nm.get_num_threads()
        try:
            for threads in (1, 2):
                nm.set_num_threads(threads)
                for m in (1, 2, 5):
                    outs = []
                    for g in (got, rows):
                        out = np.empty((m, n), np.float32)
                        c.matmul_packed(f.code, x[:m], p.sliver_rows, n, out, False, g, bk,
                                        finite)
                        outs.append(out)
                    assert_same_bits(outs[0], outs[1])
                    assert_same_bits(outs[0], nm.matmul(x[:m], w))
        finally:
            nm.set_num_threads(before)
        out = np.empty((1, n), np.float32)
        for bad in (got[:, :-1], got.reshape(grids * slivers, -1, p.width * 2)
                    if blocks % 2 == 0 else got[:, :, :-1], got[grids:]):
            with pytest.raises(ValueError, match="do not cover"):
                c.matmul_packed(f.code, x[:1], p.sliver_rows, n, out, False,
                                np.ascontiguousarray(bad), bk, finite)
        with pytest.raises(TypeError, match="2-D"):  # row-major weights: a 2-D grid only
            c.matmul(f.code, x[:1], w.bits, out, False, got, bk, finite)


# ---- factored grids: GGUF's K types on packed weights ------------------------------------

@pytest.mark.parametrize("type_name", sorted(K_BLOCK_BYTES))
def test_k_types_packed_keep_a_factored_grid_and_the_oracle_bits(type_name, isa):
    """Packed weights of the K types (d * sc per block: no binary16 numbers) keep their
    scales as an int8 code a block and a float32 factor per 256 rows (factored_grid, then
    sliver-major as their codes): a Q4_K weight 0.59 bytes where a float32 grid made it
    0.75, a Q6_K one 1.08 where it was 1.25. The frame multiplies the codes out for the
    tiles, the avx2 row's m = 2 and m == 4 walks and the other rows' m <= 2 ones; the avx2
    and avx512 rows walk the codes themselves at m = 1, the avx512 row at m = 2 to 6 too (in
    pairs); the weights are the same, so are the bits: against the reference oracle, at m = 1
    to 5, 7, 8 and 16, on 1 and 2 threads, from TorchWeights.pack() (what from_gguf
    holds) and Weights.pack()."""
    k, n = 1280, 72  # k past two of the walks' chunks of NM_FACTORED_CHUNK_ROWS
    tw = k_type_weights(type_name, k, n, seed=sum(map(ord, type_name)))
    w = tw.transpose()
    packed = tw.pack()
    grid, bk, _ = packed.kernel_scales()  # sliver-major: (parts * slivers, rows, width)
    assert grid.dtype == np.int8 and grid.ndim == 3 and grid.ctypes.data % 64 == 0
    parts = 2 if w.format.offsets else 1
    per_weight = grid.nbytes / (k * grid.shape[0] // parts * grid.shape[2])
    assert per_weight == parts * (4 / 256 + 1 / bk)  # a float per 256 rows, a byte per block
    float32 = w.kernel_scales()[0]
    assert float32.dtype == np.float32 and float32.nbytes / (k * n) == parts * 4 / bk
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, k)).astype(np.float32)
    with use_provider("reference"):  # the pure-Python chain, on two rows (it is slow)
        oracle = nm.matmul(x[:2], w)
    before = nm.get_num_threads()
    try:
        for threads in (1, 2):
            nm.set_num_threads(threads)
            for m in (1, 2, 3, 4, 5, 7, 8, 16):
                with use_provider("numpy"):  # the same chain, as the oracle's bits show
                    want = nm.matmul(x[:m], w)
                assert_same_bits(want[:2], oracle[:min(m, 2)])
                assert_same_bits(nm.matmul(x[:m], packed), want)
                assert_same_bits(nm.matmul(x[:m], w.pack()), want)
                assert_same_bits(nm.matmul(x[:m], w), want)
    finally:
        nm.set_num_threads(before)


def factor_cases(rng):
    """(grid, grids, per_super) whose values all factor: Q4_K-like d * sc with mins below,
    Q6_K-like d * int8 with -128 codes and d < 0, an all-zero super-block, -0s under d < 0."""
    d = rng.uniform(1e-3, 1e-1, (2, 3, 1, 40)).astype(np.float16).astype(np.float32)
    yield (d * rng.integers(0, 64, (2, 3, 8, 40))).astype(np.float32).reshape(48, 40), 2, 8
    d6 = rng.uniform(-1e-3, 1e-3, (1, 2, 1, 40)).astype(np.float16).astype(np.float32)
    q = rng.integers(-128, 128, (1, 2, 16, 40))
    q[:, :, 0, :3] = -128
    yield (d6 * q).astype(np.float32).reshape(32, 40), 1, 16
    zero = (d * rng.integers(1, 64, (2, 3, 8, 40))).astype(np.float32)
    zero[0, 1] = 0.0
    zero[1, 2, :, 5] = -0.0
    yield zero.reshape(48, 40), 2, 8


def test_factored_grid_is_the_grid_bit_for_bit_or_none():
    """factored_grid keeps a grid only as factors and codes whose float32 product is each
    value, its bits (a -0 too); anything else gets None and stays float32."""
    from narrowmm._weights import factored_grid, factored_values

    rng = np.random.default_rng(11)
    for grid, grids, per_super in factor_cases(rng):
        f = factored_grid(grid, grids, per_super)
        assert f is not None and f.dtype == np.int8 and f.ctypes.data % 64 == 0
        assert_same_bits(factored_values(f, grids, grid.shape[0] // grids), grid)
        cols = np.array([3, 0, 5, 39])
        assert_same_bits(factored_values(f, grids, grid.shape[0] // grids, cols), grid[:, cols])
    grid, grids, per_super = next(factor_cases(np.random.default_rng(11)))
    for bad in (np.float32(1.2345678), np.float32(np.inf)):  # 24 significant bits; no number
        g = grid.copy()
        g[9, 4] = bad
        assert factored_grid(g, grids, per_super) is None
    g = grid.copy()
    g[0, 4], g[1, 4] = 0.0, -0.0  # both zeros' signs in one super-block: no factor's sign
    assert factored_grid(g, grids, per_super) is None
    g = grid.copy()
    g[0, 4], g[1, 4] = 1.0, 1.0 + 2.0 ** -10  # codes 1024 and 1025 apart: past int8
    assert factored_grid(g, grids, per_super) is None
    assert factored_grid(grid[:40], grids, per_super) is None  # blocks no multiple of 8
    assert factored_grid(grid, grids, 1) is None


def test_factored_grids_refuse_shapes_that_do_not_cover_k():
    """The binding's checks of an int8 grid: float-aligned, 2-D (or 3-D for packed
    weights), its rows grids * (4 * supers + blocks) with blocks a multiple of supers, at
    least n columns: a ValueError naming the shape it wanted, never a read past the
    array."""
    from narrowmm._weights import factored_grid

    c = core()
    rng = np.random.default_rng(12)
    grid, grids, per_super = next(factor_cases(rng))  # q4_1-shaped: 2 grids, 24 blocks
    f = factored_grid(grid, grids, per_super)
    k, n = 24 * 32, 40
    x = rng.standard_normal((1, k)).astype(np.float32)
    q = rng.integers(0, 256, (k // 2, n), dtype=np.uint8)
    out = np.empty((1, n), np.float32)
    code = nm.get_format("q4_1").code
    c.matmul(code, x, q, out, False, f, 32, True)
    with use_provider("numpy"):
        want = nm.matmul(x, nm.Weights.from_bits(q, "q4_1", nm.Scales.blocks(grid[:24], (32, 1)),
                                                 nm.Scales.blocks(grid[24:], (32, 1))))
    assert_same_bits(out, want)
    for bad, bk in ((f[:-1], 32), (f, 128), (f, 16), (f.reshape(-1), 32), (np.int8(3), 32),
                    (f.reshape(2, 36, 40), 32),  # 3-D: only for packed weights
                    (np.zeros((2 * (4 * 5 + 24), n), np.int8), 32)):  # 24 blocks, 5 supers
        blocks = -(-k // bk)
        with pytest.raises(ValueError, match=r"a factored \(int8\) grid must be float-aligned, "
                                             rf"2-D \(2 \* \(4 \* supers \+ {blocks}\), >= 40\), "):
            c.matmul(code, x, q, out, False, bad, bk, True)
    wide = np.zeros((k // 2, n + 8), np.uint8)  # more columns than the grid holds
    with pytest.raises(ValueError, match=r">= 48\), .*got 2-D, shape \(72, 40, ...\)"):
        c.matmul(code, x, wide, np.empty((1, n + 8), np.float32), False, f, 32, True)
    raw = np.zeros(f.size + 1, np.int8)[1:].reshape(f.shape)  # off a float's alignment
    with pytest.raises(ValueError, match="float-aligned"):
        c.matmul(code, x, q, out, False, raw, 32, True)


def test_factored_scales_can_be_turned_off_by_name(monkeypatch):
    """NARROWMM_FACTORED_SCALES=0 keeps the K types' float32 grids (more bytes, the same
    bits); any value but 0 or 1 is refused by name when a grid is made, and shown by
    narrowmm's runtime report without breaking it."""
    tw = k_type_weights("Q4_K", 256, 40, seed=2)
    x = np.random.default_rng(4).standard_normal((3, 256)).astype(np.float32)
    want = nm.matmul(x, tw.transpose())
    monkeypatch.setenv("NARROWMM_FACTORED_SCALES", "0")
    packed = tw.pack()
    assert packed.kernel_scales()[0].dtype == np.float32
    assert_same_bits(nm.matmul(x, packed), want)
    assert nm.runtime_info()["factored_scales_enabled"] is False
    monkeypatch.setenv("NARROWMM_FACTORED_SCALES", "yes")
    with pytest.raises(nm.EnvironmentVariableError, match="NARROWMM_FACTORED_SCALES must be 1"):
        tw.pack()
    info = nm.runtime_info()
    assert info["factored_scales_enabled"] is None
    assert "NARROWMM_FACTORED_SCALES" in info["environment_problems"]
    monkeypatch.setenv("NARROWMM_FACTORED_SCALES", "1")
    assert tw.pack().kernel_scales()[0].dtype == np.int8
    assert nm.runtime_info()["factored_scales_enabled"] is True
    assert "NARROWMM_FACTORED_SCALES" not in nm.runtime_info()["environment_problems"]
