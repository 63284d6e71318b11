"""The avx512 row, verified where no AVX-512 CPU is at hand: in the Bochs CPU emulator.

tests/emulated/avx512_harness.c links the real frame and the real avx512 and scalar rows
into a freestanding x86-64 program; tests/emulated/machine.py runs it under bochscpu
(which implements AVX-512) with jobs written into its memory. Every result must equal, bit
for bit, what the scalar row computes natively on the same inputs: codecs on all 65,536
16-bit patterns and a million float32 patterns, the 65,536-pattern kernel sweep on both
paths, and matmuls over every tile edge of the 8 x 32 tile with strides, odd byte offsets,
accumulate, several thread parts, and guard cells around every output.

On a CPU that has AVX-512 the same row is also covered natively by every other test (the
`isa` fixture). Locally a missing tool skips this module; in CI (CI=true) it fails, since
the test extra installs bochscpu-python and .ci/run installs gcc."""

from __future__ import annotations

import os
import pickle
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same_bits

import narrowmm as nm
from narrowmm._weights import factored_grid, factored_sliver_major, pack_slivers, sliver_major
from narrowmm.providers.native import use_isa

ROOT = Path(__file__).resolve().parents[1]
EMULATED = Path(__file__).resolve().parent / "emulated"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
FLAGS = ["-O3", "-std=c11", "-ffreestanding", "-fno-pic", "-fno-stack-protector",
         "-fno-asynchronous-unwind-tables", "-ffp-contract=off", "-fno-math-errno",
         "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'csrc'}", f"-I{ROOT / 'csrc' / 'include'}",
         "-DNM_HAVE_AVX512"]
