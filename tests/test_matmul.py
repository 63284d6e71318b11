"""matmul: every provider and path gives the contract's bits."""

import numpy as np
import pytest
from conftest import ALL_FORMATS, NARROW, PROVIDERS, assert_same_bits, random_weights

import narrowmm as nm

# every test here runs on every ISA row the CPU supports
pytestmark = pytest.mark.usefixtures("isa")

ALL16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)


def matmul_with(provider, *args, **kwargs):
    with nm.use_provider(provider):
        return nm.matmul(*args, **kwargs)


@pytest.mark.parametrize("fmt", NARROW)
@pytest.mark.parametrize("m", [1, 2, 5])
def test_kernel_sweep_all_patterns_times_one(fmt, m):
    """All 65,536 weight patterns times 1.0 into a zeroed C equal the decoded weights
    (fma(1, w, +0) turns -0 into +0). m = 1 and m = 2 stream (the gemv, the two-row gemv);
    m = 5 takes the tiled path. The extra rows are weighted 0."""
    x = np.zeros((m, 1), np.float32)
    x[0, 0] = 1.0
    got = nm.matmul(x, nm.Weights.from_bits(ALL16[None, :], fmt))
    want = nm.decode(ALL16, fmt) + np.float32(0.0)
    assert_same_bits(got[0], want)
    for i in range(1, m):
        zeros = np.zeros(65536, np.float32)
        nan_weight = np.isnan(want) | np.isinf(want)  # 0 * Inf is NaN
        zeros[nan_weight] = np.nan
        assert_same_bits(got[i], zeros)


def test_f32_sweep_all_exponents(rng):
    # every float32 exponent and sign once, with random mantissas, times 1.0
    words = ((np.arange(512, dtype=np.uint32) << 23)
             | rng.integers(0, 1 << 23, 512).astype(np.uint32))
    w = words.view(np.float32)[None, :]
    for m in (1, 3):
        x = np.zeros((m, 1), np.float32)
        x[0, 0] = 1
        with np.errstate(invalid="ignore"):
            want = w[0] + np.float32(0)
        assert_same_bits(nm.matmul(x, w)[0], want)


SPECIAL = np.array([0.0, -0.0, 2.0**-24, -(2.0**-24), 6.0975552e-5, -6.0975552e-5,
                    2.0**-14, 65504.0, -65504.0, 1.0, -1.0, 0.5, -0.25, np.inf, -np.inf],
                   np.float32)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_special_weights_match_reference(fmt, rng):
    k, n = SPECIAL.size, 5
    w = nm.Weights.encode(np.repeat(SPECIAL[:, None], n, axis=1), fmt)
    x = np.where(np.arange(2 * k).reshape(2, k) % 3 == 0, 1.0, 0.5).astype(np.float32)
    ref = matmul_with("reference", x, w)
    for provider in ("native", "numpy"):
        assert_same_bits(matmul_with(provider, x, w), ref)
    assert_same_bits(nm.matmul(x[0], w), ref[0])


def test_subnormal_products_and_overflow(rng):
    # products that underflow into float32 subnormals, and sums that overflow
    x = np.array([[2.0**-100, 2.0**-30, 3e38, 3e38]], np.float32)
    w = nm.Weights(np.array([[2.0**-40, 0], [2.0**-110, 0], [0, 2.0], [0, -1.0]], np.float32))
    ref = matmul_with("reference", x, w)
    assert ref[0, 0] == np.float32(2.0**-139)  # two subnormal products, summed exactly
    assert ref[0, 1] == np.inf                 # 6e38 overflows; Inf - 3e38 stays Inf
    for provider in ("native", "numpy"):
        assert_same_bits(matmul_with(provider, x, w), ref)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (2, 3, 4), (3, 7, 5), (5, 23, 7), (4, 32, 16),
                                   (1, 64, 9), (6, 17, 33), (9, 5, 17), (2, 257, 3)])
