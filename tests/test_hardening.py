"""The contract breaks and surprises found by outside probing, and their siblings: overlap
checked against the caller's arrays, every header problem a SafetensorsError naming the
file, shapes NumPy cannot represent refused at load, strict __metadata__, non-regular files
refused before they are read, a replaced checkpoint leaving the loaded mapping alone, and
Ctrl-C stopping a call of any size."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import narrowmm as nm

F32 = nm.Weights.from_bits(np.ones((5, 5), np.float32), "f32")


# ---- 1. out overlapping an x that the Python layer copies -----------------------------

def test_out_overlapping_a_copied_x_is_refused():
    x = np.asfortranarray(np.arange(25, dtype=np.float32).reshape(5, 5))
    before = x.copy()
    with pytest.raises(ValueError, match="out shares memory with x"):
        nm.matmul(x, F32, out=x)
    assert np.array_equal(x, before)
    b = np.arange(50, dtype=np.float32).reshape(5, 10)
    before = b.copy()
    with pytest.raises(ValueError, match="out shares memory with x"):
        nm.matmul(b[:, 0::2], F32, out=b[:, 1::2])  # interleaved columns, x copied
    assert np.array_equal(b, before)


@pytest.mark.parametrize("provider", ["native", "numpy"])
def test_out_overlap_siblings(provider):
    """Every path that copies x: 1-D strided, unaligned, with a bias, and nm.Linear with
    leading dimensions (reshaping a non-contiguous x copies it too)."""
    with nm.use_provider(provider):
        v = np.ones(10, np.float32)
        with pytest.raises(ValueError, match="shares memory"):
            nm.matmul(v[::2], F32, out=v[1::2])
        with pytest.raises(ValueError, match="shares memory"):
            x = np.asfortranarray(np.ones((5, 5), np.float32))
            nm.matmul(x, F32, out=x, bias=np.zeros(5, np.float32))
        layer = nm.Linear(np.ones((5, 5), np.float32))
        buf = np.ones((2, 3, 10), np.float32)
        with pytest.raises(ValueError, match="shares memory"):
            layer(buf[:, :, 0::2], out=buf[:, :, 1::2])
        assert np.all(buf == 1)


# ---- 2-4. safetensors headers ----------------------------------------------------------

def raw_file(path, header: bytes | str, data: bytes = b"") -> str:
    if isinstance(header, str):
        header = header.encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return str(path)


def assert_safetensors_error(path: str, *words: str) -> None:
    with pytest.raises(nm.SafetensorsError) as info:
        nm.load_safetensors(path)
    text = str(info.value)
    assert path in text, text
    for w in words:
        assert w in text, text


def test_deeply_nested_header(tmp_path):
    assert_safetensors_error(raw_file(tmp_path / "deep.st", "[" * 100_000), "nests too deeply")
    nested = '{"w": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001
    assert_safetensors_error(raw_file(tmp_path / "deep2.st", nested), "nests too deeply")


def test_huge_integer_and_non_json_constants(tmp_path):
    template = '{"w": {"dtype": "F16", "shape": [DIM], "data_offsets": [0, 0]}}'
    header = template.replace("DIM", "9" * 5000)
    assert_safetensors_error(raw_file(tmp_path / "big.st", header), "5000 digits")
    for constant in ("NaN", "Infinity", "-Infinity"):
        header = template.replace("DIM", constant)
        assert_safetensors_error(raw_file(tmp_path / "c.st", header), constant)


@pytest.mark.parametrize(("shape", "words"), [
    ([10**30, 0], ["integer of 31 digits"]),  # no real dimension has more digits than 2^64
    ([0, 2**63 - 1], ["'w'", "larger than an array"]),
    ([2**62, 0], ["'w'", "larger than an array"]),
    ([0, 3, 2**62], ["'w'", "larger than an array"])])
def test_zero_size_shapes_numpy_cannot_hold_are_refused_at_load(tmp_path, shape, words):
    header = json.dumps({"w": {"dtype": "F16", "shape": shape, "data_offsets": [0, 0]}})
    assert_safetensors_error(raw_file(tmp_path / "z.st", header), *words)


def test_zero_size_shapes_numpy_can_hold_still_load(tmp_path):
    header = json.dumps({"w": {"dtype": "F16", "shape": [2**40, 0], "data_offsets": [0, 0]}})
    f = nm.load_safetensors(raw_file(tmp_path / "ok.st", header))
    assert f.array("w").shape == (2**40, 0)


@pytest.mark.parametrize("metadata", [False, 0, [], "", None, 1.5, {"a": 1}])
def test_metadata_must_map_strings_to_strings(tmp_path, metadata):
    header = json.dumps({"__metadata__": metadata})
    assert_safetensors_error(raw_file(tmp_path / "m.st", header), "__metadata__")


def test_metadata_map_is_kept(tmp_path):
    f = nm.load_safetensors(raw_file(tmp_path / "m.st", json.dumps({"__metadata__": {
        "format": "pt"}})))
    assert f.metadata == {"format": "pt"}


def header_json() -> st.SearchStrategy:
    """Headers as a fuzzer that knows the format's structure would write them: odd metadata,
    huge and zero dimensions, giant integers, deep nesting."""
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30),
                       st.floats(allow_nan=False), st.text(max_size=5))
    value = st.recursive(scalar, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
        max_leaves=8)
    dim = st.one_of(st.integers(0, 4), st.just(0), st.integers(2**31, 10**40))
    entry = st.fixed_dictionaries({
        "dtype": st.sampled_from(["F16", "BF16", "F32", "I8", "X"]),
        "shape": st.one_of(st.lists(dim, max_size=3), value),
        "data_offsets": st.one_of(st.tuples(st.integers(0, 16), st.integers(0, 16)).map(list),
                                  value)})
    header = st.dictionaries(st.sampled_from(["a", "b", "__metadata__"]),
                             st.one_of(entry, value), max_size=3)
    text = header.map(json.dumps)
    deep = st.tuples(st.integers(1, 200_000), st.sampled_from("[{")).map(
        lambda t: t[1] * t[0] if t[1] == "[" else '{"a":' * t[0])
    huge = st.integers(4000, 6000).map(lambda n: '{"a": {"shape": [' + "7" * n + "]}}")
    return st.one_of(text, deep, huge)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(header=header_json(), data=st.binary(max_size=16))
def test_any_header_loads_or_raises_safetensors_error(tmp_path, header, data):
    path = raw_file(tmp_path / "h.st", header, data)
    try:
        f = nm.load_safetensors(path)
    except nm.SafetensorsError:
        return
    for name in f:
        f.array(name)
        try:
            f[name]
        except nm.SafetensorsError:
            pass


# ---- files that are not regular, and files replaced while mapped ------------------------

def test_fifo_device_and_directory_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    code = ("import sys, narrowmm as nm\n"
            "try:\n    nm.load_safetensors(sys.argv[1])\n"
            "except nm.SafetensorsError as e:\n    print(e)\n")
    for path in (str(fifo), "/dev/zero", str(tmp_path)):
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                             text=True, timeout=60)  # a blocking open() would time out
        assert "not a regular file" in out.stdout and path in out.stdout, out


def test_a_replaced_checkpoint_leaves_the_loaded_mapping_alone(tmp_path):
    """Tools save by writing a new file and renaming it over the old one (a new inode): the
    mapping keeps the old file's data."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8)).astype(np.float16)
    header = json.dumps({"w": {"dtype": "F16", "shape": [16, 8], "data_offsets": [0, 256]}})
    path = tmp_path / "m.safetensors"
    raw_file(path, header, w.tobytes())
    f = nm.load_safetensors(path)
    layer_view = f["w"]
    x = rng.standard_normal((2, 8)).astype(np.float32)
    before = nm.Linear(layer_view)(x)
    raw_file(tmp_path / "m.tmp", header, np.full((16, 8), 7, np.float16).tobytes())
    os.replace(tmp_path / "m.tmp", path)
    assert np.array_equal(nm.Linear(f["w"])(x), before)
    assert np.array_equal(nm.Linear(layer_view)(x), before)
    assert np.all(nm.load_safetensors(path)["w"].decode() == 7)  # a new load sees the new file


