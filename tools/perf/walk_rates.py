"""narrowmm perf harness: is a packed m <= 2 walk held back by its decode or by memory?

For each format, ``nm.matmul(x, w, out=out)`` on packed weights, one row of x (``--rows``:
2 for the two-row walks, more for the tiled path), timed twice:

- hot: one matrix of about 512 KiB of stored bytes (codes and the kernels' scales), called
  again and again, so it stays in L2: the decode's own speed. The rate is the difference
  between that matrix and one of half its rows, which takes off the Python call and its
  checks (about 4 us a call).
- cold: ``--shape`` (4096 x 11008 by default, the kernel bench's ffn_up) in copies used in
  rotation, about 1 GiB in all: the weights come from memory, as in a model's decode step.

It prints, per format, the hot rate (G weights, GB of stored bytes and GFLOP a second), the
cold call's median microseconds and rates, and cold against hot; and the machine's read probe
(one thread of vector loads over 4 x the last-level cache, as ``narrowmm bench`` measures
it). A walk whose cold rate is near its hot rate is bound by its decode; one whose cold rate
is near the read probe, by memory. It backs figures in docs/results/; it is not part of the
library or its tests, and its times are not the bench's claims (``narrowmm bench`` makes
those). The walks' settings apply as in the library (NARROWMM_NIBBLE_DECODE,
NARROWMM_GEMV_PREFETCH_BYTES): an A/B of a setting runs the harness once per value.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE NARROWMM_NUM_THREADS=1 \\
        python3 tools/perf/walk_rates.py --format q4_0 --format q8_0 --format bf16
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import narrowmm as nm
from narrowmm._arena import weight_arena
from narrowmm._arrays import aligned_empty
from narrowmm.bench.kernels import gguf_converted_weights
from narrowmm.bench.machine import l3_bytes
from narrowmm.bench.results import GGUF_CONVERTED_FORMATS, QUANTIZED_FORMATS
from narrowmm.providers.native import core

DEFAULT_FORMATS = ("q4_0", "q4_1", "q4_k", "q8_0", "q6_k", "bf16")
HOT_BYTES = 512 << 10
COLD_BYTES = 1 << 30


def weights(fmt: str, k: int, n: int, rng: np.random.Generator) -> nm.Weights:
    """(k, n) weights of ``fmt`` as the kernel bench makes them."""
    if fmt in GGUF_CONVERTED_FORMATS:
        return gguf_converted_weights(k, n, fmt, rng)
    raw = ((rng.random((k, n), dtype=np.float32) - 0.5) * 0.1).astype(np.float32)
    if fmt in QUANTIZED_FORMATS:
        return nm.Weights.quantize(raw, fmt)
    return nm.Weights.encode(raw, fmt)


def packed(w: nm.Weights) -> tuple[nm.PackedWeights, int]:
    """``w`` packed for the row in use, its kernels' scales made (as a loaded model has
    them), and its stored bytes: codes and scales."""
    p = w.pack()
    scales = p.kernel_scales()
    return p, p.nbytes + (scales[0].nbytes if scales is not None else 0)


def more_copies(w: nm.Weights, count: int) -> list[nm.PackedWeights]:
    """``count`` packed copies of ``w``, each on bits of its own (as :func:`packed`), side by
    side on huge pages as a model's load places them (``weight_arena``; its setting,
    NARROWMM_HUGE_PAGES, read now)."""
    with weight_arena():
        return [packed(nm.Weights.from_bits(w.bits.copy(), w.format, w.scales, w.offsets))[0]
                for _ in range(count)]


def median_seconds(call: Callable[[int], object], calls: int) -> float:
    """Median seconds of ``calls`` calls of ``call(i)``, after one untimed round."""
    for i in range(min(calls, 8)):
        call(i)
    times = []
    for i in range(calls):
        start = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def walk_seconds(fmt: str, k: int, n: int, copies: int, calls: int, rng: np.random.Generator,
                 m: int = 1) -> tuple[float, int]:
    """Median seconds of a call with ``m`` rows of x on ``copies`` packed (k, n) matrices in
    rotation, and the stored bytes of one."""
    w = weights(fmt, k, n, rng)
    nbytes = packed(w)[1]
    mats = more_copies(w, copies)
    x = ((rng.random((m, k), dtype=np.float32) - 0.5) * 0.1).astype(np.float32)
    out = np.empty((m, n), np.float32)
    return median_seconds(lambda i: nm.matmul(x, mats[i % len(mats)], out=out), calls), nbytes


def read_probe_gbs() -> float:
    """One thread's read probe over 4 x the last-level cache (at most 2 GiB), best of 5."""
    n = min(4 * l3_bytes(), 2 << 30) // 4
    buf = aligned_empty(n - n % 64, np.float32)
    buf.fill(1.0)
    return max(buf.nbytes / core().probe_read(1, buf) for _ in range(5)) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", action="append", default=[], dest="formats",
                        help=f"repeatable; default {', '.join(DEFAULT_FORMATS)}")
    parser.add_argument("--shape", default="4096x11008", help="cold shape, k x n")
    parser.add_argument("--calls", type=int, default=60, help="timed cold calls")
    parser.add_argument("--rows", type=int, default=1,
                        help="m: rows of x (1 and 2: the walks; more: the tiled path)")
    args = parser.parse_args()
    if not 1 <= args.rows <= 64:
        parser.error(f"--rows must be in 1..64, not {args.rows}")
    k, n = (int(v) for v in args.shape.split("x"))
    rng = np.random.default_rng(0)
    m = args.rows
    print(f"isa {core().isa()}, m = {m}, {nm.get_num_threads()} thread(s), read probe "
          f"{read_probe_gbs():.1f} GB/s; hot: ~{HOT_BYTES >> 10} KiB, cold: {k} x {n} "
          f"in copies of ~{COLD_BYTES >> 20} MiB in all")
    print(f"{'format':8} {'hot Gw/s':>9} {'GB/s':>6} {'GFLOP/s':>8} {'cold us':>9} {'Gw/s':>6} "
          f"{'GB/s':>6} {'GFLOP/s':>8} {'cold/hot':>8}")
    for fmt in args.formats or DEFAULT_FORMATS:
        per_weight = packed(weights(fmt, 256, 1024, rng))[1] / (256 * 1024)
        hot_k = max(512, int(HOT_BYTES / per_weight / 512) // 512 * 512)
        full, _ = walk_seconds(fmt, hot_k, 512, 1, 2000, rng, m)
        half, _ = walk_seconds(fmt, hot_k // 2, 512, 1, 2000, rng, m)
        hot_w = hot_k // 2 * 512 / (full - half)  # weights a second, the call's cost off
        copies = max(2, COLD_BYTES // int(per_weight * k * n))
        cold, cold_bytes = walk_seconds(fmt, k, n, copies, args.calls, rng, m)
        cold_w = k * n / cold
        print(f"{fmt:8} {hot_w / 1e9:9.1f} {hot_w * per_weight / 1e9:6.1f} "
              f"{2 * m * hot_w / 1e9:8.1f} {cold * 1e6:9.1f} {cold_w / 1e9:6.1f} "
              f"{cold_bytes / cold / 1e9:6.1f} {2 * m * cold_w / 1e9:8.1f} {cold_w / hot_w:8.2f}")

if __name__ == "__main__":
    main()
