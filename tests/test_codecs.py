"""Codecs: every provider against the contract, over whole input domains."""

from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest
from conftest import ISAS, NARROW, PROVIDERS

import narrowmm as nm
from narrowmm.providers import numpy_impl
from narrowmm.providers.native import core

ALL16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)


def decode_with(provider, bits, fmt):
    with nm.use_provider(provider):
        return nm.decode(bits, fmt)


def encode_with(provider, values, fmt):
    with nm.use_provider(provider):
        return nm.encode(values, fmt)


@pytest.mark.parametrize("fmt", NARROW)
def test_decode_all_patterns_identical_across_providers(fmt, isa):
    ref = decode_with("reference", ALL16, fmt).view(np.uint32)
    for provider in ("native", "numpy"):
        got = decode_with(provider, ALL16, fmt).view(np.uint32)
        bad = np.flatnonzero(got != ref)
        assert bad.size == 0, f"{provider}: {bad.size} differ, first {ALL16[bad[0]]:#06x}"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_fp16_decode_contract(provider, isa):
    u = decode_with(provider, ALL16, "fp16").view(np.uint32)
    h = ALL16.astype(np.uint32)
    exp, mant, sign = (h >> 10) & 0x1F, h & 0x3FF, h >> 15
    assert np.all((u >> 31) == sign)
    # exact: compare values with NumPy's exact float16 -> float64 on non-NaN patterns
    finite = ~((exp == 31) & (mant != 0))
    want = ALL16.view(np.float16).astype(np.float64)[finite]
    np.testing.assert_array_equal(u.view(np.float32)[finite].astype(np.float64), want)
    # +-Inf stays Inf
    assert np.all(u[(exp == 31) & (mant == 0)] & 0x7FFFFFFF == 0x7F800000)
    # every NaN comes back quiet, payload kept: low 22 bits == (mant << 13) | quiet bit
    nan = (exp == 31) & (mant != 0)
    assert nan.sum() == 2046
    assert np.all((u[nan] & 0x7FFFFFFF) == (0x7FC00000 | (mant[nan] << 13)))
    # subnormals: m * 2^-24, exactly
    sub = (exp == 0) & (mant != 0)
    np.testing.assert_array_equal(np.abs(u[sub].view(np.float32)),
                                  mant[sub].astype(np.float32) * np.float32(2.0**-24))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_bf16_decode_contract(provider, isa):
    u = decode_with(provider, ALL16, "bf16").view(np.uint32)
    h = ALL16.astype(np.uint32)
    nan = (h & 0x7FFF) > 0x7F80
    assert nan.sum() == 254
    np.testing.assert_array_equal(u[~nan], h[~nan] << 16)  # the high half, exactly
    np.testing.assert_array_equal(u[nan], (h[nan] << 16) | 0x400000)  # quieted


def test_decode_differences_from_numpy_and_ml_dtypes_are_the_signalling_nans():
    ours16 = nm.decode(ALL16, "fp16").view(np.uint32)
    numpy16 = ALL16.view(np.float16).astype(np.float32).view(np.uint32)
    diff = ALL16[ours16 != numpy16].astype(np.uint32)
    # binary16 sNaN: exponent all ones, quiet bit (0x200) clear, mantissa non-zero
    assert diff.size == 1022
    assert np.all(((diff & 0x7C00) == 0x7C00) & ((diff & 0x200) == 0) & ((diff & 0x3FF) != 0))
    oursbf = nm.decode(ALL16, "bf16").view(np.uint32)
    mlbf = ALL16.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)
    diff = ALL16[oursbf != mlbf].astype(np.uint32)
    assert diff.size == 126
    assert np.all(((diff & 0x7F80) == 0x7F80) & ((diff & 0x40) == 0) & ((diff & 0x7F) != 0))


