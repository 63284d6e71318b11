"""``narrowmm check``: a self-test a user runs on their own machine.

Each check compares the native core, on every ISA row this CPU supports, with the
pure-Python reference, bit for bit, and reports pass/fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ._api import decode, encode, matmul
from ._formats import FORMATS
from ._scales import Scales
from ._weights import Weights
from .providers import clear_cache, use_provider
from .providers.native import core, supported_isas, use_isa


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit equality of float32 arrays, where NaN only has to meet NaN (payloads are free)."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    if a.shape != b.shape:
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        return False
    return bool(np.array_equal(a.view(np.uint32)[~nan_a], b.view(np.uint32)[~nan_b]))


def _code_count(fmt: str) -> int:
    """How many stored patterns the format has: 65,536 for the 16-bit ones, 256 for the
    8-bit ones, 32 for Q5_1 (a byte past 31 is no code)."""
    f = FORMATS[fmt]
    return 1 << (f.code_bits or 8 * f.itemsize)


def _all_codes(fmt: str) -> np.ndarray:
    """Every bit pattern of the format (:func:`_code_count` of them)."""
    return np.arange(_code_count(fmt), dtype=np.uint32).astype(FORMATS[fmt].storage)


def _decode_sweep(fmt: str) -> str | None:
    bits = _all_codes(fmt)
    got = decode(bits, fmt)
    with use_provider("reference"):
        want = decode(bits, fmt)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    return None if bad.size == 0 else f"{bad.size} patterns differ, first {bits[bad[0]]:#06x}"


def _encode_sample(fmt: str) -> str | None:
    rng = np.random.default_rng(1)
    words = np.concatenate([
        rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32),
        np.arange(0x7F7FF000, 0x7F801000, dtype=np.uint32),  # around max and Inf
        np.arange(0x33000000, 0x33001000, dtype=np.uint32),  # around fp16's 2^-25
        np.arange(0, 4096, dtype=np.uint32),                 # float32 subnormals
    ])
    values = words.view(np.float32)
    modes = (False, True) if FORMATS[fmt].itemsize == 1 else (False,)
    if FORMATS[fmt].integer:  # codes hold no NaN, and only saturate takes every value
        values, modes = values[~np.isnan(values)], (True,)
    if FORMATS[fmt].kpack > 1:  # two codes a byte: pairs of values
        values = values[:values.size // 2 * 2].reshape(-1, 2)
    for saturate in modes:
        options = {"saturate": True} if saturate else {}
        got = encode(values, fmt, **options)
        with use_provider("reference"):
            want = encode(values, fmt, **options)
        bad = np.flatnonzero(got != want)
        if bad.size:
            return f"{bad.size} values differ, first {words[bad[0]]:#010x}"
    return None


def _kernel_sweep(fmt: str, rows: int) -> str | None:
    """Every weight pattern times 1.0 into a zeroed C: equals the decoded value (+0 for
    -0; FP8 with the scale 1.0); rows=2 adds a zero-weighted row so the m > 1 (two-row
    gemv) path runs."""
    f = FORMATS[fmt]
    bits = _all_codes(fmt)[None, :]
    x = np.zeros((rows, f.kpack), np.float32)  # a 4-bit byte holds two rows: the first
    x[0, 0] = 1.0
    offsets = Scales.tensor(0.0) if f.offsets else None
    got = matmul(x, Weights.from_bits(bits, fmt, offsets=offsets))[0]
    want = decode(bits[0], fmt)
    want = (want[:, 0] if f.kpack > 1 else want) + np.float32(0.0)
    return None if same_bits(got, want) else "kernel output differs from the decoded weights"


def _parity(fmt: str) -> str | None:
    rng = np.random.default_rng(7)
    for m, k, n in ((1, 17, 33), (3, 9, 70), (5, 23, 7), (2, 300, 19)):
        k += k % FORMATS[fmt].kpack  # two rows a byte: an even k
        x = rng.standard_normal((m, k)).astype(np.float32)
        w32 = rng.standard_normal((k, n)).astype(np.float32)
        # FP8 with one scale per column, as checkpoints carry them
        w = Weights.quantize(w32, fmt) if FORMATS[fmt].scaled else Weights.encode(w32, fmt)
        got = matmul(x, w)
        with use_provider("reference"):
            want = matmul(x, w)
        if not same_bits(got, want):
            return f"m={m} k={k} n={n}: differs from the reference"
    return None


def _on_row(isa: str, check: Callable[[], str | None]) -> Callable[[], str | None]:
    def run() -> str | None:
        with use_isa(isa):
            clear_cache()
            try:
                with use_provider("native"):
                    return check()
            finally:
                clear_cache()

    return run


def checks() -> list[tuple[str, Callable[[], str | None]]]:
    """(name, check) pairs; a check returns None on success or what went wrong."""
    items: list[tuple[str, Callable[[], str | None]]] = []
    if core() is None:
        return [("native core loads", lambda: "narrowmm._core did not load")]
    for isa in supported_isas():
        for fmt in (f.name for f in FORMATS.values() if f.has_codec):
            codes = f"{_code_count(fmt):,}"
            items.append((f"[{isa}] decode {fmt}: all {codes} patterns",
                          _on_row(isa, lambda f=fmt: _decode_sweep(f))))
            items.append((f"[{isa}] encode {fmt}: edge and random values",
                          _on_row(isa, lambda f=fmt: _encode_sample(f))))
            items.append((f"[{isa}] matmul {fmt}: {codes}-pattern sweep, m=1",
                          _on_row(isa, lambda f=fmt: _kernel_sweep(f, 1))))
            items.append((f"[{isa}] matmul {fmt}: {codes}-pattern sweep, m=2",
                          _on_row(isa, lambda f=fmt: _kernel_sweep(f, 2))))
        for fmt in FORMATS:
            items.append((f"[{isa}] matmul {fmt}: random shapes vs reference",
                          _on_row(isa, lambda f=fmt: _parity(f))))
    return items


def run_checks() -> int:
    """Run every check, print one line each, return the number of failures."""
    failures = 0
    items = checks()
    for name, check in items:
        t0 = time.perf_counter()
        try:
            problem = check()
        except Exception as exc:  # a crash is a failure to report, not to hide
            problem = f"{type(exc).__name__}: {exc}"
        dt = time.perf_counter() - t0
        status = "PASS" if problem is None else "FAIL"
        failures += problem is not None
        print(f"{status}  {name}  ({dt:.2f} s){'' if problem is None else ': ' + problem}")
    print(f"{len(items) - failures} passed, {failures} failed")
    return failures
