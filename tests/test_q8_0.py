"""GGUF's Q8_0 as a narrowmm format: int8 codes with a float32 scale per 32 input features.

The contract (docs/contracts.md): weight (p, j) is fl32(q[p, j] * d) with d the block's
scale (fp16 in a GGUF file, exact in float32), so the product is exact; then the usual fma
chain over p ascending. ``gguf.quants`` (the GGUF project's NumPy implementation) is the
outside oracle for the quantizer and the decode; the reference provider for the chain."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_oracle_bits_on_every_path, assert_same_bits, require

import narrowmm as nm
from narrowmm.providers import use_provider
from narrowmm.providers.native import core

gguf_quants = require("gguf.quants")
GGML_Q8_0 = require("gguf").GGMLQuantizationType.Q8_0
CODES = np.arange(256, dtype=np.uint8)


def gguf_blocks(values: np.ndarray) -> np.ndarray:
    """GGUF's Q8_0 blocks of a (k, n) matrix, as a file stores it: PyTorch's (n, k) rows,
    each (k / 32) blocks of fp16 d and 32 int8 codes."""
    return gguf_quants.quantize(np.ascontiguousarray(values.T), GGML_Q8_0)


def test_the_q8_0_row_of_the_format_table():
    f = nm.get_format("q8_0")
    assert (f.code, f.itemsize, f.scaled, f.scale_exponent, f.integer) == (5, 1, True, 0, True)
    assert (f.max_finite, f.min_code, f.gguf_block, f.special_bits) == (127.0, -128.0, 32, 0)
    c_rows = {name: (code, size, scaled) for code, name, size, scaled, _ in core().formats()}
    assert c_rows["q8_0"] == (5, 1, 1)


@pytest.mark.parametrize("provider", ["native", "numpy", "reference"])
def test_all_256_codes_decode_to_their_integer(provider, isa):
    with use_provider(provider):
        got = nm.decode(CODES, "q8_0")
    assert_same_bits(got, CODES.view(np.int8).astype(np.float32))


def c_roundf(x: float) -> float:
    """C's roundf: halves away from zero."""
    return math.copysign(math.floor(abs(x) + 0.5), x) if abs(x) < 2**23 else x


def encode_inputs(rng: np.random.Generator) -> np.ndarray:
    """Random values in and past the codes' range, every half and its float32 neighbours."""
    halves = np.arange(-130, 130, dtype=np.float32) + np.float32(0.5)
    near = np.concatenate([halves, np.nextafter(halves, np.float32(np.inf)),
                           np.nextafter(halves, np.float32(-np.inf)),
                           np.float32([0.0, -0.0, 0.49999997, -0.49999997, 127.0, -128.0])])
    rand = rng.uniform(-140, 140, 20000).astype(np.float32)
    return np.concatenate([near, rand])


@pytest.mark.parametrize("provider", ["native", "numpy", "reference"])
def test_encode_rounds_halves_away_from_zero_and_clamps_when_saturating(provider, isa):
    x = encode_inputs(np.random.default_rng(3))
    if provider == "reference":
        x = x[::7]
    want = np.array([min(max(c_roundf(float(v)), -128.0), 127.0) for v in x], np.float32)
    with use_provider(provider):
        got = nm.encode(x, "q8_0", saturate=True)
        assert_same_bits(got.view(np.int8).astype(np.float32), want + 0.0)
        inside = (x > -128.5) & (x < 127.5)
        np.testing.assert_array_equal(nm.encode(x[inside], "q8_0"), got[inside])
        sat = nm.encode(np.float32([np.inf, -np.inf, 1e30, -1e30]), "q8_0", saturate=True)
        np.testing.assert_array_equal(sat.view(np.int8), [127, -128, 127, -128])


def test_encode_refuses_what_no_code_holds():
    with pytest.raises(ValueError, match=r"values\[1\] = 127\.5 as q8_0: outside the codes "
                                         r"\[-128, 127\] \(saturate=True clamps to them\)"):
        nm.encode(np.float32([1.0, 127.5]), "q8_0")
    with pytest.raises(ValueError, match=r"values\[0, 1\] = -inf"):
        nm.encode(np.float32([[0.0, -np.inf]]), "q8_0")
    with pytest.raises(ValueError, match="NaN has no code"):
        nm.encode(np.float32([np.nan]), "q8_0", saturate=True)