# Known values (the seed's codec oracle list, plus ties and NaN cases).
FP16_CASES = [
    (1.0, 0x3C00), (-2.0, 0xC000), (0.5, 0x3800), (0.0, 0x0000), (-0.0, 0x8000),
    (65504.0, 0x7BFF), (65519.0, 0x7BFF), (65520.0, 0x7C00), (70000.0, 0x7C00),
    (-70000.0, 0xFC00), (1e30, 0x7C00), (2.0**-14, 0x0400), (1023 * 2.0**-24, 0x03FF),
    (2.0**-24, 0x0001), (2.0**-25, 0x0000), (-(2.0**-25), 0x8000),
    (float(np.nextafter(np.float32(2.0**-25), np.float32(1))), 0x0001),
    (3 * 2.0**-25, 0x0002), (5 * 2.0**-25, 0x0002),  # 1.5 and 2.5 ulp: ties go to even
    (1 + 2.0**-11, 0x3C00), (1 + 3 * 2.0**-11, 0x3C02), (1 + 2.0**-10, 0x3C01),
    (float(np.finfo(np.float32).smallest_subnormal), 0x0000),
    (float("inf"), 0x7C00), (float("-inf"), 0xFC00),
]
BF16_CASES = [
    (1.0, 0x3F80), (-2.0, 0xC000), (0.0, 0x0000), (-0.0, 0x8000),
    (float(np.float32(1 + 2.0**-8)), 0x3F80),       # tie, even stays
    (float(np.float32(1 + 3 * 2.0**-8)), 0x3F82),   # tie, rounds up to even
    (float(np.float32(1 + 2.0**-8 + 2.0**-20)), 0x3F81),  # above the tie: up (truncation would not)
    (float(np.finfo(np.float32).max), 0x7F80),      # rounds up past the largest bf16
    (float(np.finfo(np.float32).smallest_subnormal), 0x0000),
    (float(np.finfo(np.float32).smallest_subnormal * 2**16), 0x0001),  # subnormals kept
    (float("inf"), 0x7F80), (float("-inf"), 0xFF80),
]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("fmt,cases", [("fp16", FP16_CASES), ("bf16", BF16_CASES)])
def test_encode_known_values(provider, fmt, cases, isa):
    values = np.array([v for v, _ in cases], np.float32)
    want = np.array([b for _, b in cases], np.uint16)
    got = encode_with(provider, values, fmt)
    for v, g, w in zip(values, got, want, strict=True):
        assert g == w, f"{fmt} encode({v!r}) = {g:#06x}, want {w:#06x}"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_encode_nan_is_quiet_and_keeps_sign_and_top_payload(provider, isa):
    words = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7FA02000, 0xFFFFFFFF, 0x7F802001],
                     np.uint32)
    fp16 = encode_with(provider, words.view(np.float32), "fp16")
    np.testing.assert_array_equal(fp16, [0x7E00, 0xFE00, 0x7E00, 0x7F01, 0xFFFF, 0x7E01])
    bf16 = encode_with(provider, words.view(np.float32), "bf16")
    np.testing.assert_array_equal(bf16, [0x7FC0, 0xFFC0, 0x7FC0, 0x7FE0, 0xFFFF, 0x7FC0])


@pytest.mark.parametrize("fmt", NARROW)
def test_encode_sample_matches_reference(fmt, rng, isa):
    words = np.concatenate([
        rng.integers(0, 2**32, 30000, dtype=np.uint64).astype(np.uint32),
        np.arange(0x477FE000, 0x47801000, dtype=np.uint32),   # fp16 overflow edge
        np.arange(0x33000000 - 2000, 0x33000000 + 2000, dtype=np.uint32),  # fp16 2^-25
        np.arange(0x387FF000, 0x38801000, dtype=np.uint32),   # fp16 subnormal/normal edge
        np.arange(0x7F7F0000, 0x7F7F2000, dtype=np.uint32),   # bf16 overflow edge
        np.arange(0, 3000, dtype=np.uint32),                  # float32 subnormals
    ])
    values = words.view(np.float32)
    ref = encode_with("reference", values, fmt)
    for provider in ("native", "numpy"):
        got = encode_with(provider, values, fmt)
        bad = np.flatnonzero(got != ref)
        assert bad.size == 0, f"{provider}: {bad.size} differ, first {words[bad[0]]:#010x}"