# each translation unit with the flags CMakeLists.txt gives it; the harness needs FMA for fmaf
UNITS = [
    (ROOT / "csrc/frame/matmul.c", []),
    (ROOT / "csrc/kernels/scalar/kernels_scalar.c", []),
    (ROOT / "csrc/kernels/avx512/kernels_avx512.c",
     ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"]),
    (EMULATED / "avx512_harness.c", ["-mfma"]),
]
EMU_MATMUL, EMU_DECODE, EMU_ENCODE, EMU_MATMUL_PACKED = 0, 1, 2, 3
AVX512_NR = 32  # the avx512 row's sliver width: its packed layout for 16- and 32-bit weights
AVX512_PACK_WIDTH = 128  # and for the byte formats: groups of four slivers side by side
FMT = {f.name: f.code for f in nm.FORMATS.values()}
SPECIAL = {"e4m3fn": 0x7F, "e5m2": 0x7C}  # the magnitude bits every NaN/Inf code has
GUARD = 0x7FBADBAD  # a NaN pattern no kernel writes


def unavailable(why: str) -> None:
    if IN_CI:
        pytest.fail(f"CI must provide this: {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """(harness ELF path, entry address, environment for machine.py)."""
    if platform.machine() not in ("x86_64", "AMD64") or sys.platform != "linux":
        pytest.skip("the harness is an x86-64 Linux build")
    for tool in ("cc", "nm"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} not installed")
    env = dict(os.environ)
    probe = subprocess.run([sys.executable, "-c", "import bochscpu"], capture_output=True,
                           text=True)
    out = tmp_path_factory.mktemp("avx512-emulated")
    if probe.returncode != 0 and "__isoc23" in probe.stderr:
        shim = out / "libglibc_c23_shim.so"
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim),
                        str(EMULATED / "glibc_c23_shim.c")], check=True)
        env["LD_PRELOAD"] = str(shim)
        probe = subprocess.run([sys.executable, "-c", "import bochscpu"], capture_output=True,
                               text=True, env=env)
    if probe.returncode != 0:
        unavailable(f"bochscpu-python does not import: {probe.stderr.strip()[-300:]}")
    objects = []
    for source, extra in UNITS:
        obj = out / (source.stem + ".o")
        subprocess.run(["cc", *FLAGS, *extra, "-c", str(source), "-o", str(obj)], check=True)
        objects.append(str(obj))
    elf = out / "avx512_harness.elf"
    subprocess.run(["cc", "-static", "-nostdlib", "-no-pie", "-Wl,-e,nm_emu_main", *objects,
                    "-o", str(elf), "-lgcc"], check=True)
    symbols = subprocess.run(["nm", str(elf)], capture_output=True, text=True,
                             check=True).stdout
    entry = next(int(line.split()[0], 16) for line in symbols.splitlines()
                 if line.endswith(" nm_emu_main"))
    return elf, entry, env


def run(emulator, jobs: list[dict]) -> list[bytes]:
    elf, entry, env = emulator
    folder = elf.parent
    with open(folder / "jobs.pkl", "wb") as f:
        pickle.dump(jobs, f)
    done = subprocess.run([sys.executable, str(EMULATED / "machine.py"), str(elf),
                           str(folder / "jobs.pkl"), str(folder / "out.pkl"), hex(entry)],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(folder / "out.pkl", "rb") as f:
        return pickle.load(f)


def codec_job(op: int, fmt: str, src: np.ndarray, out_itemsize: int) -> dict:
    return dict(op=op, fmt=FMT[fmt], m=0, n=src.size, k=0, lda=0, ldb=0, ldc=0, accumulate=0,
                threads=1, a=src.tobytes() if op == EMU_ENCODE else b"",
                b=src.tobytes() if op == EMU_DECODE else b"", c=b"",
                c_size=src.size * out_itemsize)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_codecs_equal_the_scalar_row(emulator, fmt):
    patterns = np.arange(65536, dtype=np.uint16)
    floats = np.concatenate([
        np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32),  # every exponent
        np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF,
                  0x477FE000, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001, 0x387FC000,
                  0x3F808000, 0x3F818000, 0x7F7FFFFF], dtype=np.uint32),
        np.random.default_rng(7).integers(0, 2**32, 2**18, dtype=np.uint64).astype(np.uint32),
    ]).view(np.float32)
    decoded, encoded = run(emulator, [codec_job(EMU_DECODE, fmt, patterns, 4),
                                      codec_job(EMU_ENCODE, fmt, floats, 2)])
    with use_isa("scalar"):
        want_decoded = nm.decode(patterns, fmt)
        want_encoded = nm.encode(floats, fmt)
    np.testing.assert_array_equal(np.frombuffer(decoded, np.uint32),
                                  want_decoded.view(np.uint32))
    np.testing.assert_array_equal(np.frombuffer(encoded, np.uint16), want_encoded)


def matmul_case(rng, fmt: str, m: int, n: int, k: int, *, accumulate: bool, threads: int,
                pad: int = 0, b_offset: int = 0, bits: np.ndarray | None = None):
    """A job with strided x, weights and out (leading dimensions `pad` larger), its
    guard-filled out window, and the scalar row's answer."""
    lda, ldb_items, ldc = k + pad, n + pad, n + pad
    x = rng.standard_normal((max(m, 1), max(lda, 1)), dtype=np.float32)[:m]
    if fmt == "f32":
        wfull = rng.standard_normal((k, ldb_items), dtype=np.float32)
    else:
        raw = rng.integers(0, 65536, (k, ldb_items), dtype=np.uint64).astype(np.uint16)
        wfull = raw if bits is None else bits.reshape(k, ldb_items)
    window = np.full((m, ldc), GUARD, dtype=np.uint32).view(np.float32)
    start = rng.standard_normal((m, n), dtype=np.float32)
    window[:, :n] = start
    with use_isa("scalar"):
        want = start.copy()
        nm.matmul(np.ascontiguousarray(x[:, :k]), nm.Weights.from_bits(
            np.ascontiguousarray(wfull[:, :n]), fmt), out=want, accumulate=accumulate)
    itemsize = 4 if fmt == "f32" else 2
    job = dict(op=EMU_MATMUL, fmt=FMT[fmt], m=m, n=n, k=k, lda=lda, ldb=ldb_items * itemsize,
               ldc=ldc, accumulate=int(accumulate), threads=threads, a=x.tobytes(),
               b=wfull.tobytes(), c=window.tobytes(), c_size=window.nbytes,
               b_offset=b_offset)
    return job, want, (m, ldc, n)


def check_matmul(outputs: list[bytes], cases: list) -> None:
    for out, (job, want, (m, ldc, n)) in zip(outputs, cases, strict=True):
        got = np.frombuffer(out, np.float32).reshape(m, ldc)
        where = {key: job[key] for key in ("fmt", "m", "n", "k", "accumulate", "threads")}
        assert (got[:, n:].view(np.uint32) == GUARD).all(), f"wrote outside out: {where}"
        try:
            assert_same_bits(got[:, :n], want)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from None


@pytest.mark.parametrize("fmt", ["f32", "fp16", "bf16"])
def test_matmul_over_tile_edges_equals_the_scalar_row(emulator, fmt):
    rng = np.random.default_rng(FMT[fmt])
    ms = [1, 2, 3, 4, 7, 8, 9, 12, 15, 16, 17, 33]
    ns = [1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 96, 97, 200]
    ks = [0, 1, 3, 17, 127, 128, 129, 300]
    cases = []
    for m in ms:
        for n in ns:  # every (m, n) pair once, the rest drawn at random
            cases.append(matmul_case(rng, fmt, m, n, int(rng.choice(ks)),
                                     accumulate=bool(rng.integers(2)),
                                     threads=int(rng.choice([1, 2, 3, 7])),
                                     pad=int(rng.choice([0, 0, 5])),
                                     b_offset=int(rng.choice([0, 0, 1, 2]))
                                     if fmt != "f32" else int(rng.choice([0, 4]))))
    # more rows than one packed A block (2048), and a wide call split into parts
    cases.append(matmul_case(rng, fmt, 2053, 40, 9, accumulate=True, threads=3))
    cases.append(matmul_case(rng, fmt, 5, 1100, 300, accumulate=False, threads=7, pad=3))
    check_matmul(run(emulator, [c[0] for c in cases]), cases)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 2, 9])