def test_random_shapes_identical_across_providers(fmt, m, k, n, rng):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = random_weights(rng, k, n, fmt)
    ref = matmul_with("reference", x, w)
    for provider in ("native", "numpy"):
        assert_same_bits(matmul_with(provider, x, w), ref)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_tile_edges_native_vs_numpy(fmt, rng):
    # n around every tile edge of the scalar row (NR = 8, NC = 512), two full column tiles
    # plus a remainder (1100), k across the KC = 256 block edge
    for m, k, n in [(3, 17, 1100), (2, 9, 511), (2, 9, 512), (2, 9, 513), (5, 255, 15),
                    (5, 256, 16), (4, 257, 17), (7, 600, 9), (17, 3, 70)] + \
                   [(2, 5, n) for n in range(1, 26)]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = random_weights(rng, k, n, fmt)
        assert_same_bits(nm.matmul(x, w), matmul_with("numpy", x, w))


@pytest.mark.parametrize("fmt", NARROW)
def test_single_row_and_packed_paths_agree(fmt, rng):
    k, n = 9, 700
    x = rng.standard_normal((1, k)).astype(np.float32)
    w = random_weights(rng, k, n, fmt)
    single = nm.matmul(x, w)
    packed = nm.matmul(np.repeat(x, 3, axis=0), w)
    for i in range(3):
        assert_same_bits(packed[i], single[0])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_strided_sub_blocks(provider, rng):
    # x, weights and out are sub-blocks of bigger matrices (leading dimensions > width)
    big_x = rng.standard_normal((6, 20)).astype(np.float32)
    big_w = nm.encode(rng.standard_normal((30, 40)).astype(np.float32), "fp16")
    x = big_x[1:4, 2:13]                  # (3, 11), row stride 20
    w = nm.Weights.from_bits(big_w[5:16, 7:16], "fp16")  # (11, 9), row stride 40
    out_parent = np.full((5, 30), 7.0, np.float32)
    out = out_parent[1:4, 3:12]           # (3, 9), row stride 30
    got = matmul_with(provider, x, w, out=out)
    assert got is out
    want = matmul_with("reference", np.ascontiguousarray(x),
                       nm.Weights.from_bits(np.ascontiguousarray(big_w[5:16, 7:16]), "fp16"))
    assert_same_bits(out, want)
    # nothing outside the block was written
    mask = np.ones_like(out_parent, bool)
    mask[1:4, 3:12] = False
    assert np.all(out_parent[mask] == 7.0)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_weights_at_odd_byte_offset_and_unaligned_activations(provider, rng):
    k, n = 13, 11
    bits = nm.encode(rng.standard_normal((k, n)).astype(np.float32), "bf16")
    raw = np.zeros(k * n * 2 + 1, np.uint8)
    odd = raw[1:].view(np.uint16).reshape(k, n)  # B at an odd address
    odd[...] = bits
    assert odd.ctypes.data % 2 == 1
    xbuf = np.zeros(k * 4 + 1, np.uint8)
    x = xbuf[1:].view(np.float32)  # x at an address that is not 4-byte aligned
    x[...] = rng.standard_normal(k).astype(np.float32)
    got = matmul_with(provider, x, nm.Weights.from_bits(odd, "bf16"))
    want = matmul_with("reference", np.array(x), nm.Weights.from_bits(bits, "bf16"))
    assert_same_bits(got, want)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_accumulate_continues_the_chain(provider, rng):
    m, k, n = 3, 10, 6
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = random_weights(rng, k, n, "fp16")
    # splitting k and accumulating gives exactly the one-shot chain
    out = matmul_with(provider, x[:, :4], nm.Weights.from_bits(w.bits[:4], "fp16"))
    matmul_with(provider, x[:, 4:], nm.Weights.from_bits(w.bits[4:], "fp16"), out=out,
                accumulate=True)
    assert_same_bits(out, matmul_with("reference", x, w))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_zero_sizes(provider):
    w = nm.Weights(np.ones((0, 3), np.float16))
    out = np.full((2, 3), 9.0, np.float32)
    matmul_with(provider, np.zeros((2, 0), np.float32), w, out=out)
    assert np.all(out == 0) and not np.signbit(out).any()  # k = 0: +0.0
    out[...] = 9.0
    matmul_with(provider, np.zeros((2, 0), np.float32), w, out=out, accumulate=True)
    assert np.all(out == 9)  # k = 0 with accumulate: unchanged
    assert matmul_with(provider, np.zeros((0, 4), np.float32),
                       nm.Weights(np.ones((4, 3), np.float16))).shape == (0, 3)
    assert matmul_with(provider, np.zeros((2, 4), np.float32),
                       nm.Weights(np.ones((4, 0), np.float16))).shape == (2, 0)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_vector_input_gives_vector_output(provider, rng):
    """A 1-D x is one row (the native binding takes it and a 1-D out as they are): the
    same bits as the (1, k) product, with strided vectors, accumulate, bias and packed
    weights too."""
    w = random_weights(rng, 8, 5, "bf16")
    x = rng.standard_normal(8).astype(np.float32)
    want = matmul_with(provider, x[None, :], w)[0]
    y = matmul_with(provider, x, w)
    assert y.shape == (5,)
    assert_same_bits(y, want)
    out = np.empty(5, np.float32)
    assert matmul_with(provider, x, w, out=out) is out
    assert_same_bits(out, want)
    xs = np.zeros(16, np.float32)
    xs[::2] = x
    outs = np.full(10, 7.0, np.float32)
    assert matmul_with(provider, xs[::2], w, out=outs[::2]).base is outs
    assert_same_bits(outs[::2], want)
    assert np.all(outs[1::2] == 7.0)
    start = rng.standard_normal(5).astype(np.float32)
    acc = start.copy()
    matmul_with(provider, x, w, out=acc, accumulate=True)
    want_acc = start[None, :].copy()
    matmul_with(provider, x[None, :], w, out=want_acc, accumulate=True)
    assert_same_bits(acc, want_acc[0])
    assert_same_bits(matmul_with(provider, x, w, bias=start), want_acc[0])
    if provider == "native":
        assert_same_bits(nm.matmul(x, w.pack()), want)
        assert_same_bits(nm.matmul(xs[::2], w.pack(), out=outs[::2]), want)