def _native_encode(values: np.ndarray, fmt: str, isa: str) -> np.ndarray:
    out = np.empty(values.shape, np.uint16)
    core().encode(nm.get_format(fmt).code, values, out, isa)
    return out


def _sweep_chunk(start: int, size: int) -> tuple[int, ...]:
    words = np.arange(size, dtype=np.uint32) + np.uint32(start)
    values = words.view(np.float32)
    nan = np.isnan(values)
    want16 = numpy_impl.encode_fp16(values)
    wantbf = numpy_impl.encode_bf16(values)
    out = []
    for isa in ISAS:  # every row's native codec against the NumPy provider
        out.append(int(np.count_nonzero(_native_encode(values, "fp16", isa) != want16)))
        out.append(int(np.count_nonzero(_native_encode(values, "bf16", isa) != wantbf)))
    ours16 = nm.encode(values, "fp16")
    oursbf = nm.encode(values, "bf16")
    # Independent libraries agree with us on every non-NaN input. NumPy's float16 cast is
    # ~50x slower on inputs that underflow to zero (|x| <= 2^-25), so those are checked
    # against their signed zero directly and cast as 0 (same result, fast path).
    tiny = (words & 0x7FFFFFFF) <= 0x33000000
    with np.errstate(all="ignore"):
        np16 = np.where(tiny, np.float32(0), values).astype(np.float16).view(np.uint16)
        mlbf = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    np16 = np16 | ((words >> 16) & 0x8000).astype(np.uint16) * tiny
    out.append(int(np.count_nonzero((ours16 != np16) & ~nan)))
    out.append(int(np.count_nonzero((oursbf != mlbf) & ~nan)))
    out.append(int(np.count_nonzero(ours16[tiny] != ((words[tiny] >> 16) & 0x8000))))
    return tuple(out)


@pytest.mark.slow
def test_encode_all_2_32_patterns_native_vs_numpy_provider():
    """Every float32 bit pattern, fp16 and bf16: every ISA row's native codec equals the
    NumPy provider, and NumPy's float16 / ml_dtypes' bfloat16 on every non-NaN input."""
    size = 1 << 24
    with ThreadPoolExecutor(2) as pool:
        totals = np.zeros(2 * len(ISAS) + 3, np.int64)
        for counts in pool.map(lambda c: _sweep_chunk(c * size, size), range(256)):
            totals += counts
    labels = [f"{isa} {fmt} vs numpy provider" for isa in ISAS for fmt in NARROW] + [
        "fp16 vs NumPy float16", "bf16 vs ml_dtypes bfloat16", "tiny inputs vs signed zero"]
    assert dict(zip(labels, totals.tolist(), strict=True)) == dict.fromkeys(labels, 0)


def test_encode_decode_round_trip_every_finite_pattern(isa):
    for fmt in NARROW:
        values = nm.decode(ALL16, fmt)
        not_nan = ~np.isnan(values)
        np.testing.assert_array_equal(nm.encode(values[not_nan], fmt), ALL16[not_nan])


def test_codecs_accept_unaligned_inputs(isa):
    raw = np.zeros(2 * 65536 + 1, np.uint8)
    odd = raw[1:].view(np.uint16)
    odd[...] = ALL16
    assert not odd.flags.aligned
    np.testing.assert_array_equal(nm.decode(odd, "fp16").view(np.uint32),
                                  nm.decode(ALL16, "fp16").view(np.uint32))
    fbuf = np.zeros(4 * 100 + 2, np.uint8)[2:].view(np.float32)
    fbuf[...] = np.linspace(-3, 3, 100, dtype=np.float32)
    np.testing.assert_array_equal(nm.encode(fbuf, "bf16"), nm.encode(fbuf.copy(), "bf16"))


def test_codecs_keep_shape_and_accept_views(isa):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, ::2]
    bits = nm.encode(x, "bf16")
    assert bits.shape == x.shape and bits.dtype == np.uint16
    np.testing.assert_array_equal(nm.decode(bits, "bf16"), x)
    assert nm.encode(np.zeros(0, np.float32), "fp16").shape == (0,)
