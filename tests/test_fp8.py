"""FP8 weights (e4m3fn, e5m2) with scales: the codecs against ml_dtypes, the scaled matmul
contract against the pure-Python oracle on every path, ISA row and thread count, the
Weights / Scales API and its errors, and FP8 checkpoints in both Hugging Face conventions.

The contract (docs/contracts.md): weight (p, j) is fl32(decode(q[p, j]) * scale), one
float32 rounding, then the usual fma chain over p ascending."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from conftest import assert_oracle_bits_on_every_path, assert_same_bits, require
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import narrowmm as nm
from narrowmm.providers import use_provider
from narrowmm.providers.native import core

ml_dtypes = require("ml_dtypes")

FP8 = ["e4m3fn", "e5m2"]
ML = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
MAX = {"e4m3fn": 448.0, "e5m2": 57344.0}
SPECIAL = {"e4m3fn": 0x7F, "e5m2": 0x7C}  # magnitude bits every NaN/Inf code has
# the only codes whose decode differs from ml_dtypes': NaNs, whose payload narrowmm keeps
# (binary16's rule, as F16C and FCVTL do) where ml_dtypes returns the default NaN
NAN_PAYLOAD_CODES = {"e4m3fn": set(), "e5m2": {0x7D, 0x7F, 0xFD, 0xFF}}
CODES = np.arange(256, dtype=np.uint8)


def bits32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ---- the format table ---------------------------------------------------------------------

def test_the_fp8_rows_of_the_format_table():
    for name, code, exponent in (("e4m3fn", 3, 8), ("e5m2", 4, 0)):
        f = nm.get_format(name)
        assert (f.code, f.itemsize, f.scaled, f.scale_exponent) == (code, 1, True, exponent)
        assert f.max_finite == MAX[name]
        assert nm.get_format("float8_" + name) is f
    c_rows = {name: (code, size, scaled, r, kpack, offset)
              for code, name, size, scaled, r, kpack, offset, _, _ in core().formats()}
    for f in nm.FORMATS.values():
        assert c_rows[f.name] == (f.code, f.itemsize, int(f.scaled), f.scale_exponent,
                                  f.kpack, int(f.offsets))


# ---- codecs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", ["native", "numpy", "reference"])
@pytest.mark.parametrize("fmt", FP8)
def test_all_256_decodes_match_ml_dtypes_but_listed_nan_payloads(fmt, provider, isa):
    with use_provider(provider):
        got = bits32(nm.decode(CODES, fmt))
    want = bits32(CODES.view(ML[fmt]).astype(np.float32))
    differ = {int(q) for q in np.flatnonzero(got != want)}
    assert differ == NAN_PAYLOAD_CODES[fmt]
    for q in differ:  # both NaN, same sign, and quiet
        assert got[q] & 0x7FC00000 == 0x7FC00000 and got[q] >> 31 == want[q] >> 31
    nan = np.isnan(got.view(np.float32))
    assert (got[nan] & 0x7FFFFFFF >= 0x7FC00000).all()  # every NaN comes back quiet


def test_decode_is_the_same_on_every_provider_and_row():
    with use_provider("reference"):
        want = {f: bits32(nm.decode(CODES, f)) for f in FP8}
    for provider in ("native", "numpy"):
        with use_provider(provider):
            for f in FP8:
                np.testing.assert_array_equal(bits32(nm.decode(CODES, f)), want[f])


def encode_inputs(rng: np.random.Generator) -> np.ndarray:
    """A million random float32 patterns, and every pattern near each format's edges."""
    edges = [0.0, 2.0**-10, 2.0**-9, 2.0**-7, 2.0**-6, 448.0, 464.0, 480.0, 512.0,
             2.0**-17, 2.0**-16, 2.0**-14, 57344.0, 61440.0, 65536.0, np.inf, np.nan, 1.0]
    near = [(np.float32(e).view(np.uint32) + np.arange(-300, 300, dtype=np.int64))
            .astype(np.uint32) for e in edges]
    rand = rng.integers(0, 2**32, 2**20, dtype=np.uint64).astype(np.uint32)
    base = np.concatenate([rand, *near])
    return np.concatenate([base, base ^ np.uint32(0x80000000)]).view(np.float32)