def test_out_with_any_strides_is_written_correctly(rng):
    w = random_weights(rng, 6, 4, "fp16")
    x = rng.standard_normal((3, 6)).astype(np.float32)
    want = nm.matmul(x, w)
    parent = np.zeros((4, 3), np.float32)
    out = parent.T[:, ::-1][:3]  # (3, 4) view, column-major with a negative stride
    nm.matmul(x, w, out=out)
    assert_same_bits(np.ascontiguousarray(out), want)


def test_wrapping_numpy_float16_and_ml_dtypes_bfloat16_is_zero_copy(rng):
    import ml_dtypes

    a16 = rng.standard_normal((4, 3)).astype(np.float16)
    w = nm.Weights(a16)
    assert w.format.name == "fp16" and np.shares_memory(w.bits, a16)
    abf = rng.standard_normal((4, 3)).astype(ml_dtypes.bfloat16)
    w = nm.Weights(abf)
    assert w.format.name == "bf16" and np.shares_memory(w.bits, abf)
    np.testing.assert_array_equal(w.decode(), abf.astype(np.float32))
    x = rng.standard_normal((2, 4)).astype(np.float32)
    assert_same_bits(nm.matmul(x, abf), nm.matmul(x, w))


def test_matmul_equals_float64_reference_when_exact():
    # small integers: every partial sum is exact, so the result is the true product
    rng = np.random.default_rng(3)
    x = rng.integers(-8, 8, (4, 20)).astype(np.float32)
    w32 = rng.integers(-8, 8, (20, 9)).astype(np.float32)
    for fmt in ALL_FORMATS:
        got = nm.matmul(x, nm.Weights.encode(w32, fmt))
        np.testing.assert_array_equal(got, (x.astype(np.float64) @ w32).astype(np.float32))