# ---- Ctrl-C --------------------------------------------------------------------------

LONG_CALL = """
import signal, sys, time, numpy as np, narrowmm as nm
# Python's own Ctrl-C handler, whatever the parent left: a shell running CI in the
# background starts its children with SIGINT ignored, and Python then installs none
signal.signal(signal.SIGINT, signal.default_int_handler)
w = nm.Weights.from_bits(np.zeros((8192, 16384), np.uint16), "bf16")
x = np.ones((1024, 8192), np.float32)
out = np.full((1024, 16384), -1.0, np.float32)
print("start", flush=True)
t0 = time.perf_counter()
try:
    nm.matmul(x, w, out=out)
except KeyboardInterrupt:
    done = int((out == 0).all(axis=0).sum())
    untouched = int((out == -1).all(axis=0).sum())
    print(f"interrupted after {time.perf_counter() - t0:.3f} s, {done} whole columns done, "
          f"{untouched} untouched", flush=True)
    sys.exit(3)
print(f"finished in {time.perf_counter() - t0:.3f} s", flush=True)
"""


def test_ctrl_c_stops_a_long_call():
    """A 137 G multiply-add call (seconds on any machine) answers SIGINT at the next column
    chunk, within a second, leaving whole columns done and the rest untouched."""
    proc = subprocess.Popen([sys.executable, "-c", LONG_CALL], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "start"
    time.sleep(0.5)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    latency = time.perf_counter() - sent
    assert proc.returncode == 3, out + err
    assert "interrupted" in out, out + err
    assert latency < 1.0, f"Ctrl-C took {latency:.2f} s to stop the call"
    done, untouched = (int(part.split()[0]) for part in out.strip().split(", ")[1:])
    assert 0 < done < 16384 and done + untouched == 16384, out  # whole columns, the rest kept
