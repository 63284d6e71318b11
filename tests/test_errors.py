"""Bad input gets a clear TypeError/ValueError naming the problem, and out stays untouched."""

import numpy as np
import pytest
from conftest import PROVIDERS

import narrowmm as nm
from narrowmm.providers.native import core

K, N = 6, 5


@pytest.fixture
def w():
    return nm.Weights(np.ones((K, N), np.float16))


@pytest.fixture
def x():
    return np.ones((2, K), np.float32)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.complex64, object])
def test_wrong_activation_dtype(w, dtype):
    with pytest.raises(TypeError, match=f"x must be float32, got {np.dtype(dtype)};"):
        nm.matmul(np.ones((2, K), dtype), w)


def test_big_endian_activations(w):
    with pytest.raises(TypeError, match="non-native byte order"):
        nm.matmul(np.ones((2, K), ">f4"), w)


@pytest.mark.parametrize("bad", [None, "abc", [[1.0] * K], 3.0])
def test_non_arrays(w, bad):
    with pytest.raises(TypeError, match=r"x must be a numpy\.ndarray"):
        nm.matmul(bad, w)


def test_mismatched_k(w):
    with pytest.raises(ValueError, match=r"x has 7 columns but the weights have k=6"):
        nm.matmul(np.ones((2, 7), np.float32), w)


@pytest.mark.parametrize("shape", [(), (1, 2, K)])
def test_wrong_activation_rank(w, shape):
    with pytest.raises(ValueError, match=r"x must be 1-D .* or 2-D"):
        nm.matmul(np.ones(shape, np.float32), w)


def test_weights_rank_and_dtype():
    with pytest.raises(ValueError, match=r"2-D \(k, n\), got shape \(2, 3, 4\)"):
        nm.Weights(np.ones((2, 3, 4), np.float16))
    with pytest.raises(TypeError, match=r"dtype float64 cannot be wrapped"):
        nm.Weights(np.ones((2, 3)))
    with pytest.raises(TypeError, match=r"raw bits: use Weights.from_bits"):
        nm.Weights(np.ones((2, 3), np.uint16))
    with pytest.raises(TypeError, match=r"must be a numpy\.ndarray"):
        nm.Weights([[1.0]])
    with pytest.raises(TypeError, match="non-native byte order"):
        nm.Weights(np.ones((2, 3), ">f2"))
    with pytest.raises(ValueError, match="contiguous rows"):
        nm.Weights(np.ones((4, 6), np.float16)[:, ::2])
    with pytest.raises(ValueError, match="negative row stride"):
        nm.Weights(np.ones((4, 6), np.float16)[::-1])


def test_from_bits_wrong_width_and_format():
    with pytest.raises(TypeError, match=r"fp16 bits must be uint16 or int16, got uint8"):
        nm.Weights.from_bits(np.ones((2, 3), np.uint8), "fp16")
    with pytest.raises(TypeError, match="bf16 bits must be uint16 or int16, got uint32"):
        nm.Weights.from_bits(np.ones((2, 3), np.uint32), "bf16")
    with pytest.raises(ValueError, match="unknown format 'fp12'"):
        nm.Weights.from_bits(np.ones((2, 3), np.uint16), "fp12")
    with pytest.raises(ValueError, match="is fp16, not bf16"):
        nm.Weights(np.ones((2, 3), np.float16), "bf16")
    with pytest.raises(TypeError, match="values must be float32"):
        nm.Weights.encode(np.ones((2, 3)), "fp16")


def test_codec_argument_errors():
    with pytest.raises(TypeError, match="values must be float32, got float64"):
        nm.encode(np.ones(3), "fp16")
    with pytest.raises(TypeError, match="bits must be uint16"):
        nm.decode(np.ones(3, np.uint32), "bf16")
    with pytest.raises(TypeError, match=r"bits must be a numpy\.ndarray"):
        nm.decode([1, 2], "bf16")
    with pytest.raises(ValueError, match="unknown format"):
        nm.decode(np.ones(3, np.uint16), "e4m3")


OUT_CASES = [
    (np.full((2, N + 1), 3.0, np.float32), ValueError,
     r"out must have shape \(2, 5\), got \(2, 6\)"),
    (np.full((N,), 3.0, np.float32), ValueError, r"out must have shape \(2, 5\)"),
    (np.full((2, N), 3.0, np.float64), TypeError, "out must be float32, got float64"),
    (np.full((2, N), 3.0, ">f4"), TypeError, "non-native byte order"),
]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("out,exc,msg", OUT_CASES)
def test_bad_out_is_rejected_and_untouched(provider, w, x, out, exc, msg):
    before = out.copy()
    with nm.use_provider(provider), pytest.raises(exc, match=msg):
        nm.matmul(x, w, out=out)
    np.testing.assert_array_equal(out, before)


