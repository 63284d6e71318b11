"""Hostile and hard inputs: property tests against the reference, 64-bit sizes, leaks and
reference counts, and the Python suite under a sanitized build of the extension."""

import gc
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from conftest import ISAS, assert_same_bits
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import narrowmm as nm
from narrowmm import ops
from narrowmm.providers.native import core, use_isa

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 65504.0, 3e38,
                     6e-8, 2.0**-24, 1.0, -1.0], np.float32)


def _values(rng, shape, specials: bool) -> np.ndarray:
    v = rng.standard_normal(shape).astype(np.float32)
    if specials and v.size:
        mask = rng.random(shape) < 0.15
        v[mask] = rng.choice(SPECIALS, size=int(mask.sum()))
    return v


def _layout(a: np.ndarray, kind: str) -> np.ndarray:
    """The same values as ``a`` in another memory layout."""
    if kind == "c":
        return np.ascontiguousarray(a)
    if kind == "sub-block":  # a view into a bigger parent (row stride > width, offset)
        parent = np.zeros((a.shape[0] + 2, a.shape[1] + 3), a.dtype)
        parent[1:-1, 2:-1] = a
        return parent[1:-1, 2:-1]
    if kind == "odd-address":  # data at an odd byte address
        raw = np.zeros(a.nbytes + 1, np.uint8)
        view = raw[1:].view(a.dtype).reshape(a.shape)
        view[...] = a
        return view
    if kind == "fortran":
        return np.asfortranarray(a)
    if kind == "reversed":
        return np.ascontiguousarray(a[::-1])[::-1]
    raise AssertionError(kind)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(["f32", "fp16", "bf16"]), m=st.integers(0, 7),
       k=st.integers(0, 9), n=st.integers(0, 40), seed=st.integers(0, 2**32 - 1),
       specials=st.booleans(), x_layout=st.sampled_from(
           ["c", "sub-block", "odd-address", "fortran", "reversed"]),
       w_layout=st.sampled_from(["c", "sub-block", "odd-address"]),
       out_layout=st.sampled_from([None, "c", "sub-block", "fortran", "reversed"]),
       accumulate=st.booleans(), provider=st.sampled_from(["native", "numpy"]),
       isa=st.sampled_from(ISAS), threads=st.integers(1, 4))
def test_any_layout_matches_the_reference(fmt, m, k, n, seed, specials, x_layout, w_layout,
                                          out_layout, accumulate, provider, isa, threads):
    rng = np.random.default_rng(seed)
    x = _values(rng, (m, k), specials)
    w = nm.Weights.encode(_values(rng, (k, n), specials), fmt)
    start = _values(rng, (m, n), False)
    with nm.use_provider("reference"):
        want = nm.matmul(x, w, out=start.copy(), accumulate=True) if accumulate and out_layout \
            else nm.matmul(x, w)
    wv = nm.Weights.from_bits(_layout(w.bits, w_layout), fmt)
    out = None if out_layout is None else _layout(start, out_layout)
    before = nm.get_num_threads()
    try:
        nm.set_num_threads(threads)
        with use_isa(isa), nm.use_provider(provider):
            got = nm.matmul(_layout(x, x_layout), wv, out=out,
                            accumulate=accumulate and out is not None)
    finally:
        nm.set_num_threads(before)
    assert_same_bits(np.ascontiguousarray(got), want)