def ml_encode(x: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    """ml_dtypes' rounding; with saturate, of the value clamped to the largest finite one
    first (what saturate means: overflow, Inf included, becomes that value)."""
    with np.errstate(all="ignore"):
        if saturate:
            x = np.where(np.isnan(x), x, np.clip(x, -MAX[fmt], MAX[fmt])).astype(np.float32)
        return x.astype(ML[fmt]).view(np.uint8)


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("fmt", FP8)
def test_encode_matches_ml_dtypes(fmt, saturate, isa):
    x = encode_inputs(np.random.default_rng(7))
    want = ml_encode(x, fmt, saturate)
    for provider in ("native", "numpy"):
        with use_provider(provider):
            np.testing.assert_array_equal(nm.encode(x, fmt, saturate=saturate), want)
    part = np.random.default_rng(8).choice(x.size, 20000, replace=False)
    with use_provider("reference"):
        np.testing.assert_array_equal(nm.encode(x[part], fmt, saturate=saturate), want[part])


@pytest.mark.parametrize("fmt", FP8)
def test_encode_overflow_rules(fmt):
    x = np.array([MAX[fmt] * 2, np.inf, -np.inf, np.nan, -np.nan], np.float32)
    plain = nm.decode(nm.encode(x, fmt), fmt)
    sat = nm.decode(nm.encode(x, fmt, saturate=True), fmt)
    if fmt == "e4m3fn":  # no infinity: overflow is NaN, as in ml_dtypes
        assert np.isnan(plain).all()
    else:
        np.testing.assert_array_equal(plain[:3], [np.inf, np.inf, -np.inf])
    np.testing.assert_array_equal(sat[:3], [MAX[fmt], MAX[fmt], -MAX[fmt]])
    assert np.isnan(plain[3:]).all() and np.isnan(sat[3:]).all()
    assert np.signbit(sat[4]) and not np.signbit(sat[3])


def test_saturate_is_for_fp8_only():
    with pytest.raises(ValueError, match=r"saturate applies to the FP8 formats, not 'bf16'"):
        nm.encode(np.ones(3, np.float32), "bf16", saturate=True)


def test_decode_names_the_dtype_it_wants():
    with pytest.raises(TypeError, match="e4m3fn bits must be uint8"):
        nm.decode(np.zeros(3, np.uint16), "e4m3fn")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FP8)
def test_encode_all_2_32_inputs_match_ml_dtypes(fmt):
    """Every float32 pattern, both overflow rules: no difference at all (NaN inputs
    included: both give the NaN code with the input's sign)."""
    chunk = 1 << 24
    for start in range(0, 1 << 32, chunk):
        x = np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
        for saturate in (False, True):
            got = nm.encode(x, fmt, saturate=saturate)
            want = ml_encode(x, fmt, saturate)
            bad = np.flatnonzero(got != want)
            assert bad.size == 0, (f"{fmt} saturate={saturate}: {bad.size} differ from "
                                   f"{x.view(np.uint32)[bad[0]]:#010x}")


# ---- the scaled matmul --------------------------------------------------------------------

def random_fp8(rng, k: int, n: int, fmt: str, scales: nm.Scales | None = None,
               finite: bool = False) -> nm.Weights:
    q = rng.integers(0, 256, (k, n), dtype=np.uint64).astype(np.uint8)
    if finite:
        q[(q & SPECIAL[fmt]) == SPECIAL[fmt]] = 0
    return nm.Weights.from_bits(q, fmt, scales)