def test_read_only_out(w, x):
    out = np.full((2, N), 3.0, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        nm.matmul(x, w, out=out)
    assert np.all(out == 3.0)


def test_out_overlapping_inputs_is_rejected():
    buf = np.zeros((4, 8), np.float32)
    x = buf[:2, :K]
    w = nm.Weights(np.ones((K, N), np.float32))
    with pytest.raises(ValueError, match="shares memory"):
        nm.matmul(x, w, out=buf[1:3, :N])  # row 1 is in both
    wbuf = np.ones((K + 2, N), np.float32)
    with pytest.raises(ValueError, match="shares memory"):
        nm.matmul(np.ones((2, K), np.float32), nm.Weights(wbuf[:K]), out=wbuf[K - 1:K + 1])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_out_overlapping_x_with_a_bias_is_rejected_before_any_write(provider):
    buf = np.arange(32, dtype=np.float32).reshape(4, 8)
    before = buf.copy()
    w = nm.Weights(np.ones((K, N), np.float16))
    with nm.use_provider(provider), pytest.raises(ValueError, match="shares memory"):
        nm.matmul(buf[:2, :K], w, out=buf[1:3, :N], bias=np.ones(N, np.float32))
    np.testing.assert_array_equal(buf, before)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_bias_sharing_memory_with_out_is_rejected_before_any_write(provider):
    buf = np.arange(16, dtype=np.float32)
    before = buf.copy()
    w = nm.Weights(np.ones((K, N), np.float16))
    with nm.use_provider(provider), pytest.raises(ValueError, match="shares memory with the "
                                                                    "bias"):
        nm.matmul(np.ones((1, K), np.float32), w, out=buf[:N].reshape(1, N), bias=buf[2:2 + N])
    np.testing.assert_array_equal(buf, before)


@pytest.mark.parametrize("packed", [False, True])
def test_the_binding_checks_a_bias_on_its_own(packed):
    """The binding's bias argument is re-validated in C: wrong length, dtype, rank or
    strides, with accumulate, or overlapping out, each raise before anything is written."""
    c = core()
    x = np.ones((2, 3), np.float32)
    bits = np.full((3, 4), 0x3C00, np.uint16)  # fp16 1.0
    out = np.full((2, 4), 7.0, np.float32)
    if packed:
        width = c.pack_width(nm.get_format("fp16").code)
        slivers = np.zeros((3, width), np.uint16)

        def call(bias, accumulate=False, target=out):
            c.matmul_packed(1, x, slivers, 4, target, accumulate, bias=bias)
    else:
        def call(bias, accumulate=False, target=out):
            c.matmul(1, x, bits, target, accumulate, bias=bias)

    with pytest.raises(ValueError, match=r"bias must have shape \(4,\) = \(out_features,\), "
                                         r"got \(5,\)"):
        call(np.ones(5, np.float32))
    with pytest.raises(TypeError, match="1-D aligned float32"):
        call(np.ones(4))
    with pytest.raises(TypeError, match="1-D aligned float32"):
        call(np.ones((1, 4), np.float32))
    with pytest.raises(TypeError, match="C-contiguous float32"):
        call(np.ones(8, np.float32)[::2])
    with pytest.raises(ValueError, match="cannot be combined"):
        call(np.ones(4, np.float32), accumulate=True)
    np.testing.assert_array_equal(out, 7.0)
    buf = np.full(12, 7.0, np.float32)
    with pytest.raises(ValueError, match="shares memory with the bias"):
        call(buf[:4], target=buf[2:10].reshape(2, 4))
    np.testing.assert_array_equal(buf, 7.0)
    call(np.arange(4, dtype=np.float32))  # and a good one starts every chain from it
    w = nm.Weights.from_bits(np.zeros((3, 4), np.uint16) if packed else bits, "fp16")
    want = np.arange(4, dtype=np.float32)[None, :] + x @ w.decode()  # exact at these sizes
    np.testing.assert_array_equal(out, want)


def test_accumulate_needs_out(w, x):
    with pytest.raises(ValueError, match="accumulate=True needs an out"):
        nm.matmul(x, w, accumulate=True)


def test_c_binding_checks_on_its_own():
    """The binding re-validates, so a call that skips the Python layer cannot go out of
    bounds."""
    c = core()
    x = np.ones((2, 3), np.float32)
    b = np.ones((3, 4), np.uint16)
    out = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="shapes do not match"):
        c.matmul(1, x, np.ones((4, 4), np.uint16), out, False)
    with pytest.raises(ValueError, match="shapes do not match"):
        c.matmul(1, x, b, np.zeros((2, 5), np.float32), False)
    with pytest.raises(TypeError, match="item format"):
        c.matmul(1, x.astype(np.float64), b, out, False)
    with pytest.raises(TypeError, match="item format"):
        c.matmul(0, x, b, out, False)  # f32 weights must be float32
    with pytest.raises(ValueError, match="writable"):
        ro = out.copy()
        ro.flags.writeable = False
        c.matmul(1, x, b, ro, False)
    with pytest.raises(ValueError, match="x must be 1-D or 2-D, got 3-D"):
        c.matmul(1, x[None], b, out, False)
    with pytest.raises(ValueError, match="weights must be 2-D, got 1-D"):
        c.matmul(1, x, b[0], out, False)
    with pytest.raises(ValueError, match="shapes do not match"):  # a 1-D x is one row
        c.matmul(1, x[0], b, out, False)
    with pytest.raises(ValueError, match="x must be contiguous"):
        c.matmul(1, np.ones(6, np.float32)[::2], b, out[:1], False)
    with pytest.raises(ValueError, match="contiguous rows"):
        c.matmul(1, np.ones((2, 6), np.float32)[:, ::2], b, out, False)
    unknown = len(c.formats())  # the first code past the table
    with pytest.raises(ValueError, match=f"unknown format code {unknown}"):
        c.matmul(unknown, x, b, out, False)
    with pytest.raises(ValueError, match="shares memory"):
        buf = np.zeros((2, 8), np.float32)
        c.matmul(0, buf[:, :3], np.ones((3, 4), np.float32), buf[:, 2:6], False)
    with pytest.raises(TypeError, match="buffer protocol"):
        c.matmul(1, "x", b, out, False)
    with pytest.raises(ValueError, match="sizes do not match"):
        c.encode(1, np.ones(4, np.float32), np.zeros(3, np.uint16))
    with pytest.raises(ValueError, match="no codec"):
        c.decode(0, np.ones(4, np.uint16), np.zeros(4, np.float32))
    np.testing.assert_array_equal(out, 0)