def test_weights_over_2_gib_use_64_bit_offsets():
    """A 8192 x 151,936 fp16 vocabulary projection: 2.49 GB, past every 32-bit byte offset.
    Only two weights are non-zero; the untouched pages cost no memory."""
    k, n = 8192, 151936
    bits = np.zeros((k, n), np.uint16)
    bits[k - 1, n - 1] = 0x3C00  # 1.0 at the far end
    bits[k - 2, 5] = 0xC000      # -2.0
    w = nm.Weights.from_bits(bits, "fp16")
    assert w.nbytes > 2**31
    x = np.zeros((2, k), np.float32)
    x[:, k - 1] = 3.0
    x[:, k - 2] = 0.5
    for m in (1, 2):  # the streaming and the packed path
        y = nm.matmul(x[:m], w)
        assert y[0, n - 1] == 3.0 and y[0, 5] == -1.0
        assert np.count_nonzero(y) == 2 * m


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_no_leaks_over_100000_calls_of_every_entry_point():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    w = nm.Weights.encode(rng.standard_normal((16, 8)).astype(np.float32), "bf16")
    out = np.empty((2, 8), np.float32)
    bits = w.bits.copy()
    vals = rng.standard_normal(64).astype(np.float32)
    c = core()
    bad_out = np.empty((2, 9), np.float32)
    q = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    kv = rng.standard_normal((1, 1, 5, 4)).astype(np.float32)
    allowed = rng.random((1, 1, 3, 5)) < 0.7
    att_out = np.empty((1, 3, 2, 4), np.float32)
    out2 = np.empty_like(x)
    w8 = nm.Weights.quantize(rng.standard_normal((16, 8)).astype(np.float32), "e4m3fn",
                             (4, 4))
    grid, bk, finite = w8.kernel_scales(8)

    def calls():
        nm.matmul(x, w, out=out)
        nm.matmul(x[0], w)
        nm.encode(vals, "fp16")
        nm.decode(bits, "bf16")
        nm.Weights.from_bits(bits, "bf16")
        c.matmul(2, x, bits, out, True)
        c.attention(q, kv, kv, allowed, 0.5, att_out)
        c.rms_norm(x, 1e-5, out2)
        c.silu(x, out2)
        nm.matmul(x, w8, out=out)                                    # FP8 with scales
        c.matmul(3, x, w8.bits, out, False, grid, bk, not finite)
        nm.decode(nm.encode(vals, "e5m2", saturate=True), "e5m2")
        for bad in (lambda: nm.matmul(x.astype(np.float64), w),      # TypeError path
                    lambda: c.matmul(3, x, w8.bits, out, False),     # scales missing
                    lambda: c.matmul(3, x, w8.bits, out, False, grid[:, :5], bk, True),
                    lambda: c.matmul(3, x, w8.bits, out, False, "s", bk, True),
                    lambda: c.matmul(2, x, bits, out, False, grid, bk, True),
                    lambda: ops.attention(q, kv, kv, allowed[..., :4], scale=1.0),
                    lambda: c.silu(x, bad_out),
                    lambda: c.attention(q, kv, kv, None, 0.5, bad_out),
                    lambda: c.rms_norm(x, 1e-5, bad_out),
                    lambda: nm.matmul(x, w, out=bad_out),            # ValueError path
                    lambda: c.matmul(2, x, bits, bad_out, False),    # C-level checks
                    lambda: c.matmul(2, "x", bits, out, False),
                    lambda: nm.decode(np.ones(3, np.uint32), "bf16")):
            try:
                bad()
            except (TypeError, ValueError):
                pass

    refs = [sys.getrefcount(a) for a in (x, w, out, bits, vals, bad_out, q, kv, allowed, grid)]
    for _ in range(2000):  # warm every cache
        calls()
    gc.collect()
    tracemalloc.start()
    rss0 = _rss()
    snap0 = tracemalloc.take_snapshot()
    for _ in range(100_000 // 10):
        for _ in range(10):
            calls()
    gc.collect()
    snap1 = tracemalloc.take_snapshot()
    rss1 = _rss()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in snap1.compare_to(snap0, "filename") if s.size_diff > 0)
    assert grown < 64 * 1024, f"Python allocations grew by {grown} bytes"
    assert rss1 - rss0 < 8 << 20, f"RSS grew by {(rss1 - rss0) >> 10} KiB"
    assert [sys.getrefcount(a) for a in (x, w, out, bits, vals, bad_out, q, kv, allowed,
                                         grid)] == refs


def _libasan() -> str | None:
    cc = shutil.which("gcc")
    if cc is None:
        return None
    path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def test_python_suite_under_a_sanitized_extension(tmp_path):
    """Build narrowmm._core with ASan + UBSan, and run the matmul, codec and error tests
    against it in a subprocess (libasan preloaded into the uninstrumented interpreter)."""
    asan = _libasan()
    if shutil.which("cmake") is None or asan is None:
        if IN_CI:
            pytest.fail("CI must provide cmake and gcc's libasan")
        pytest.skip("cmake or libasan not available")
    build = tmp_path / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(build), *generator,
                 "-DNM_SANITIZE=address,undefined", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                 f"-DPython_EXECUTABLE={sys.executable}"],
                ["cmake", "--build", str(build)]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
    pkg = tmp_path / "site"
    shutil.copytree(ROOT / "src" / "narrowmm", pkg / "narrowmm")
    for so in build.glob("_core*.so"):
        shutil.copy(so, pkg / "narrowmm")
    env = {**os.environ, "PYTHONPATH": str(pkg), "LD_PRELOAD": asan,
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "-p", "no:warnings", str(ROOT / "tests" / "test_matmul.py"),
         str(ROOT / "tests" / "test_errors.py"), str(ROOT / "tests" / "test_threads.py"),
         str(ROOT / "tests" / "test_model_ops.py"), str(ROOT / "tests" / "test_fp8.py"),
         "-k", "not fork and not env_var and not default_is and not torch"],
        capture_output=True, text=True, env=env, timeout=1200, cwd=tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-4000:]
    assert "AddressSanitizer" not in text and "runtime error" not in text
    assert str(pkg) in subprocess.run(
        [sys.executable, "-c", "import narrowmm; print(narrowmm.__file__)"],
        capture_output=True, text=True, env=env).stdout