def test_every_weight_pattern_through_both_paths(emulator, fmt, m):
    """k = 1 and n = 65,536: each output column is one fma with one of the 65,536 weight
    patterns (NaNs, infinities, subnormals included), on the gemv (m = 1), the two-row gemv
    (m = 2) and the tiled path."""
    rng = np.random.default_rng(m)
    bits = np.arange(65536, dtype=np.uint16)
    case = matmul_case(rng, fmt, m, 65536, 1, accumulate=True, threads=2, b_offset=1,
                       bits=bits)
    check_matmul(run(emulator, [case[0]]), [case])


def packed(case):
    """The same case on weights in the avx512 row's packed layout."""
    job, want, shape = case
    itemsize = 4 if job["fmt"] == FMT["f32"] else 2
    dtype = np.float32 if itemsize == 4 else np.uint16
    k, n = job["k"], job["n"]
    rows = np.frombuffer(job["b"], dtype).reshape(k, job["ldb"] // itemsize)[:, :n]
    slivers = pack_slivers(np.ascontiguousarray(rows), AVX512_NR)
    return dict(job, op=EMU_MATMUL_PACKED, ldb=0, b=slivers.tobytes(), b_offset=0), want, shape


@pytest.mark.parametrize("fmt", ["f32", "fp16", "bf16"])
def test_packed_weights_equal_the_scalar_row(emulator, fmt):
    """nm_matmul_packed on the avx512 row (its four-sliver gemv at m = 1, the two-row gemv
    at m = 2, the tiled path reading slivers above) over the sliver edges, strided x and
    out, accumulate, threads."""
    rng = np.random.default_rng(10 + FMT[fmt])
    cases = [packed(matmul_case(rng, fmt, m, n, int(rng.choice([0, 1, 3, 17, 129, 300])),
                                accumulate=bool(rng.integers(2)),
                                threads=int(rng.choice([1, 2, 3, 7])),
                                pad=int(rng.choice([0, 5]))))
             for m in (1, 2, 4, 9, 17) for n in (1, 31, 32, 33, 127, 128, 129, 200)]
    cases.append(packed(matmul_case(rng, fmt, 1, 1100, 300, accumulate=False, threads=7)))
    check_matmul(run(emulator, [c[0] for c in cases]), cases)


@pytest.mark.parametrize("m", [1, 2, 9])
def test_every_weight_pattern_through_the_packed_layout(emulator, m):
    rng = np.random.default_rng(20 + m)
    case = packed(matmul_case(rng, "fp16", m, 65536, 1, accumulate=True, threads=2,
                              bits=np.arange(65536, dtype=np.uint16)))
    check_matmul(run(emulator, [case[0]]), [case])


def fp8_case(rng, fmt: str, m: int, n: int, k: int, *, accumulate: bool, threads: int,
             finite: bool, pad: int = 0, b_offset: int = 0, bits: np.ndarray | None = None,
             scales: nm.Scales | None = None, packed_layout: bool = False,
             half: bool = False, per_super: int = 0, streams: int | None = None):
    """An FP8 job with a random block grid of scales (or the given ones) in the kernels'
    form, and the scalar row's answer. finite: NaN/Inf codes replaced by zero, and the
    finite-weights kernels asked for. half (the GGUF formats): the random scales and offsets
    rounded to binary16, which the kernels then take as a float16 grid. per_super > 1 (the
    K types): scales (and offsets) a binary16 factor per per_super blocks times an int8
    code, which the kernels take as a factored grid (nm_scales.c8), in blocks of 4 rows
    (8 for the 4-bit formats). streams: the groups the packed m = 1 walks take at once
    (nm_set_gemv_streams), else 1 or 2 at random."""
    f = nm.get_format(fmt)
    ldb = n + pad
    k += k % f.kpack  # the 4-bit formats: two rows a byte
    x = rng.standard_normal((max(m, 1), max(k + pad, 1)), dtype=np.float32)[:m]
    rows = k // f.kpack
    raw = (rng.integers(0, 256, (rows, ldb), dtype=np.uint64).astype(np.uint8) if bits is None
           else bits.reshape(rows, ldb))
    if finite and f.special_bits:
        raw = np.where((raw & SPECIAL[fmt]) == SPECIAL[fmt], np.uint8(0), raw)
    if f.code_bits:  # Q5_1: its codes, 0 to 31 (the API refuses the other bytes)
        raw = raw & np.uint8((1 << f.code_bits) - 1)
    offsets = None
    if scales is None and per_super > 1:
        bk = 4 * f.kpack
        supers = -(-k // bk) // per_super
        parts = []
        for _ in range(2 if f.offsets else 1):
            d = rng.uniform(-2.0**-8, 2.0**-8, (supers, 1, n)).astype(np.float16).astype(np.float32)
            codes = rng.integers(-128, 128, (supers, per_super, n)).astype(np.float32)
            parts.append(nm.Scales((d * codes).reshape(supers * per_super, n), (bk, 1)))
        scales, offsets = parts[0], parts[1] if f.offsets else None
    elif scales is None:
        bk = int(rng.choice([1, 4, 128, 10**9])) * f.kpack
        grid = rng.uniform(0.5, 2.0, (max(1, -(-k // bk)), n)).astype(np.float32) * 2.0**-10
        scales = nm.Scales(grid, (bk if bk <= k else 0, 1))
        if f.offsets:
            offsets = nm.Scales(rng.standard_normal(grid.shape).astype(np.float32), scales.block)
        if half:  # binary16 values, a subnormal one among them
            grid[0, 0] = 2.0**-20
            scales = nm.Scales(grid.astype(np.float16).astype(np.float32), scales.block)
            if offsets is not None:
                offsets = nm.Scales(offsets.values.astype(np.float16).astype(np.float32),
                                    scales.block)
    elif f.offsets:
        offsets = nm.Scales(np.zeros_like(scales.values), scales.block)
    w = nm.Weights.from_bits(np.ascontiguousarray(raw[:, :n]), fmt, scales, offsets)
    window = np.full((m, n + pad), GUARD, dtype=np.uint32).view(np.float32)
    start = rng.standard_normal((m, n), dtype=np.float32)
    window[:, :n] = start
    with use_isa("scalar"):
        want = start.copy()
        nm.matmul(np.ascontiguousarray(x[:, :k]), w, out=want, accumulate=accumulate)
    # whole slivers of every row (96 columns) and whole groups of the avx512 row's (128)
    grid, bk, is_finite = w.kernel_scales(-(-n // 384) * 384)
    assert is_finite == finite or not finite
    if half:  # row-major Weights keep float32 grids; the kernels take float16 ones too
        grid = grid.astype(np.float16)  # exact: binary16 values
    grids = 2 if f.offsets else 1
    if per_super > 1:
        grid = factored_grid(grid, grids, per_super)
        assert grid is not None
    job = dict(op=EMU_MATMUL, fmt=FMT[fmt], m=m, n=n, k=k, lda=k + pad, ldb=ldb, ldc=n + pad,
               accumulate=int(accumulate), threads=threads, a=x.tobytes(), b=raw.tobytes(),
               c=window.tobytes(), c_size=window.nbytes, b_offset=b_offset, s=grid.tobytes(),
               s_ld=grid.shape[1], s_bk=bk, s_finite=int(finite),
               s_half=int(grid.dtype == np.float16), s_per_super=per_super)
    if f.kpack > 1:  # the 4-bit walks' two decodes (nm_set_nibble_decode), either forced
        job["nibble_decode"] = int(rng.integers(2))
    if packed_layout:  # one group a call at m = 1, or two (nm_set_gemv_streams), either forced
        job["gemv_streams"] = streams or int(rng.integers(1, 3))
        slivers = pack_slivers(np.ascontiguousarray(raw[:, :n]), AVX512_PACK_WIDTH,
                               f.packed_xor)
        job = dict(job, op=EMU_MATMUL_PACKED, ldb=0, b=slivers.tobytes(), b_offset=0)
        cols = slivers.shape[0] * AVX512_PACK_WIDTH
        if per_super > 1 and rng.integers(2):  # factored, group-major, as packed weights keep it
            sm = factored_sliver_major(grid, grids, -(-k // bk), AVX512_PACK_WIDTH)
            groups = cols // AVX512_PACK_WIDTH  # n's groups only: the offsets' groups follow
            sm = np.ascontiguousarray(sm.reshape(grids, -1, *sm.shape[1:])[:, :groups])
            sm = sm.reshape(grids * groups, *sm.shape[2:])
            job = dict(job, s=sm.tobytes(), s_ld=AVX512_PACK_WIDTH,
                       s_lsl=sm.shape[1] * AVX512_PACK_WIDTH)
        elif per_super <= 1 and rng.integers(2):  # group-major (nm_scales.lsl)
            sm = sliver_major(grid[:, :cols], grids, AVX512_PACK_WIDTH)
            job = dict(job, s=sm.tobytes(), s_ld=AVX512_PACK_WIDTH,
                       s_lsl=sm.shape[1] * AVX512_PACK_WIDTH)
    return job, want, (m, n + pad, n)


@pytest.mark.parametrize("fmt,finite", [("e4m3fn", False), ("e4m3fn", True), ("e5m2", False),
                                        ("e5m2", True), ("q8_0", False), ("q4_0", False),
                                        ("q4_1", False), ("q5_1", False)])
def test_scaled_matmul_over_tile_edges_equals_the_scalar_row(emulator, fmt, finite):
    """Row-major and packed weights of the scaled formats with blocks of scales (1, 4, 128
    rows or all of k; twice that for the 4-bit formats), FP8 on the exact kernels (NaN/Inf
    codes present) and the finite-weights ones; the GGUF formats with any codes (Q4_1 and
    Q5_1 with offsets)."""
    rng = np.random.default_rng(30 + FMT[fmt] + 2 * finite)
    f = nm.get_format(fmt)
    cases = []
    for m in (1, 2, 3, 4, 9, 17):
        for n in (1, 15, 16, 17, 31, 32, 33, 65, 97, 200):
            cases.append(fp8_case(rng, fmt, m, n, int(rng.choice([0, 1, 3, 17, 129, 300])),
                                  accumulate=bool(rng.integers(2)),
                                  threads=int(rng.choice([1, 2, 3, 7])), finite=finite,
                                  pad=int(rng.choice([0, 5])),
                                  b_offset=int(rng.choice([0, 1, 3])),
                                  packed_layout=bool(rng.integers(2))))
    cases.append(fp8_case(rng, fmt, 5, 1100, 300, accumulate=False, threads=7, finite=finite))
    if not f.special_bits:
        cases += two_group_cases(rng, fmt, half=False)
    check_matmul(run(emulator, [c[0] for c in cases]), cases)


def two_group_cases(rng, fmt: str, *, half: bool, per_super: int = 0) -> list:
    """Packed m = 1 jobs over two whole groups and more (2 + a tail, 4 + a tail), on one
    thread and two, one group a call and two (the row's pair walks, where it has them); on a
    factored grid of per_super blocks a super-block, k through 1 and 3 super-blocks."""
    ks = ([4 * nm.get_format(fmt).kpack * per_super * s for s in (1, 3)] if per_super
          else [64, 130, 300])
    return [fp8_case(rng, fmt, 1, n, int(rng.choice(ks)), accumulate=bool(acc),
                     threads=threads, finite=False, packed_layout=True, half=half,
                     per_super=per_super, streams=streams)
            for n, threads, acc in ((300, 1, 0), (520, 2, 1)) for streams in (1, 2)]


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1", "q5_1"])
def test_binary16_scale_grids_equal_the_scalar_row(emulator, fmt):
    """The GGUF formats on binary16 grids of scales and offsets (nm_scales.s16: the packed
    gemvs' own kernels at m = 1 and 2, the frame widening them for the rest), row-major and
    packed, over tile edges and blocks of scales."""
    rng = np.random.default_rng(50 + FMT[fmt])
    cases = [fp8_case(rng, fmt, m, n, int(rng.choice([2, 18, 130, 300])),
                      accumulate=bool(rng.integers(2)), threads=int(rng.choice([1, 2, 7])),
                      finite=False, pad=int(rng.choice([0, 5])), packed_layout=packed,
                      half=True)
             for m in (1, 2, 3, 4, 9) for n in (15, 32, 33, 97, 200) for packed in (False, True)]
    cases += two_group_cases(rng, fmt, half=True)
    check_matmul(run(emulator, [c[0] for c in cases]), cases)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "q5_1"])
def test_factored_scale_grids_equal_the_scalar_row(emulator, fmt):
    """The K types' forms on factored grids (nm_scales.c8: int8 codes, a float32 factor per
    super-block; the frame multiplies them out with the row's widen_factored), row-major and
    packed (row-major or group-major grids), m = 1, 2, 3 and 9, k past the m <= 2 walks'
    chunks of 512 rows."""
    rng = np.random.default_rng(60 + FMT[fmt])
    kpack = nm.get_format(fmt).kpack
    cases = []
    for m in (1, 2, 3, 9):
        for n in (15, 33, 200):
            per_super = int(rng.choice([2, 4, 8]))
            k = 4 * kpack * per_super * int(rng.choice([1, 3, 20]))
            cases.append(fp8_case(rng, fmt, m, n, k, accumulate=bool(rng.integers(2)),
                                  threads=int(rng.choice([1, 2, 7])), finite=False,
                                  pad=int(rng.choice([0, 5])), packed_layout=bool(rng.integers(2)),
                                  per_super=per_super))
    cases += two_group_cases(rng, fmt, half=False, per_super=4)
    check_matmul(run(emulator, [c[0] for c in cases]), cases)


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_fp8_every_pattern_under_scales_through_every_path(emulator, fmt):
    """The 256 codes in every column position of a 1024-column row, under four scales (one
    per 256 columns, a subnormal-making one included), on the gemv (m = 1), the two-row gemv
    (m = 2) and the tiles (m = 9), row-major and packed."""
    rng = np.random.default_rng(40 + FMT[fmt])
    bits = np.tile(np.arange(256, dtype=np.uint8), 4)
    columns = np.repeat(np.array([1.0, 2.0**-7, 3.3, 1e-38], np.float32), 256)
    cases = [fp8_case(rng, fmt, m, 1024, 1, accumulate=True, threads=2, finite=False,
                      bits=bits, scales=nm.Scales.columns(columns), packed_layout=packed)
             for m in (1, 2, 9) for packed in (False, True)]
    check_matmul(run(emulator, [c[0] for c in cases]), cases)