def scale_kinds(rng, k: int, n: int) -> dict[str, nm.Scales]:
    return {
        "tensor": nm.Scales.tensor(0.37),
        "columns": nm.Scales.columns(rng.uniform(1e-3, 2.0, n).astype(np.float32)),
        "blocks 4x8": nm.Scales.blocks(rng.uniform(1e-3, 2.0, (-(-k // 4), -(-n // 8)))
                                       .astype(np.float32), (4, 8)),
        "blocks 3x5": nm.Scales.blocks(rng.uniform(1e-3, 2.0, (-(-k // 3), -(-n // 5)))
                                       .astype(np.float32), (3, 5)),
        "subnormal-making": nm.Scales.tensor(1e-40),
    }


@pytest.mark.parametrize("fmt", FP8)
def test_scaled_matmul_equals_the_oracle_on_every_path(fmt, isa):
    """Every kind of scale, every code (NaN and Inf included), m = 1 (gemv), 2 (two-row
    gemv), 5 (tiles), row-major and packed, finite and not: the native rows and the NumPy
    provider give the reference oracle's bits (exact rationals, one rounding per step)."""
    rng = np.random.default_rng(21)
    k, n = 23, 29
    for kind, scales in scale_kinds(rng, k, n).items():
        for finite in (False, True):
            w = random_fp8(rng, k, n, fmt, scales, finite)
            for m in (1, 2, 5, 7):  # packed: 5 rows as pairs, 7 as tiles
                assert_oracle_bits_on_every_path(rng.standard_normal((m, k)).astype(np.float32), w)
                assert w.kernel_scales(n)[2] == (finite or not np.any(
                    (w.bits & SPECIAL[fmt]) == SPECIAL[fmt])), kind


@pytest.mark.parametrize("fmt", FP8)
def test_every_code_under_scales_through_every_path(fmt, isa):
    """The 256 codes in every column position under four per-column scales (one of them
    making subnormal products): each output is fma(1, w1, fma(1, w0, 0)) with w =
    fl32(decode * scale) computed here in NumPy float32, one rounding."""
    n = 1024
    q0 = np.tile(CODES, 4)
    q1 = q0[::-1].copy()
    s = np.repeat(np.array([1.0, 2.0**-7, 3.3, 1e-38], np.float32), 256)
    dec = CODES.view(ML[fmt]).astype(np.float32)  # only NaN payloads may differ: ignored
    with np.errstate(all="ignore"):
        w0, w1 = dec[q0] * s, dec[q1] * s
        want = (w0 + np.float32(0)) + w1  # fma(1, w, c) is c + w rounded once
    w = nm.Weights.from_bits(np.stack([q0, q1]), fmt, nm.Scales.columns(s))
    before = nm.get_num_threads()
    for m in (1, 2, 5):
        x = np.ones((m, 2), np.float32)
        for threads in (1, 3):
            nm.set_num_threads(threads)
            try:
                assert_same_bits(nm.matmul(x, w), np.broadcast_to(want, (m, n)))
                assert_same_bits(nm.matmul(x, w.pack()), np.broadcast_to(want, (m, n)))
            finally:
                nm.set_num_threads(before)


@pytest.mark.parametrize("fmt", FP8)
def test_bits_do_not_depend_on_threads_blocks_or_layout(fmt):
    """DeepSeek-style 128 x 128 blocks on a k that is not a multiple of 128: batch 1, 17 and
    64, row-major and packed, 1, 2 and 3 threads, all one set of bits, equal to the NumPy
    provider's."""
    rng = np.random.default_rng(5)
    k, n = 1000, 300
    v = rng.standard_normal((k, n)).astype(np.float32)
    w = nm.Weights.quantize(v, fmt, (128, 128))
    assert w.scales.values.shape == (8, 3) and w.scales.block == (128, 128)
    packed = w.pack()
    before = nm.get_num_threads()
    for m in (1, 17, 64):
        x = rng.standard_normal((m, k)).astype(np.float32)
        with use_provider("numpy"):
            want = nm.matmul(x, w)
        for threads in (1, 2, 3):
            nm.set_num_threads(threads)
            try:
                assert_same_bits(nm.matmul(x, w), want)
                assert_same_bits(nm.matmul(x, packed), want)
            finally:
                nm.set_num_threads(before)


@pytest.mark.parametrize("fmt", FP8)
def test_small_values_cost_no_more_than_normal_ones(fmt, isa):
    """Codes that FP8 stores as subnormals are normal float32 numbers: their kernels must run
    as fast as those of normal codes. An Intel Xeon took a microcode assist for every weight
    when the decode passed through float32 subnormals (e4m3fn of 0.01 * N(0, 1): 140 ms
    against 28 ms); the AMD cores of this project's machines hardly notice, which is why
    the C driver also checks the x86 denormal-operand flag. A ratio in one process, the two
    timed in turns on weights that stay in cache (the decode's cost, not the memory's)."""
    import time

    rng = np.random.default_rng(11)
    v = rng.standard_normal((512, 4096)).astype(np.float32)
    dtype = ml_dtypes_fp8(fmt)
    normal = nm.Weights(v.astype(dtype))
    small = nm.Weights((v * (2.0**-9 if fmt == "e4m3fn" else 2.0**-16)).astype(dtype))
    assert np.mean((small.bits & 0x7F) < (0x08 if fmt == "e4m3fn" else 0x04)) > 0.5
    x = rng.standard_normal((1, 512)).astype(np.float32)
    before = nm.get_num_threads()
    nm.set_num_threads(1)
    try:
        for layout in ("rows", "packed"):
            a, b = (normal, small) if layout == "rows" else (normal.pack(), small.pack())
            times: dict[int, list[float]] = {0: [], 1: []}
            for _ in range(41):
                for i, w in enumerate((a, b)):
                    t0 = time.perf_counter()
                    nm.matmul(x, w)
                    times[i].append(time.perf_counter() - t0)
            ratio = float(np.median(times[1]) / np.median(times[0]))
            assert ratio < 2.0, f"{fmt} {layout}: small values {ratio:.1f}x slower"
    finally:
        nm.set_num_threads(before)


def ml_dtypes_fp8(fmt: str):
    ml_dtypes = require("ml_dtypes")
    return getattr(ml_dtypes, "float8_" + fmt)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(FP8), m=st.integers(0, 7), n=st.integers(0, 70),
       k=st.integers(0, 40), bk=st.integers(0, 9), bn=st.integers(0, 9),
       accumulate=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_property_native_equals_numpy_provider(fmt, m, n, k, bk, bn, accumulate, seed):
    rng = np.random.default_rng(seed)
    grid = rng.uniform(-4.0, 4.0, (1 if bk == 0 else max(1, -(-k // bk)),
                                   1 if bn == 0 else max(1, -(-n // bn)))).astype(np.float32)
    w = random_fp8(rng, k, n, fmt, nm.Scales(grid, (bk, bn)))
    x = rng.standard_normal((m, k)).astype(np.float32)
    start = rng.standard_normal((m, n)).astype(np.float32)
    with use_provider("numpy"):
        want = nm.matmul(x, w, start.copy(), accumulate=accumulate)
    assert_same_bits(nm.matmul(x, w, start.copy(), accumulate=accumulate), want)
    assert_same_bits(nm.matmul(x, w.pack(), start.copy(), accumulate=accumulate), want)


# ---- Weights and Scales ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FP8)
def test_ml_dtypes_arrays_wrap_without_a_copy(fmt):
    a = np.random.default_rng(1).standard_normal((6, 5)).astype(ML[fmt])
    w = nm.Weights(a)
    assert w.format.name == fmt and np.shares_memory(w.bits, a)
    assert w.scales.kind == "tensor" and w.scales.values[0, 0] == 1.0
    np.testing.assert_array_equal(w.decode(), a.astype(np.float32))


def test_weights_decode_applies_the_scales_once_rounded():
    q = nm.encode(np.array([[1.5, -3.0], [0.25, 448.0]], np.float32), "e4m3fn")
    s = np.array([0.1, 3.0], np.float32)
    w = nm.Weights.from_bits(q, "e4m3fn", nm.Scales.columns(s))
    want = nm.decode(q, "e4m3fn") * s  # float32 * float32: one rounding
    np.testing.assert_array_equal(bits32(w.decode()), bits32(want))
    np.testing.assert_array_equal(bits32(w.pack().decode()), bits32(want))


def test_quantize_picks_the_largest_magnitude_per_block():
    rng = np.random.default_rng(2)
    v = rng.standard_normal((50, 40)).astype(np.float32)
    w = nm.Weights.quantize(v, "e4m3fn")
    np.testing.assert_array_equal(w.scales.values[0], np.abs(v).max(axis=0) / np.float32(448))
    assert w.scales.kind == "columns"
    err = np.abs(w.decode() - v) / np.abs(v).max(axis=0)
    assert err.max() <= 2.0**-4  # half an ulp of 3 mantissa bits at the top binade
    t = nm.Weights.quantize(v, "e5m2", "tensor")
    assert t.scales.values.shape == (1, 1)
    zero = nm.Weights.quantize(np.zeros((3, 4), np.float32), "e4m3fn", (2, 2))
    np.testing.assert_array_equal(zero.scales.values, np.ones((2, 2), np.float32))


def test_scales_keep_a_copy_of_their_own():
    """The kernels' form of the scales is made once: the grid must not change under it."""
    grid = np.full((1, 3), 0.5, np.float32)
    scales = nm.Scales(grid, (0, 1))
    grid[...] = 2.0
    np.testing.assert_array_equal(scales.values, np.full((1, 3), 0.5, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        scales.values[0, 0] = 1.0


def test_scale_errors_name_the_problem():
    q = np.zeros((4, 6), np.uint8)
    with pytest.raises(ValueError, match=r"scales of shape \(1, 5\).*expected a grid of "
                                         r"shape \(1, 6\)"):
        nm.Weights.from_bits(q, "e4m3fn", nm.Scales.columns(np.ones(5, np.float32)))
    with pytest.raises(ValueError, match=r"e4m3fn scales must be finite and below 1\.32923e\+36"):
        nm.Weights.from_bits(q, "e4m3fn", nm.Scales.tensor(2.0**120))
    nm.Weights.from_bits(q, "e4m3fn", nm.Scales.tensor(2.0**119))  # the largest power of two
    below = float(np.nextafter(np.float32(2.0**120), np.float32(0)))  # the largest allowed
    nm.Weights.from_bits(q, "e4m3fn", nm.Scales.tensor(-below))
    with pytest.raises(ValueError, match="e4m3fn scales must be finite and below"):
        nm.Weights.from_bits(q, "e4m3fn", nm.Scales.tensor(-(2.0**120)))
    # the 2^128 limit of the others: every finite float32 passes, an infinity does not
    big = float(np.finfo(np.float32).max)
    nm.Weights.from_bits(q, "q8_0", nm.Scales.blocks(np.full((1, 6), -big, np.float32), (32, 1)))
    with pytest.raises(ValueError, match="q8_0 scales must be finite and below"):
        nm.Weights.from_bits(q, "q8_0", nm.Scales.tensor(float("-inf")))
    with pytest.raises(ValueError, match="must be finite"):
        nm.Weights.from_bits(q, "e5m2", nm.Scales.tensor(float("nan")))
    with pytest.raises(ValueError, match="format 'bf16' takes no scales"):
        nm.Weights.from_bits(q.astype(np.uint16), "bf16", nm.Scales.tensor(1.0))
    with pytest.raises(TypeError, match="e5m2 bits must be uint8 or int8"):
        nm.Weights.from_bits(q.astype(np.uint16), "e5m2")
    with pytest.raises(TypeError, match=r"raw bits: use Weights\.from_bits"):
        nm.Weights(q)
    with pytest.raises(ValueError, match="block must be"):
        nm.Weights.quantize(np.ones((2, 2), np.float32), "e4m3fn", (0, 2))
    with pytest.raises(ValueError, match="must be finite"):
        nm.Weights.quantize(np.array([[np.inf]], np.float32), "e4m3fn")


def test_binding_refuses_missing_or_short_scales():
    x = np.ones((1, 4), np.float32)
    out = np.empty((1, 6), np.float32)
    q = np.zeros((4, 6), np.uint8)
    with pytest.raises(ValueError, match="format 'e4m3fn' needs its scales"):
        core().matmul(3, x, q, out, False)
    with pytest.raises(ValueError, match="do not cover k=4"):
        core().matmul(3, x, q, out, False, np.ones((1, 5), np.float32), 4, False)
    with pytest.raises(ValueError, match="format 'bf16' takes no scales"):
        core().matmul(2, x, q.astype(np.uint16), out, False, np.ones((1, 6), np.float32), 4,
                      False)


# ---- checkpoints ------------------------------------------------------------------------

def write_safetensors(path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """A .safetensors file from (dtype name, array) pairs, written by hand (the format is a
    JSON header and the raw bytes)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, a) in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_deepseek_block_scales_load_and_compute_q_times_scale_inv(tmp_path):
    rng = np.random.default_rng(3)
    out_f, in_f = 200, 300  # neither a multiple of 128: ragged last blocks
    q = rng.integers(0, 256, (out_f, in_f), dtype=np.uint64).astype(np.uint8)
    q[(q & 0x7F) == 0x7F] = 0
    inv = rng.uniform(1e-4, 1e-2, (2, 3)).astype(np.float32)
    path = tmp_path / "ds.safetensors"
    write_safetensors(path, {"l.weight": ("F8_E4M3", q), "l.weight_scale_inv": ("F32", inv)})
    f = nm.load_safetensors(path)
    tw = f["l.weight"]
    assert tw.format.name == "e4m3fn" and tw.scales.block == (128, 128)
    # the oracle: every weight q * scale_inv of its block, rounded once, in (in, out) order
    dec = q.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    eff = dec * np.repeat(np.repeat(inv, 128, 0), 128, 1)[:out_f, :in_f]
    np.testing.assert_array_equal(bits32(tw.decode()), bits32(eff))
    x = rng.standard_normal((3, in_f)).astype(np.float32)
    with use_provider("reference"):
        want = nm.matmul(x, nm.Weights(np.ascontiguousarray(eff.T)))
    for pack in (False, True):
        layer = nm.Linear.from_safetensors(path, "l.weight", pack=pack)
        assert_same_bits(layer(x), want)
    assert np.shares_memory(tw.bits, np.frombuffer(f._map, np.uint8))  # zero-copy
    with pytest.raises(nm.SafetensorsError, match=r"fp8_block=\.\.\."):
        nm.load_safetensors(path, fp8_block=(64, 64))["l.weight"]


@pytest.mark.parametrize("shape", [(), (1,), (200,), (200, 1)])
def test_compressed_tensors_weight_scale_per_tensor_and_per_channel(tmp_path, shape):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((200, 64)).astype(np.float32)
    per_channel = shape in ((200,), (200, 1))
    s = (np.abs(w).max(axis=1) / 448 if per_channel else np.array(np.abs(w).max() / 448))
    s = s.astype(np.float32).reshape(shape)
    q = (w / s.reshape(-1, 1) if per_channel else w / s).astype(ml_dtypes.float8_e4m3fn)
    path = tmp_path / "ct.safetensors"
    write_safetensors(path, {"fc.weight": ("F8_E4M3", q.view(np.uint8)),
                             "fc.weight_scale": ("F32", s),
                             "fc.bias": ("F32", np.arange(200, dtype=np.float32))})
    layer = nm.Linear.from_safetensors(path, "fc.weight")
    eff = q.astype(np.float32) * (s.reshape(-1, 1) if per_channel else s)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    with use_provider("reference"):
        want = nm.matmul(x, nm.Weights(np.ascontiguousarray(eff.T)),
                         bias=np.arange(200, dtype=np.float32))
    assert_same_bits(layer(x), want)
    # the scales are applied (without them the error would be the size of x @ w.T, ~10)
    assert np.abs(layer(x) - (x @ w.T + np.arange(200))).max() < 2.0


def test_fp8_checkpoint_errors(tmp_path):
    q = np.zeros((4, 6), np.uint8)
    path = tmp_path / "bad.safetensors"
    write_safetensors(path, {"a.weight": ("F8_E5M2", q),
                             "a.weight_scale": ("I32", np.ones(4, np.int32)),
                             "b.weight": ("F8_E4M3", q),
                             "b.weight_scale": ("F32", np.ones(5, np.float32)),
                             "c.weight": ("F8_E4M3", q),
                             "c.weight_scale": ("F32", np.array([1e37], np.float32)),
                             "d.weight": ("F8_E4M3", q)})
    f = nm.load_safetensors(path)
    with pytest.raises(nm.SafetensorsError, match=r"'a\.weight_scale' has dtype I32"):
        f["a.weight"]
    with pytest.raises(nm.SafetensorsError, match=r"shape \(5,\); expected one scale"):
        f["b.weight"]
    with pytest.raises(nm.SafetensorsError, match=r"the scales of 'c\.weight'.*below 1\.3"):
        f["c.weight"]
    assert f["d.weight"].scales.kind == "tensor"  # no scale tensor: scale 1.0


# ---- narrowmm.torch ---------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FP8)
def test_torch_convert_to_fp8_with_per_channel_scales(fmt):
    torch = require("torch")
    import narrowmm.torch as nmt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 130), torch.nn.GELU(),
                                torch.nn.Linear(130, 40, bias=False))
    weights = [m.weight.detach().clone() for m in model if isinstance(m, torch.nn.Linear)]
    x = torch.randn(3, 5, 96)
    with torch.inference_mode():
        want_f32 = model(x)
        nmt.convert(model, fmt, threads=False)
        got = model(x)
        layers = [m for m in model if isinstance(m, nmt.Linear)]
        assert [m.format.name for m in layers] == [fmt, fmt]
        for layer, w in zip(layers, weights, strict=True):
            nw = layer.weights()  # per output feature: its largest magnitude / max finite
            np.testing.assert_array_equal(
                nw.scales.values[0], w.abs().amax(dim=1).numpy() / np.float32(MAX[fmt]))
            inp = torch.randn(4, layer.in_features)
            bias = None if layer.bias is None else layer.bias.numpy()
            with use_provider("numpy"):
                want = nm.matmul(inp.numpy(), nw.unpack() if layer.packed else nw, bias=bias)
            assert_same_bits(layer(inp).numpy(), want)
        # the custom operator carries the scales through torch.compile (the layer alone:
        # inductor's own GELU may round differently from eager's)
        first = layers[0]
        inp = torch.randn(7, 96)
        assert torch.equal(torch.compile(first)(inp), first(inp))
        assert first(inp.bfloat16()).dtype == torch.bfloat16
    rel = (got - want_f32).norm() / want_f32.norm()
    assert rel < (0.05 if fmt == "e4m3fn" else 0.1), float(rel)


def test_torch_layer_from_an_fp8_checkpoint(tmp_path):
    torch = require("torch")
    import narrowmm.torch as nmt

    rng = np.random.default_rng(9)
    q = rng.integers(0, 256, (160, 256), dtype=np.uint64).astype(np.uint8)
    inv = rng.uniform(1e-3, 1e-2, (2, 2)).astype(np.float32)
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"p.weight": ("F8_E4M3", q), "p.weight_scale_inv": ("F32", inv)})
    f = nm.load_safetensors(path)
    layer = nmt.Linear.from_weights(f["p.weight"])
    x = torch.randn(2, 256)
    with use_provider("reference"):
        want = nm.matmul(x.numpy(), f["p.weight"].transpose())
    with torch.inference_mode():
        assert_same_bits(layer(x).numpy(), want)
