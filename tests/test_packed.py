"""Packed weights (Weights.pack): the same bits as the row-major matrix, on every row."""

from pathlib import Path

import numpy as np
import pytest
from conftest import (
    ALL_FORMATS,
    ISAS,
    NARROW,
    PROVIDERS,
    assert_same_bits,
    k_type_weights,
    random_weights,
)

import narrowmm as nm
import narrowmm.providers.native as native
from narrowmm.providers.native import core, use_isa

ALL16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)


@pytest.fixture(autouse=True)
def _restore_threads():
    before = nm.get_num_threads()
    yield
    nm.set_num_threads(before)


def _scalar_reference(x, w):
    nm.set_num_threads(1)
    with use_isa("scalar"):
        return nm.matmul(x, w)


# m: the gemv (1) and the tiled path around MR, with slivers outside the k blocks up to 16
# rows and k blocks outside beyond (the byte formats' groups: 3 to 6 rows as pairs); n:
# around every sliver width (8, 24, 32), a four-sliver group (96) and thread grains; k: 0,
# tiny, across the k blocks (128, 256). Then: rows split into parts (one column grain), and
# 16 rows whose A for all of k (8448: 528 KiB) passes a 512 KiB limit on it, which sends
# them back to k blocks outside (the limit is the core's L2: test_the_sliver_order_limit_*
# sets it each side).
SHAPES = ([(m, 300, 200) for m in (1, 2, 4, 5, 9, 16, 17, 31)]
          + [(1, 37, n) for n in (*range(1, 50), 95, 96, 97, 127, 128, 129, 1100)]
          + [(5, 64, n) for n in (1, 7, 8, 9, 23, 24, 25, 33, 71, 97)]
          + [(m, k, 300) for m in (1, 3) for k in (0, 1, 3, 17, 129, 256, 1000)]
          + [(12, 1000, 30), (16, 8448, 30)])


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_packed_gives_the_scalar_bits_on_every_row_and_thread_count(fmt):
    rng = np.random.default_rng(3)
    cases = [(rng.standard_normal((m, k)).astype(np.float32), random_weights(rng, k, n, fmt))
             for m, k, n in SHAPES]
    want = [_scalar_reference(x, w) for x, w in cases]
    for isa in ISAS:
        with use_isa(isa):
            packed = [w.pack() for _, w in cases]
            assert all(p.isa == isa and p.width == core().pack_width(p.format.code)
                       for p in packed)
            for threads in (1, 2, 3, 7):
                nm.set_num_threads(threads)
                for (x, _), p, expected in zip(cases, packed, want, strict=True):
                    assert_same_bits(nm.matmul(x, p), expected)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_the_sliver_order_limit_changes_no_bit(fmt):
    """The limit on A for walking slivers outside the k blocks (NARROWMM_SLIVER_OUTER_KIB)
    picks the loop order, never the bits: 0 (k blocks outside), 512 KiB and 1 MiB each side
    of 16 rows' A for k = 8448 (528 KiB), on every row and on 1 and 3 threads."""
    rng = np.random.default_rng(5)
    cases = [(rng.standard_normal((m, k)).astype(np.float32), random_weights(rng, k, n, fmt))
             for m, k, n in ((16, 8448, 40), (9, 1000, 300), (4, 600, 70))]
    want = [_scalar_reference(x, w) for x, w in cases]
    before = core().get_sliver_outer_a_bytes()
    try:
        for isa in ISAS:
            with use_isa(isa):
                packed = [w.pack() for _, w in cases]
                for limit in (0, 512 << 10, 1 << 20):
                    core().set_sliver_outer_a_bytes(limit)
                    assert core().get_sliver_outer_a_bytes() == limit
                    for threads in (1, 3):
                        nm.set_num_threads(threads)
                        for (x, _), p, expected in zip(cases, packed, want, strict=True):
                            assert_same_bits(nm.matmul(x, p), expected)
    finally:
        core().set_sliver_outer_a_bytes(before)


