"""Checkpoint layout without traps: a checkpoint tensor is PyTorch's (out_features,
in_features) and its type says so; every way of making a layer from it computes x @ W.T,
and narrowmm's (in, out) reading needs the explicit word `transpose`."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_same_bits

import narrowmm as nm


def write(path, tensors: dict[str, np.ndarray]) -> str:
    """A safetensors file of float16 / float32 arrays (no safetensors package needed)."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        dtype = {"float16": "F16", "float32": "F32"}[a.dtype.name]
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    return str(path)


def x_times_wt(x: np.ndarray, w_out_in: np.ndarray) -> np.ndarray:
    """The oracle: x @ W.T through narrowmm's (in, out) Weights built by hand."""
    return nm.matmul(x, nm.Weights(np.ascontiguousarray(w_out_in.T)))


def test_square_checkpoint_layer_is_x_times_w_transposed(tmp_path, rng):
    """The trap the issue names: a square (q/k/v/o) layer must not silently compute x @ W."""
    w = rng.standard_normal((48, 48)).astype(np.float16)
    b = rng.standard_normal(48).astype(np.float32)
    path = write(tmp_path / "m.safetensors", {"q.weight": w, "q.bias": b})
    f = nm.load_safetensors(path)
    x = rng.standard_normal((3, 48)).astype(np.float32)
    want = x_times_wt(x, w)
    t = f["q.weight"]
    assert isinstance(t, nm.TorchWeights) and not isinstance(t, nm.Weights)
    assert (t.out_features, t.in_features) == (48, 48)
    assert_same_bits(nm.Linear(t)(x), want)
    assert_same_bits(nm.Linear(t, pack=True)(x), want)
    with_bias = nm.matmul(x, nm.Weights(np.ascontiguousarray(w.T)), bias=b)
    assert_same_bits(nm.Linear.from_safetensors(path, "q.weight")(x), with_bias)  # finds q.bias
    assert_same_bits(nm.Linear.from_safetensors(f, "q.weight", pack=True)(x),
                     nm.Linear(t, b)(x))
    assert_same_bits(nm.matmul(x, t.transpose()), want)  # the explicit word
    assert_same_bits(nm.matmul(x, t.pack()), want)
    assert not np.array_equal(nm.matmul(x, nm.Weights(w)), want)  # what the trap computed


def test_checkpoint_tensor_is_refused_where_in_out_is_expected(tmp_path, rng):
    w = rng.standard_normal((8, 8)).astype(np.float16)
    t = nm.load_safetensors(write(tmp_path / "m.safetensors", {"w": w}))["w"]
    for call in (lambda: nm.matmul(np.ones((1, 8), np.float32), t), lambda: nm.Weights(t)):
        with pytest.raises(TypeError, match=r"\(out_features, in_features\).*transpose\(\)"):
            call()


def test_non_square_errors_speak_of_features(tmp_path, rng):
    w = rng.standard_normal((6, 10)).astype(np.float16)  # out 6, in 10
    layer = nm.Linear(nm.load_safetensors(write(tmp_path / "m.safetensors", {"w": w}))["w"])
    assert (layer.in_features, layer.out_features) == (10, 6)
    with pytest.raises(ValueError, match=r"in_features\) = \(\.\.\., 10\), got \(2, 6\)"):
        layer(np.ones((2, 6), np.float32))


def test_leading_dimensions(rng):
    w = rng.standard_normal((5, 7)).astype(np.float16)
    layer = nm.Linear(w, rng.standard_normal(5).astype(np.float32))
    x = rng.standard_normal((2, 3, 7)).astype(np.float32)
    want = layer(x.reshape(6, 7)).reshape(2, 3, 5)
    assert_same_bits(layer(x), want)
    out = np.empty((2, 3, 5), np.float32)
    assert layer(x, out=out) is out
    assert_same_bits(out, want)
    strided = np.empty((2, 3, 10), np.float32)[:, :, ::2]  # cannot be reshaped as a view
    layer(x, out=strided)
    assert_same_bits(np.ascontiguousarray(strided), want)


def test_missing_name_lists_close_matches(tmp_path):
    path = write(tmp_path / "m.safetensors", {
        "encoder.layer.0.attention.self.query.weight": np.zeros((2, 2), np.float16),
        "encoder.layer.0.attention.self.key.weight": np.zeros((2, 2), np.float16)})
    f = nm.load_safetensors(path)
    with pytest.raises(KeyError, match=r"close matches: 'encoder\.layer\.0\.attention"):
        f["encoder.layer.0.attention.self.querry.weight"]
    with pytest.raises(KeyError, match="it has 2 tensors"):
        f["zzz"]


def test_pack_straight_from_torch_layout_matches_pack_of_the_transpose(rng):
    for n in (1, 23, 24, 25, 49):
        t = nm.TorchWeights.wrap(rng.standard_normal((n, 9)).astype(np.float16))
        a, b = t.pack(), t.transpose().pack()
        assert a.bits.shape == b.bits.shape and np.array_equal(a.bits, b.bits)


# The peak resident set of this process image: VmHWM (ru_maxrss would carry the forking
# parent's peak across exec).
PEAK = """
def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
"""
LOADER = PEAK + """
import sys, numpy as np, narrowmm as nm
f = nm.load_safetensors(sys.argv[1])
layers = [nm.Linear.from_safetensors(f, name, pack=sys.argv[2] == "pack") for name in f]
print(peak(), sum(layer.weights.nbytes for layer in layers))
"""


@pytest.mark.parametrize("pack", ["rows", "pack"])
def test_loading_every_layer_holds_about_one_copy(tmp_path, rng, pack):
    """16 layers of 8 MiB (128 MiB): peak RSS stays near one copy plus a layer, because
    each layer's copy replaces its mapped view (SafetensorsFile.release)."""
    layer = rng.standard_normal((2048, 2048)).astype(np.float16)
    path = write(tmp_path / "m.safetensors", {f"l{i}.weight": layer for i in range(16)})
    base = subprocess.run([sys.executable, "-c", PEAK + "import numpy, narrowmm\nprint(peak())"],
                          capture_output=True, text=True, check=True)
    out = subprocess.run([sys.executable, "-c", LOADER, path, pack], capture_output=True,
                         text=True, check=True)
    peak, held = map(int, out.stdout.split())
    grown = peak - int(base.stdout)
    assert held >= 16 * layer.nbytes
    # two full copies would be +256 MiB; one copy plus a layer's scratch is ~ +140 MiB
    assert grown < held + 3 * layer.nbytes, f"peak grew {grown >> 20} MiB for {held >> 20} MiB"
