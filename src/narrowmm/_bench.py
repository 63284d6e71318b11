"""``narrowmm bench``: median time per call on Llama weight shapes, against NumPy float32.

Both sides multiply the same matrix: NumPy gets the narrow weights' exact float32 values.
Every narrowmm result is checked bit for bit against the NumPy provider on a few columns
before it is timed (a benchmark of a wrong kernel is worthless).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from ._api import matmul
from ._check import same_bits
from ._weights import Weights
from .providers import use_provider

# (name, k, n): k input features, n output features, as in the seed's benchmark
LLAMA_SHAPES = (
    ("q_proj 1B", 2048, 2048),
    ("q_proj 8B", 4096, 4096),
    ("ffn_up 8B", 4096, 11008),
    ("ffn_down 8B", 11008, 4096),
)
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


@dataclass
class Result:
    system: str
    format: str
    shape: str
    k: int
    n: int
    m: int
    median_ms: float
    min_ms: float
    max_ms: float
    calls: int


def time_calls(fn: Callable[[], object], min_calls: int, budget_s: float) -> list[float]:
    """Call ``fn`` once to warm up, then until ``min_calls`` calls and ``budget_s`` seconds
    have both passed; return each call's time in ms."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 1000:
            break
    return times


def _verify(x: np.ndarray, w: Weights, y: np.ndarray) -> None:
    """Bit-check a few output columns against the NumPy provider (same fma chain)."""
    n = w.shape[1]
    cols = np.unique(np.array([0, n // 3, n // 2, n - 1]))
    sub = Weights.from_bits(np.ascontiguousarray(w.bits[:, cols]), w.format)
    with use_provider("numpy"):
        want = matmul(x, sub)
    if not same_bits(y[:, cols], want):
        raise AssertionError(f"narrowmm {w.format.name} result is wrong for {w.shape}")


def blas_info() -> list[dict[str, object]]:
    """What threadpoolctl sees of NumPy's BLAS (empty if threadpoolctl is missing)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("internal_api", "version", "architecture", "num_threads", "threading_layer")
    return [{k: d.get(k) for k in keep} for d in threadpool_info() if d.get("user_api") == "blas"]


def run(shapes: list[tuple[str, int, int]], batches: list[int], formats: list[str],
        min_calls: int, budget_s: float, progress: Callable[[str], None]) -> list[Result]:
    """Time every (shape, batch) for NumPy float32 and for narrowmm in each format."""
    results: list[Result] = []
    for name, k, n in shapes:
        rng = np.random.default_rng(k + n)
        raw = ((rng.random((k, n), dtype=np.float32) - 0.5) * 0.1).astype(np.float32)
        for m in batches:
            x = ((rng.random((m, k), dtype=np.float32) - 0.5) * 0.1).astype(np.float32)
            for fmt in formats:
                w = Weights.encode(raw, fmt)
                w32 = w.decode()  # the same values, as float32, for NumPy
                out = np.empty((m, n), np.float32)
                matmul(x, w, out=out)
                _verify(x, w, out)
                progress(f"{name} m={m} {fmt}")
                t = time_calls(lambda x=x, w=w, out=out: matmul(x, w, out=out),
                               min_calls, budget_s)
                results.append(Result("narrowmm", fmt, name, k, n, m, statistics.median(t),
                                      min(t), max(t), len(t)))
                if fmt == formats[0]:  # one NumPy baseline per (shape, m)
                    ref = np.empty((m, n), np.float32)
                    t = time_calls(lambda x=x, w32=w32, ref=ref: np.matmul(x, w32, out=ref),
                                   min_calls, budget_s)
                    results.append(Result("numpy-f32", "f32", name, k, n, m,
                                          statistics.median(t), min(t), max(t), len(t)))
    return results


def format_table(results: list[Result]) -> str:
    """Rows of shape x batch: NumPy float32 and each narrowmm format, median ms (ratio)."""
    formats = sorted({r.format for r in results if r.system == "narrowmm"},
                     key=["fp16", "bf16", "f32"].index)
    head = f"{'shape':<12}{'m':>5}{'numpy f32':>12}" + "".join(
        f"{'nm ' + f:>20}" for f in formats)
    lines = [head, "-" * len(head)]
    keys = sorted({(r.shape, r.k, r.n, r.m) for r in results},
                  key=lambda t: (t[1] * t[2], t[1], t[3]))
    for shape, _k, _n, m in keys:
        base = next(r for r in results if r.system == "numpy-f32" and (r.shape, r.m) == (shape, m))
        cells = ""
        for f in formats:
            r = next(r for r in results
                     if r.system == "narrowmm" and r.format == f and (r.shape, r.m) == (shape, m))
            cells += f"{r.median_ms:>11.3f} ({base.median_ms / r.median_ms:>4.2f}x)"
        lines.append(f"{shape:<12}{m:>5}{base.median_ms:>12.3f}{cells}")
    lines.append("median ms per call; (Nx) = NumPy float32 time / narrowmm time, higher is "
                 "better")
    return "\n".join(lines)


def main(args) -> int:
    from ._runtime import runtime_info

    if args.shape:
        shapes = [(f"{k}x{n}", k, n) for k, n in args.shape]
    elif args.quick:
        shapes = list(LLAMA_SHAPES[:1])
    else:
        shapes = list(LLAMA_SHAPES)
    batches = args.batch or [1, 16]
    formats = args.format or ["fp16", "bf16"]
    min_calls, budget = (3, 0.2) if args.quick else (5, 1.0)
    info = runtime_info()
    print(f"narrowmm {info['version']} on {info['cpu']}: isa {info['isa']}, "
          f"threads {info['threads']}")
    set_vars = [v for v in BLAS_ENV if os.environ.get(v)]
    if set_vars:
        print(f"note: {', '.join(f'{v}={os.environ[v]}' for v in set_vars)} is set and slows "
              f"NumPy's BLAS; for a fair baseline run: env -u OPENBLAS_CORETYPE "
              f"-u OPENBLAS_L2_SIZE narrowmm bench")
    for b in blas_info():
        print(f"numpy BLAS: {b.get('internal_api')} {b.get('version')} "
              f"kernel {b.get('architecture')}, {b.get('num_threads')} threads")

    def progress(what: str) -> None:
        print(f"  timing {what} ...", flush=True)

    results = run(shapes, batches, formats, min_calls, budget, progress)
    print()
    print(format_table(results))
    if args.json:
        doc = {"runtime": info, "blas": blas_info(),
               "env": {v: os.environ.get(v) for v in BLAS_ENV},
               "results": [asdict(r) for r in results]}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
        print(f"wrote {args.json}")
    return 0