@pytest.mark.parametrize("shape", [(32, 1), (64, 7), (256, 96), (96, 33)])
def test_quantize_gives_gguf_blocks_bit_for_bit(shape):
    """Codes and fp16 scales equal gguf.quants.quantize's, and decode equals its
    dequantize, on values of every magnitude, zero blocks and exact halves included."""
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    k, n = shape
    w = (rng.standard_normal(shape) * np.exp(rng.uniform(-12, 8, (1, n)))).astype(np.float32)
    w[:32, 0] = 0.0  # an all-zero block: d = 0, every code 0
    if n > 1:
        w[:32, 1] = np.linspace(-127, 127, 32, dtype=np.float32) / 2  # halves of the step
    q = nm.Weights.quantize(w, "q8_0")
    assert q.scales.block == (32, 1) and q.scales.values.shape == (k // 32, n)
    blocks = gguf_blocks(w).reshape(n, k // 32, 34)
    d = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16)[..., 0]
    codes = blocks[:, :, 2:].reshape(n, k)
    np.testing.assert_array_equal(q.bits, codes.T)
    assert_same_bits(q.scales.values, d.T.astype(np.float32))
    want = gguf_quants.dequantize(gguf_blocks(w), GGML_Q8_0)
    assert_same_bits(q.decode(), np.ascontiguousarray(want.T))


def test_quantize_refuses_a_scale_past_fp16():
    w = np.full((32, 2), 1.0, np.float32)
    w[3, 1] = 1e10
    with pytest.raises(ValueError, match=r"q8_0: a block's largest magnitude 10000000000\.0 "
                                         r"makes a scale past fp16's range"):
        nm.Weights.quantize(w, "q8_0")


def random_q8_0(rng, k: int, n: int, block: tuple[int, int] = (32, 1)) -> nm.Weights:
    """Any codes, -128 included, with fp16-valued scales as a GGUF file holds them."""
    q = rng.integers(0, 256, (k, n), dtype=np.uint64).astype(np.uint8)
    grid = (-(-k // block[0]), -(-n // block[1]))
    d = (rng.standard_normal(grid) * 2.0 ** rng.integers(-20, 4, grid)).astype(np.float16)
    return nm.Weights.from_bits(q, "q8_0", nm.Scales.blocks(d.astype(np.float32), block))


def test_matmul_equals_the_oracle_on_every_path(isa):
    """m = 1 (gemv), 2 (two-row gemv), 5 (tiles), row-major and packed, with GGUF blocks
    and other block shapes (k not a multiple of 32 included): the native rows and the NumPy
    provider give the reference oracle's bits."""
    rng = np.random.default_rng(5)
    for k, n, block in ((64, 29, (32, 1)), (45, 17, (32, 1)), (23, 40, (4, 8))):
        w = random_q8_0(rng, k, n, block)
        for m in (1, 2, 5):
            assert_oracle_bits_on_every_path(rng.standard_normal((m, k)).astype(np.float32), w)


def test_the_weights_are_exact_products_so_the_chain_is_the_only_rounding():
    """q * d is exact in float32 (8 + 11 significant bits): decode equals the float64
    product, and a matmul with x = e_p reads the weights back exactly."""
    rng = np.random.default_rng(6)
    w = random_q8_0(rng, 64, 40)
    exact = (w.bits.view(np.int8).astype(np.float64)
             * np.repeat(w.scales.values.astype(np.float64), 32, axis=0))
    assert_same_bits(w.decode(), exact.astype(np.float32))
    eye = np.eye(64, dtype=np.float32)
    assert_same_bits(nm.matmul(eye, w), exact.astype(np.float32) + np.float32(0.0))


def test_rows_batches_threads_and_layouts_give_the_same_bits(isa):
    """A row's result does not depend on the batch it is in, the thread count or the
    layout: m = 1, 2, 3, 16 and 40, on 1 and 2 threads, row-major and packed, on a matrix
    large enough to be split across threads."""
    rng = np.random.default_rng(7)
    k, n = 512, 1100
    w = nm.Weights.quantize((rng.standard_normal((k, n)) * 0.05).astype(np.float32), "q8_0")
    packed = w.pack()
    x = rng.standard_normal((40, k)).astype(np.float32)
    before = nm.get_num_threads()
    nm.set_num_threads(1)
    alone = np.concatenate([nm.matmul(x[i:i + 1], w) for i in range(40)])
    try:
        for threads in (1, 2):
            nm.set_num_threads(threads)
            for m in (1, 2, 3, 16, 40):
                assert_same_bits(nm.matmul(x[:m], w), alone[:m])
                assert_same_bits(nm.matmul(x[:m], packed), alone[:m])
    finally:
        nm.set_num_threads(before)


def test_the_native_kernels_serve_q8_0_on_every_row(isa):
    """No q8_0 call falls back to a slower provider, and the row names its own kernels."""
    names = core().kernel_names("matmul", 5) + core().kernel_names("matmul_packed", 5)
    assert names and all(name.endswith("_" + isa) or "ukernel_" in name or name.startswith(
        ("pack_q8_0_scalar", "ukernel_pack_q8_0_scalar")) for name in names), names
    assert any("q8_0" in name for name in names)
    served = {(e["op"], e["format"]): e for e in nm.runtime_info()["kernels"]}
    for op in ("matmul", "encode", "decode"):
        assert served[(op, "q8_0")]["provider"] == "native"
    assert "q8_0" in served[("matmul", "q8_0")]["kernel"]
    assert "finite_kernel" not in served[("matmul", "q8_0")]  # every code is finite


def test_torch_layer_quantizes_to_gguf_blocks():
    torch = require("torch")
    import narrowmm.torch as nmt

    lin = torch.nn.Linear(64, 40, bias=True)
    layer = nmt.Linear.from_torch(lin, "q8_0")
    w = nm.Weights.quantize(np.ascontiguousarray(lin.weight.detach().numpy().T), "q8_0")
    x = torch.randn(3, 64)
    with torch.inference_mode():
        got = layer(x).numpy()
    assert_same_bits(got, nm.matmul(x.numpy(), w, bias=lin.bias.detach().numpy()))