def _packed_walk_cases(rng):
    """(x, weights, what packs them) for the packed m = 1 and m = 2 walks: the float formats
    and every block walk (byte, nibble, and the K types' factored grids as from_gguf packs
    them), four-sliver groups and a tail, k through several blocks and super-blocks"""
    x = rng.standard_normal((2, 1280)).astype(np.float32)
    weights = [random_weights(rng, 300, 200, f) for f in ALL_FORMATS]
    weights += [nm.Weights.quantize((rng.standard_normal((1280, 300)) * 0.05)
                                    .astype(np.float32), f)
                for f in ("q8_0", "q4_0", "q4_1", "q5_1")]
    cases = [(x[:, :w.shape[0]], w, w) for w in weights]
    for t in ("Q4_K", "Q6_K"):
        tw = k_type_weights(t, 1280, 300, seed=7)
        cases.append((x, tw.transpose(), tw))
    return cases


# the packed m <= 2 walks' settings: the core's name for each, the values forced, and the
# rows that have it (the others report (None, None) whatever is forced)
WALK_SETTINGS = {
    "gemv prefetch": ("packed_gemv_ahead", (0, 64, 2048, 1 << 20), ("avx2", "avx512")),
    "nibble decode": ("nibble_decode", ("in-place", "permute"), ("avx512",)),
    "gemv streams": ("gemv_streams", (1, 2), ("avx512",)),
}


@pytest.mark.parametrize("setting", list(WALK_SETTINGS))
def test_the_packed_walks_settings_change_no_bit(setting):
    """The packed m <= 2 walks' settings change the time, never a bit, on every row and on
    1 and 3 threads, against the scalar row's bits: how far they prefetch
    (NARROWMM_GEMV_PREFETCH_BYTES: none, a line, 2048 bytes and 1 MiB, far past every buffer:
    a hint never faults), how they decode 4-bit codes (NARROWMM_NIBBLE_DECODE: in place
    and the permute on byte views; Q4_0, Q4_1 and the K types' factored grids among the
    cases) and how many groups the m = 1 walks take at once (NARROWMM_GEMV_STREAMS: one, or
    two through the pair walks; 300 columns, two groups and a tail, the K types' too)."""
    name, values, rows = WALK_SETTINGS[setting]
    c = core()
    set_value, forced, in_force = (getattr(c, f"set_{name}"), getattr(c, f"get_{name}"),
                                   getattr(c, name))
    rng = np.random.default_rng(11)
    cases = _packed_walk_cases(rng)
    want = {(i, m): _scalar_reference(x[:m], w)
            for i, (x, w, _) in enumerate(cases) for m in (1, 2)}
    before = forced()
    try:
        for isa in ISAS:
            with use_isa(isa):
                packed = [source.pack() for _, _, source in cases]
                for value in values:
                    set_value(value)
                    assert forced() == value
                    now = in_force()
                    assert now == ((value, now[1]) if isa in rows else (None, None)), (isa, now)
                    for threads in (1, 3):
                        nm.set_num_threads(threads)
                        for i, ((x, _, _), p) in enumerate(zip(cases, packed, strict=True)):
                            for m in (1, 2):
                                assert_same_bits(nm.matmul(x[:m], p), want[i, m])
    finally:
        set_value(before)


def _cpu_vendor() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("vendor_id")), "")


def _walk_setting_default(setting: str, isa: str, vendor: str):
    """A row's default for a packed walks' setting, as measured (docs/kernels.md): the
    prefetch 2048 bytes on the avx512 row of Intel CPUs and none on AMD ones (a Zen 4 lost
    with it), 2048 on the avx2 row everywhere; the 4-bit decode the permute on the avx512
    row of Intel CPUs and in place elsewhere (a Zen 4 ran in place faster); two groups at
    once at m = 1 on the avx512 row of Intel CPUs (a Xeon read two streams faster), one
    elsewhere; None on the rows without the setting."""
    intel = vendor == "GenuineIntel"
    if setting == "gemv prefetch":
        return {"avx512": 2048 if intel else 0, "avx2": 2048}.get(isa)
    if setting == "gemv streams":
        return (2 if intel else 1) if isa == "avx512" else None
    return ("permute" if intel else "in-place") if isa == "avx512" else None


