"""Loading checkpoints: round trips, a corpus of malformed files, byte flips, memory."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest
from conftest import assert_same_bits, check_flipped_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import narrowmm as nm
from narrowmm import SafetensorsError


def write_raw(path, header: dict, data: bytes, header_bytes: bytes | None = None) -> str:
    """A safetensors file from a header dict (or raw header bytes) and raw data."""
    hb = header_bytes if header_bytes is not None else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + data)
    return str(path)


def write_tensors(path, tensors: dict[str, tuple[str, tuple, bytes]]) -> str:
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return write_raw(path, header, data)


def test_round_trip_with_the_safetensors_package(tmp_path, rng):
    from safetensors.numpy import save_file

    w16 = rng.standard_normal((7, 5)).astype(np.float16)
    w32 = rng.standard_normal((3, 9)).astype(np.float32)
    vec = rng.standard_normal(4).astype(np.float32)
    path = str(tmp_path / "m.safetensors")
    save_file({"a.weight": w16, "b.weight": w32, "norm": vec}, path, metadata={"k": "v"})
    f = nm.load_safetensors(path)
    assert sorted(f) == ["a.weight", "b.weight", "norm"] and f.metadata == {"k": "v"}
    assert f["a.weight"].format.name == "fp16"
    np.testing.assert_array_equal(f["a.weight"].bits, w16.view(np.uint16))
    np.testing.assert_array_equal(f["b.weight"].bits, w32)
    np.testing.assert_array_equal(f.array("norm"), vec)
    with pytest.raises(SafetensorsError, match=r"'norm' has shape \(4,\); weights must be 2-D"):
        f["norm"]
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        f["nope"]


def test_bf16_from_raw_bytes_and_unsupported_dtypes(tmp_path, rng):
    w = rng.standard_normal((6, 4)).astype(ml_dtypes.bfloat16)
    path = write_tensors(tmp_path / "b.safetensors", {
        "w": ("BF16", (6, 4), w.tobytes()),
        "ids": ("I64", (3,), np.arange(3, dtype=np.int64).tobytes()),
    })
    f = nm.load_safetensors(path)
    assert f["w"].format.name == "bf16"
    np.testing.assert_array_equal(f["w"].decode(), w.astype(np.float32))
    np.testing.assert_array_equal(f.array("ids"), [0, 1, 2])
    with pytest.raises(SafetensorsError, match="'ids' has dtype I64; narrowmm loads F16"):
        f["ids"]


def test_round_trip_with_pytorch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    tensors = {"h": torch.randn(5, 7, generator=g).half(),
               "b": torch.randn(5, 7, generator=g).bfloat16(),
               "f": torch.randn(5, 7, generator=g)}
    path = str(tmp_path / "t.safetensors")
    save_file(tensors, path)
    f = nm.load_safetensors(path)
    for name, t in tensors.items():
        want = t.float().numpy()
        assert_same_bits(f[name].decode(), want)


def test_weights_are_memory_mapped_views(tmp_path, rng):
    w = rng.standard_normal((64, 32)).astype(np.float16)
    path = write_tensors(tmp_path / "v.safetensors", {"w": ("F16", (64, 32), w.tobytes())})
    weights = nm.load_safetensors(path)["w"]
    assert isinstance(weights, nm.TorchWeights) and weights.shape == (64, 32)
    assert not weights.bits.flags.writeable and not weights.bits.flags.owndata
    x = rng.standard_normal((3, 32)).astype(np.float32)
    assert_same_bits(nm.Linear(weights)(x), nm.matmul(x, nm.Weights(np.ascontiguousarray(w.T))))


def _raw_file(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


def _valid_header(data_len=24):
    return {"w": {"dtype": "F16", "shape": [3, 4], "data_offsets": [0, 24]}}


MALFORMED = [
    ("truncated", None, b"\x01\x02\x03", r"truncated: 3 bytes"),
    ("header past end", None, struct.pack("<Q", 1000) + b"{}", r"header length 1000 runs past"),
    ("huge header", None, struct.pack("<Q", 2**40) + b"{}", r"exceeds the format's limit"),
    ("not utf-8", None, struct.pack("<Q", 4) + b"\xff\xfe{}", r"header is not UTF-8"),
    ("not json", None, struct.pack("<Q", 5) + b"{abc}", r"header is not JSON"),
    ("not object", None, struct.pack("<Q", 2) + b"[]", r"must be a JSON object, got list"),
    ("entry not object", {"w": 5}, b"", r"tensor 'w': entry must be an object"),
    # found by tests/fuzz/fuzz_safetensors.py: a list is unhashable, so the dtype lookup
    # raised TypeError instead of the loader's error
    ("dtype not a string", {"w": {"dtype": ["F16"], "shape": [1], "data_offsets": [0, 2]}},
     b"xx", r"tensor 'w': unknown dtype \['F16'\]"),
    ("duplicate name", None,
     _raw_file(b'{"w": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}, '
               b'"w": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}') + b"xx",
     r"header names 'w' twice"),
    ("unknown dtype", {"w": {"dtype": "F12", "shape": [1], "data_offsets": [0, 2]}}, b"xx",
     r"tensor 'w': unknown dtype 'F12'"),
    ("bad shape", {"w": {"dtype": "F16", "shape": [-1, 2], "data_offsets": [0, 4]}}, b"x" * 4,
     r"tensor 'w': shape must be a list of non-negative integers"),
    ("bad offsets", {"w": {"dtype": "F16", "shape": [2], "data_offsets": [0]}}, b"x" * 4,
     r"tensor 'w': data_offsets must be \[begin, end\]"),
    ("offsets out of range", {"w": {"dtype": "F16", "shape": [3, 4], "data_offsets": [0, 24]}},
     b"x" * 10, r"tensor 'w': data_offsets \[0, 24\] lie outside the 10 bytes"),
    ("size mismatch", {"w": {"dtype": "F16", "shape": [3, 4], "data_offsets": [0, 20]}},
     b"x" * 20, r"tensor 'w': shape \(3, 4\) of F16 needs 24 bytes, data_offsets hold 20"),
    ("overlap", {"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]},
                 "b": {"dtype": "F16", "shape": [4], "data_offsets": [4, 12]}}, b"x" * 12,
     r"tensor '[ab]' overlaps tensor '[ab]'"),
    ("hole", {"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
              "b": {"dtype": "F16", "shape": [2], "data_offsets": [8, 12]}}, b"x" * 12,
     r"bytes 4..8 of the data belong to no tensor \(a hole before 'b'\)"),
    ("trailing bytes", _valid_header(), b"x" * 30, r"the last 6 bytes of the data belong"),
    ("bad metadata", {"__metadata__": {"k": 1}}, b"", r"__metadata__ must map strings"),
]


@pytest.mark.parametrize("case,header,data,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_files_give_clear_errors(tmp_path, case, header, data, message):
    path = tmp_path / "bad.safetensors"
    if header is None:
        path.write_bytes(data)
    else:
        write_raw(path, header, data)
    with pytest.raises(SafetensorsError, match=message):
        nm.load_safetensors(path)


def test_empty_and_header_only_files(tmp_path):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    with pytest.raises(SafetensorsError, match="truncated: 0 bytes"):
        nm.load_safetensors(path)
    f = nm.load_safetensors(write_raw(tmp_path / "h.safetensors", {}, b""))
    assert len(f) == 0


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory):
    rng = np.random.default_rng(2)
    path = tmp_path_factory.mktemp("flip") / "ok.safetensors"
    return open(write_tensors(path, {
        "a": ("F16", (4, 3), rng.standard_normal((4, 3)).astype(np.float16).tobytes()),
        "b": ("BF16", (2, 5), rng.integers(0, 2**16, 10).astype(np.uint16).tobytes()),
        "c": ("F32", (3,), np.ones(3, np.float32).tobytes()),
    }), "rb").read()


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
                      min_size=1, max_size=4))
def test_byte_flips_never_crash_the_loader(valid_file, tmp_path, flips):
    check_flipped_file(valid_file, flips, tmp_path / "flipped.safetensors", nm.load_safetensors,
                       SafetensorsError)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_opening_a_large_file_costs_far_less_memory_than_the_file(tmp_path):
    k, n = 1 << 15, 1 << 14  # 2^29 fp16 values: a 1 GiB tensor
    header = json.dumps({"big.weight": {"dtype": "F16", "shape": [k, n],
                                        "data_offsets": [0, 2 * k * n]}}).encode()
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 2 * k * n)  # sparse: no disk blocks, reads as zeros
    before = _rss_bytes()
    f = nm.load_safetensors(path)
    w = f["big.weight"]
    assert w.shape == (k, n) and w.nbytes == 1 << 30
    corner = nm.Weights.from_bits(w.bits[:64, :32], "fp16")
    y = nm.matmul(np.ones((2, 64), np.float32), corner)  # reads a few pages only
    assert np.all(y == 0)
    grown = _rss_bytes() - before
    assert grown < 64 << 20, f"RSS grew by {grown >> 20} MiB for a 1 GiB file"
