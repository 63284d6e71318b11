"""nm.Linear and interop: PyTorch convention, DLPack, ml_dtypes."""

import ml_dtypes
import numpy as np
import pytest
from conftest import assert_same_bits

import narrowmm as nm


def test_linear_is_x_times_weight_transposed_plus_bias(rng):
    out_f, in_f = 6, 10
    w = rng.standard_normal((out_f, in_f)).astype(np.float16)
    b = rng.standard_normal(out_f).astype(np.float32)
    layer = nm.Linear(w, b)
    assert (layer.in_features, layer.out_features) == (in_f, out_f)
    x = rng.standard_normal((3, in_f)).astype(np.float32)
    # the bias starts each chain: the same as accumulating into a bias-filled out
    want = np.tile(b, (3, 1))
    nm.matmul(x, nm.Weights(np.ascontiguousarray(w.T)), out=want, accumulate=True)
    assert_same_bits(layer(x), want)
    with nm.use_provider("reference"):
        assert_same_bits(layer(x), want)
    assert_same_bits(layer(x[1]), want[1])


def test_linear_keeps_the_narrow_format_and_no_float32_copy(rng):
    w = rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    layer = nm.Linear(w)
    assert layer.weights.format.name == "bf16"
    assert layer.weights.bits.dtype == np.uint16 and layer.weights.nbytes == w.nbytes
    assert layer.bias is None


def test_linear_exact_against_integer_arithmetic(rng):
    # small integers: every summation order gives the exact result
    w = rng.integers(-4, 5, (7, 12)).astype(np.float32)
    b = rng.integers(-4, 5, 7).astype(np.float32)
    x = rng.integers(-4, 5, (5, 12)).astype(np.float32)
    for fmt in (np.float16, ml_dtypes.bfloat16, np.float32):
        y = nm.Linear(w.astype(fmt), b)(x)
        np.testing.assert_array_equal(y, x.astype(np.float64) @ w.T.astype(np.float64) + b)


def test_linear_against_torch(rng):
    torch = pytest.importorskip("torch")
    f = torch.nn.functional
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        w = torch.randn(40, 96, generator=g).to(dtype)
        b = torch.randn(40, generator=g)
        x = torch.randn(8, 96, generator=g)
        got = nm.Linear(w, b)(x)  # tensors in, zero-copy through DLPack
        want = f.linear(x, w.float(), b).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        # exactly representable products and sums: bit-exact whatever the order
        wi = torch.randint(-3, 4, (40, 96), generator=g).to(dtype)
        xi = torch.randint(-3, 4, (8, 96), generator=g).float()
        bi = torch.randint(-3, 4, (40,), generator=g).float()
        assert_same_bits(nm.Linear(wi, bi)(xi), f.linear(xi, wi.float(), bi).numpy())
    y = nm.Linear(w)(x)
    t = torch.from_numpy(y)  # the documented zero-copy way back
    assert t.data_ptr() == y.ctypes.data


def test_linear_from_safetensors_finds_the_bias(tmp_path, rng):
    from safetensors.numpy import save_file

    w = rng.standard_normal((5, 8)).astype(np.float16)
    b = rng.standard_normal(5).astype(np.float32)
    path = str(tmp_path / "l.safetensors")
    save_file({"fc.weight": w, "fc.bias": b, "other.weight": w}, path)
    layer = nm.Linear.from_safetensors(path, "fc.weight")
    x = rng.standard_normal((2, 8)).astype(np.float32)
    assert_same_bits(layer(x), nm.Linear(w, b)(x))
    assert nm.Linear.from_safetensors(path, "other.weight").bias is None


def test_linear_bad_input(rng):
    w = np.ones((4, 6), np.float16)
    with pytest.raises(ValueError,
                       match=r"bias must have shape \(out_features,\) = \(4,\), got \(5,\)"):
        nm.Linear(w, np.ones(5, np.float32))
    with pytest.raises(TypeError, match="dtype float64 cannot be wrapped"):
        nm.Linear(np.ones((4, 6)))
    layer = nm.Linear(w, np.ones(4, np.float32))
    out = np.full((2, 5), 7.0, np.float32)
    with pytest.raises(ValueError,
                       match=r"out must have shape \(\.\.\., out_features\) = \(2, 4\)"):
        layer(np.ones((2, 6), np.float32), out=out)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., in_features\) = "
                                         r"\(\.\.\., 6\), got \(2, 4\)"):
        layer(np.ones((2, 4), np.float32))
    assert np.all(out == 7.0)  # untouched: the bias is written only after validation


def test_matmul_bias_argument(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    w = nm.Weights(rng.standard_normal((5, 4)).astype(np.float16))
    with pytest.raises(ValueError, match="cannot be combined"):
        nm.matmul(x, w, out=np.zeros((3, 4), np.float32), accumulate=True,
                  bias=np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="bias must be float32"):
        nm.matmul(x, w, bias=np.zeros(4))


def test_dlpack_inputs_and_a_dlpack_that_raises(rng):
    class Broken:
        def __dlpack__(self, **kwargs):
            raise RuntimeError("device lost")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match=r"could not import weights .*device lost"):
        nm.Weights(Broken())
    with pytest.raises(TypeError, match=r"could not import x .*device lost"):
        nm.matmul(Broken(), nm.Weights(np.ones((2, 2), np.float16)))


def test_torch_tensors_are_imported_without_copies():
    torch = pytest.importorskip("torch")
    w = torch.randn(6, 4).bfloat16()
    weights = nm.Weights(w)
    assert weights.format.name == "bf16"
    assert weights.bits.ctypes.data == w.data_ptr()
    x = torch.randn(3, 6)
    assert_same_bits(nm.matmul(x, weights), nm.matmul(x.numpy(), weights))