# per setting: a value to force, and bad values with the error each raises
WALK_SETTING_CHECKS = {
    "gemv prefetch": (512, [(-5, ValueError, "packed_gemv_ahead must be >= 0"),
                            ("1", TypeError, None)]),
    "nibble decode": ("in-place", [(bad, ValueError, "must be 'in-place', 'permute' or None")
                                   for bad in ("shift", "", 1, b"permute")]),
    "gemv streams": (1, [(bad, ValueError, "must be 1, 2 or None")
                         for bad in (0, 3, -1, "2", True, 2.0, 1 << 70)]),
}


@pytest.mark.parametrize("setting", list(WALK_SETTINGS))
def test_the_packed_walks_settings_default_to_the_rows_for_this_cpu(setting):
    """Each row's default for the packed walks' settings on this CPU (_walk_setting_default);
    a forced value shows on the rows that have the setting, None restores the default, and
    bad values are refused."""
    name = WALK_SETTINGS[setting][0]
    forced_value, bad_values = WALK_SETTING_CHECKS[setting]
    c = core()
    set_value, forced, in_force = (getattr(c, f"set_{name}"), getattr(c, f"get_{name}"),
                                   getattr(c, name))
    before = forced()
    vendor = _cpu_vendor()
    try:
        set_value(None)
        assert forced() is None
        for isa in ISAS:
            with use_isa(isa):
                if isa == "avx512" and not vendor:
                    continue  # no /proc/cpuinfo to tell the maker
                want = _walk_setting_default(setting, isa, vendor)
                assert in_force() == (want, want), isa
                set_value(forced_value)
                assert in_force() == ((None, None) if want is None
                                      else (forced_value, want)), isa
                set_value(None)
        for bad, error, match in bad_values:
            with pytest.raises(error, match=match):
                set_value(bad)
        assert forced() is None
    finally:
        set_value(before)


def test_the_sliver_order_limit_defaults_to_the_l2_within_the_measured_sizes():
    c = core()
    l2 = c.l2_cache_bytes()
    assert l2 >= 0
    assert c.sliver_outer_a_default() == min(max(l2, 512 << 10), 1 << 20)
    # the C core's reading of Linux's sysfs against one in Python
    caches = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"))
    sizes = [d / "size" for d in caches
             if (d / "level").read_text().strip() == "2"
             and (d / "type").read_text().strip() != "Instruction"]
    if sizes:
        text = sizes[0].read_text().strip()
        assert l2 == int(text.rstrip("KM")) << {"K": 10, "M": 20}.get(text[-1], 0), text
    with pytest.raises(ValueError, match="sliver_outer_a_bytes must be >= 0"):
        c.set_sliver_outer_a_bytes(-5)
    with pytest.raises(TypeError):
        c.set_sliver_outer_a_bytes("1")


@pytest.mark.parametrize("fmt", NARROW)
@pytest.mark.parametrize("m", [1, 2, 3])
def test_every_weight_pattern_through_the_packed_layout(isa, fmt, m):
    """All 65,536 patterns, k = 1 (one fma per output) and k = 3 (the pattern in the
    middle of three steps), on the packed gemv (m = 1), the two-row gemv (m = 2) and the
    tiled path (m = 3)."""
    for k in (1, 3):
        bits = np.zeros((k, 65536), np.uint16)
        bits[k // 2] = ALL16
        w = nm.Weights.from_bits(bits, fmt)
        x = np.zeros((m, k), np.float32)
        x[:, k // 2] = 1.0
        assert_same_bits(nm.matmul(x, w.pack()), nm.matmul(x, w))


def test_accumulate_bias_strided_out_and_vector_x(isa, rng):
    w = random_weights(rng, 50, 70, "bf16")
    p = w.pack()
    x = rng.standard_normal((3, 50)).astype(np.float32)
    start = rng.standard_normal((3, 70)).astype(np.float32)
    a, b = start.copy(), start.copy()
    nm.matmul(x, w, out=a, accumulate=True)
    nm.matmul(x, p, out=b, accumulate=True)
    assert_same_bits(b, a)
    bias = rng.standard_normal(70).astype(np.float32)
    assert_same_bits(nm.matmul(x, p, bias=bias), nm.matmul(x, w, bias=bias))
    parent = np.full((5, 90), 7.0, np.float32)
    out = parent[1:4, 10:80]  # strided: computed in scratch and copied back
    nm.matmul(x, p, out=out)
    assert_same_bits(out, nm.matmul(x, w))
    mask = np.ones_like(parent, bool)
    mask[1:4, 10:80] = False
    assert np.all(parent[mask] == 7.0)
    assert_same_bits(nm.matmul(x[0], p), nm.matmul(x[0], w))


def test_two_rows_with_strides_accumulate_and_bias(isa, rng):
    """m = 2 on packed weights runs the two-row gemv: rows of x and out apart by more than
    k and n, accumulate and bias, every thread count; nothing outside out is written."""
    w = random_weights(rng, 300, 200, "fp16")
    p = w.pack()
    x = rng.standard_normal((2, 320)).astype(np.float32)[:, 7:307]
    start = rng.standard_normal((2, 200)).astype(np.float32)
    bias = rng.standard_normal(200).astype(np.float32)
    want = nm.matmul(x, w)
    want_acc = start.copy()
    nm.matmul(x, w, out=want_acc, accumulate=True)
    for threads in (1, 2, 3):
        nm.set_num_threads(threads)
        parent = np.full((2, 230), 7.0, np.float32)
        out = parent[:, 10:210]
        nm.matmul(x, p, out=out)
        assert_same_bits(out, want)
        assert np.all(parent[:, :10] == 7.0) and np.all(parent[:, 210:] == 7.0)
        out[...] = start
        nm.matmul(x, p, out=out, accumulate=True)
        assert_same_bits(out, want_acc)
        assert_same_bits(nm.matmul(x, p, bias=bias), nm.matmul(x, w, bias=bias))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_provider_accepts_packed_weights(provider, rng):
    w = random_weights(rng, 20, 30, "fp16")
    p = w.pack()
    x = rng.standard_normal((2, 20)).astype(np.float32)
    with nm.use_provider(provider):
        assert_same_bits(nm.matmul(x, p), nm.matmul(x, w))


@pytest.mark.parametrize("k,n", [(0, 5), (3, 0), (0, 0), (5, 1), (7, 24), (7, 25), (4, 100)])
def test_pack_unpack_round_trip(k, n):
    rng = np.random.default_rng(k * 100 + n)
    for fmt in ALL_FORMATS:
        w = random_weights(rng, k, n, fmt)
        p = w.pack()
        width = core().pack_width(w.format.code)
        assert p.shape == (k, n) and p.format is w.format and p.width == width
        assert p.bits.shape == (-(-n // width), k, width)
        assert p.nbytes == p.bits.size * w.format.itemsize
        back = p.unpack()
        assert back.shape == (k, n) and back.format is w.format
        np.testing.assert_array_equal(back.bits, w.bits)
        np.testing.assert_array_equal(p.decode().view(np.uint32), w.decode().view(np.uint32))
        if n % width:  # the last sliver's padding is zero (XOR-ed like every packed byte)
            assert (p.bits[-1, :, n % width:] == w.format.packed_xor).all()


def _numpy_slivers(bits, width, xor):
    """pack_slivers' NumPy copy, the native one's oracle: padded, transposed, XOR-ed."""
    k, n = bits.shape
    groups = -(-n // width)
    padded = np.zeros((k, groups * width), bits.dtype)
    padded[:, :n] = bits
    out = padded.reshape(k, groups, width).transpose(1, 0, 2).copy()
    if xor:
        out ^= np.uint8(xor)
    return out


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_native_sliver_copy_gives_numpy_bytes_for_every_stride(dtype, rng):
    """nm_pack_slivers (the native copy Weights.pack and TorchWeights.pack use) against
    NumPy's, byte for byte: row-major, transposed (a GGUF tensor's codes: the 8 x 8 blocks
    and their edges), a sub-block with a longer row stride, every other row, every other
    row and column (neither stride an item: the copy an item at a time), shapes
    around the block size (8 / itemsize) and the widths (8, 24, 96, one group past n), k
    and n of 0, and Q4_0's XOR (one-byte items only)."""
    from narrowmm._weights import pack_slivers

    c = core()
    info = np.iinfo(dtype) if dtype != np.float32 else None
    for k, n in [(0, 5), (5, 0), (1, 1), (7, 9), (8, 8), (16, 24), (17, 97), (64, 96),
                 (65, 100), (130, 41)]:
        side = 2 * max(k, n) + 5  # room for every view below, either way round
        big = (rng.integers(0, info.max, (side, side), endpoint=True).astype(dtype)
               if info else rng.standard_normal((side, side)).astype(dtype))
        views = {"row-major": big[:k, :n].copy(), "transposed": big[:n, :k].copy().T,
                 "sub-block": big[1:k + 1, 2:n + 2], "every other row": big[:2 * k:2, :n],
                 "transposed sub-block": big[3:n + 3, 1:k + 1].T,
                 "every other row and column": big[:2 * k:2, :2 * n:2]}
        for width in (8, 24, 96, n + 1):
            for xor in ((0, 0x88) if dtype == np.uint8 else (0,)):
                for name, v in views.items():
                    assert v.shape == (k, n)
                    got = pack_slivers(v, width, xor, c)
                    want = _numpy_slivers(np.ascontiguousarray(v), width, xor)
                    assert got.shape == want.shape, (name, k, n, width)
                    assert got.tobytes() == want.tobytes(), (name, k, n, width, xor)
                    assert got.size == 0 or got.ctypes.data % 64 == 0
                    np.testing.assert_array_equal(pack_slivers(v, width, xor).view(np.uint8),
                                                  got.view(np.uint8))


def test_native_sliver_copy_refuses_bad_arguments():
    """The binding checks what it is given: a clear ValueError or TypeError naming the
    problem, never a write outside out."""
    c = core()
    src = np.arange(12, dtype=np.uint8).reshape(3, 4)
    out = np.empty((1, 3, 8), np.uint8)
    c.pack_slivers(src, 8, 0, out)
    with pytest.raises(ValueError, match="holds 23 bytes"):
        c.pack_slivers(src, 8, 0, np.empty(23, np.uint8))
    with pytest.raises(ValueError, match="width must be"):
        c.pack_slivers(src, 0, 0, out)
    with pytest.raises(ValueError, match="xor must be a byte"):
        c.pack_slivers(src, 8, 256, out)
    with pytest.raises(ValueError, match="0 for 2-byte items"):
        c.pack_slivers(src.astype(np.uint16), 8, 0x88, np.empty((1, 3, 8), np.uint16))
    with pytest.raises(ValueError, match="must be 2-D"):
        c.pack_slivers(src.reshape(-1), 8, 0, out)
    with pytest.raises(ValueError, match="items of 1, 2 or 4 bytes"):
        c.pack_slivers(src.astype(np.float64), 8, 0, out)
    with pytest.raises(ValueError, match="negative stride"):
        c.pack_slivers(src[::-1], 8, 0, out)
    with pytest.raises(ValueError, match="overlaps src"):
        both = np.zeros(64, np.uint8)
        c.pack_slivers(both[:12].reshape(3, 4), 8, 0, both[8:32])
    with pytest.raises(ValueError, match="too large"):
        huge = np.lib.stride_tricks.as_strided(src, (1 << 31, 1 << 31), (0, 0))
        c.pack_slivers(huge, 8, 0, out)
    with pytest.raises(TypeError, match="writable"):
        ro = np.empty((1, 3, 8), np.uint8)
        ro.flags.writeable = False
        c.pack_slivers(src, 8, 0, ro)


@pytest.mark.parametrize("isa", ISAS)
def test_byte_formats_pack_in_groups_of_slivers(isa, rng):
    """The formats of a byte or less a weight pack four microkernel slivers side by side on
    the SIMD rows (two on scalar), the 16- and 32-bit ones one (nm_pack_width); a matrix
    that ends part way into a group gives the row-major bits on 1 to 7 threads (the threads'
    column ranges in whole groups, a call's chunks cut at a group's end): at m = 1 and 2, at
    m = 3 to 6, which run on groups as pairs of rows through the same walks (an odd row
    last), and at m = 7 to 9, tiles again; on avx2, Q8_0, Q4_0 and Q4_1 under binary16 grids
    run up to m = 8 through the walks in fours (three rows as a four on copies)."""
    with use_isa(isa):
        nr = core().pack_width(nm.get_format("bf16").code)  # the microkernel's width
        for fmt in nm.FORMATS:  # every format, the byte ones (FP8, GGUF's blocks) included
            f = nm.get_format(fmt)
            width = core().pack_width(f.code)
            assert width == (nr if f.itemsize > 1 else (2 if isa == "scalar" else 4) * nr)
            n = 2 * width + nr + 3  # two groups, a sliver and part of one more (bytes)
            a = rng.standard_normal((64, n)).astype(np.float32)
            w = nm.Weights.quantize(a, fmt) if fmt.startswith("q") else nm.Weights.encode(a, fmt)
            p = w.pack()
            assert p.width == width and p.bits.shape == (-(-n // width), 64 // f.kpack, width)
            for m in (1, 2, 3, 4, 5, 6, 7, 8, 9):
                x = rng.standard_normal((m, 64)).astype(np.float32)
                for threads in (1, 2, 3, 7):
                    nm.set_num_threads(threads)
                    assert_same_bits(nm.matmul(x, p), nm.matmul(x, w))


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
def test_packed_bytes_are_the_codes_xored_with_the_formats_packed_xor(fmt, rng):
    """The packed layout's bytes (docs/contracts.md): Q4_0's are its codes XOR 0x88, each
    nibble q - 8 in two's complement; the other formats' the codes as they are. Read back
    by the kernels (the row-major bits, every pattern of both nibbles) and by unpack."""
    f = nm.get_format(fmt)
    assert f.packed_xor == (0x88 if fmt == "q4_0" else 0)
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)  # every byte, 16 columns
    if fmt == "q8_0":
        codes = codes[:, :8]
    scales = nm.Scales(rng.uniform(-1, 1, (1, codes.shape[1])).astype(np.float16)
                       .astype(np.float32), (32, 1))
    offsets = (nm.Scales(rng.uniform(-1, 1, (1, codes.shape[1])).astype(np.float16)
                         .astype(np.float32), (32, 1)) if f.offsets else None)
    w = nm.Weights.from_bits(codes, fmt, scales, offsets)
    p = w.pack()
    n = codes.shape[1]
    stored = p.bits.transpose(1, 0, 2).reshape(codes.shape[0], -1)[:, :n]
    np.testing.assert_array_equal(stored, codes ^ np.uint8(f.packed_xor))
    np.testing.assert_array_equal(p.unpack().bits, codes)
    x = rng.standard_normal((1, codes.shape[0] * f.kpack)).astype(np.float32)
    assert_same_bits(nm.matmul(x, p), nm.matmul(x, w))


def test_packed_bits_and_scale_grids_start_on_a_cache_line(rng):
    """Packed slivers and the kernels' grids of scales start on a 64-byte line, whatever
    NumPy's allocator returns (it promises the element size only): a grid off a line splits
    the kernels' 64-byte loads of scales over two lines, which slowed Q6_K-shaped weights
    cold (docs/kernels.md). Every format, row-major and packed, binary16 grids (quantize's)
    and a float32 one every 16 rows (Q6_K's form), offsets below the scales."""
    def cases(k, n):
        for fmt in nm.FORMATS:
            a = rng.standard_normal((k, n)).astype(np.float32)
            yield nm.Weights.quantize(a, fmt) if fmt.startswith("q") else nm.Weights.encode(a, fmt)
        codes = rng.integers(0, 256, (k, n), dtype=np.uint8)
        scales = rng.random((k // 16, n), np.float32) + 0.5
        yield nm.Weights.from_bits(codes, "q8_0", nm.Scales.blocks(scales, (16, 1)))

    for k, n in ((64, 1), (64, 40), (96, 200), (128, 333)):
        for w in cases(k, n):
            p = w.pack()
            assert p.bits.ctypes.data % 64 == 0, (w, n)
            for grid in (w.kernel_scales(), p.kernel_scales(p.bits.shape[0] * p.width)):
                if grid is not None:
                    assert grid[0].flags.c_contiguous and grid[0].ctypes.data % 64 == 0, (w, n)


def test_packed_for_another_row_is_refused(rng):
    w = random_weights(rng, 10, 40, "fp16")
    x = rng.standard_normal((1, 10)).astype(np.float32)
    widths = {}
    for isa in ISAS:
        with use_isa(isa):
            widths[isa] = w.pack()
    for isa in ISAS:
        with use_isa(isa):
            for other, p in widths.items():
                if p.width == core().pack_width(p.format.code):
                    assert_same_bits(nm.matmul(x, p), nm.matmul(x, w))
                else:
                    with pytest.raises(ValueError, match=f"packed for the {other} row"):
                        nm.matmul(x, p)


def test_shape_mismatch_and_bad_binding_calls_raise(rng):
    p = random_weights(rng, 10, 40, "bf16").pack()
    with pytest.raises(ValueError, match="k=10"):
        nm.matmul(np.ones((2, 11), np.float32), p)
    with pytest.raises(ValueError, match=r"out must have shape \(2, 40\)"):
        nm.matmul(np.ones((2, 10), np.float32), p, out=np.empty((2, 41), np.float32))
    # the binding checks again: an n needing more slivers than given, a sliver missing, a
    # width other than the row's never reach the kernels (an n inside the last sliver's
    # padding only reads its zeros)
    c = core()
    x = np.ones((2, 10), np.float32)
    slivers = p.bits.reshape(-1, p.width)
    more = -(-40 // p.width) * p.width + 1
    for n, bits in ((more, slivers), (40, slivers[:-1]), (40, slivers[:, :-1])):
        out = np.zeros((2, n), np.float32)
        with pytest.raises(ValueError):
            c.matmul_packed(p.format.code, x, bits, n, out, False)
    buf = np.zeros(slivers.size, np.float32)  # twice the slivers' bytes
    inside = buf.view(np.uint16)[:slivers.size].reshape(slivers.shape)
    inside[...] = slivers
    with pytest.raises(ValueError, match="shares memory"):
        c.matmul_packed(p.format.code, x, inside, 40, buf[:80].reshape(2, 40), False)


def test_pack_needs_the_native_core(monkeypatch, rng):
    w = random_weights(rng, 4, 4, "fp16")
    monkeypatch.setattr(native, "_core", None)
    with pytest.raises(RuntimeError, match="native core"):
        w.pack()


def test_repr_names_the_layout(rng):
    p = random_weights(rng, 6, 50, "fp16").pack()
    assert repr(p) == (f"PackedWeights(k=6, n=50, format='fp16', width={p.width}, "
                       f"isa={core().isa()!r})")


def test_linear_layer_packs(rng):
    w = rng.standard_normal((30, 20)).astype(np.float16)  # (out, in), PyTorch's layout
    bias = rng.standard_normal(30).astype(np.float32)
    layer = nm.Linear(w, bias)
    x = rng.standard_normal((3, 20)).astype(np.float32)
    want = layer(x)
    assert layer.pack() is layer and isinstance(layer.weights, nm.PackedWeights)
    assert (layer.in_features, layer.out_features) == (20, 30)
    assert_same_bits(layer(x), want)
    assert_same_bits(nm.Linear(layer.weights, bias)(x), want)
