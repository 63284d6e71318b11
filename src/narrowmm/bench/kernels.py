"""``narrowmm bench``: narrowmm against the machine's limits and its peers, in one run.

Every system multiplies the same matrix: the narrow weights' exact values (NumPy and
PyTorch float32 get them as float32). Limits (read bandwidth, float32 FMA peak) are
measured at the start of the run by the C core's probes. ``cold`` rotates through enough
weight copies that each call finds its weights outside the last-level cache, as in a model's
forward pass; ``warm`` reuses one copy. Each system's output is checked once before it is
timed: narrowmm bit for bit against the NumPy provider, peers against narrowmm's exact
result within their precision. docs/bench.md documents the JSON schema.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._api import matmul
from .._arrays import aligned_empty
from .._check import same_bits
from .._scales import Scales
from .._threads import get_num_threads
from .._weights import PackedWeights, Weights
from ..checkpoints._gguf_blocks import FP16_FIELDS, as_torch_weights, convert
from ..checkpoints.gguf import GGML_TYPES, GGMLType
from ..providers import use_provider
from ..providers.native import core, use_isa
from .machine import (
    ColdPlan,
    all_threads,
    blas_info,
    l3_bytes,
    measure_limits,
    memory_budget,
    parse_size,
    peak_rss_bytes,
    release_memory,
    run_line,
)
from .report import Progress, format_summary, format_tables, write_plot
from .results import (
    BLAS_ENV,
    FP8_FORMATS,
    GGUF_CONVERTED_FORMATS,
    LLAMA_SHAPES,
    NARROWMM_FORMATS,
    NARROWMM_SYSTEMS,
    QUANTIZED_FORMATS,
    SCHEMA,
    SLOW_CALL_S,
    Limits,
    Result,
)
from .timing import time_interleaved


@dataclass
class Config:
    shapes: list[tuple[str, int, int]]
    batches: list[int]
    formats: list[str]
    threads: list[int]
    caches: list[str]
    isas: list[str]
    min_calls: int
    budget_s: float
    peers: bool = True
    layouts: list[str] = field(default_factory=lambda: ["rows", "packed"])
    skipped: list[dict[str, Any]] = field(default_factory=list)
    memory_budget: int = 0  # bytes for one case's copies (memory_budget())
    cold_notes: list[str] = field(default_factory=list)  # cases whose rotation was capped


def _check_close(name: str, y: np.ndarray, exact: np.ndarray, tol: float) -> None:
    y = np.asarray(y, np.float64)
    ref = exact.astype(np.float64)
    err = np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30)
    if not err <= tol:
        raise AssertionError(f"{name}: relative error {err:.2e} exceeds {tol:.0e}")


def _verify_narrowmm(x: np.ndarray, w: Weights, y: np.ndarray) -> None:
    """Bit-check a few output columns against the NumPy provider (same fma chain)."""
    n = w.shape[1]
    cols = np.unique(np.array([0, n // 3, n // 2, n - 1]))

    def pick(s: Scales | None) -> Scales | None:
        """The same columns' scales (or offsets), one per column per block of rows."""
        if s is None:
            return None
        grid, bk = s.expanded(w.shape, n)
        return Scales(grid[:, cols], (bk, 1))

    sub = Weights.from_bits(np.ascontiguousarray(w.bits[:, cols]), w.format, pick(w.scales),
                            pick(w.offsets))
    with use_provider("numpy"):
        want = matmul(x, sub)
    if not same_bits(y[:, cols], want):
        raise AssertionError(f"narrowmm {w.format.name} result is wrong for {w.shape}")


def _ggml_type(fmt: str) -> GGMLType:
    """The ggml block type behind a bench format of GGUF_CONVERTED_FORMATS."""
    name = GGUF_CONVERTED_FORMATS[fmt][0]
    return next(t for t in GGML_TYPES.values() if t.name == name)


def gguf_converted_weights(k: int, n: int, fmt: str, rng: np.random.Generator) -> Weights:
    """``(k, n)`` weights of the GGUF block type behind the bench format ``fmt``
    (GGUF_CONVERTED_FORMATS) as ``load_gguf`` gives a file's tensor of it: random bytes for
    the codes and sub-block scales, its fp16 fields drawn from [2^-11, 2^-10) (normal
    numbers: no subnormal scale), converted exactly (checkpoints/_gguf_blocks.py). The
    kernels' time does not depend on the values."""
    t = _ggml_type(fmt)
    return as_torch_weights(convert(t.name, random_blocks(k, n, fmt, rng))).transpose()


def random_blocks(k: int, n: int, fmt: str, rng: np.random.Generator) -> np.ndarray:
    """The blocks behind :func:`gguf_converted_weights`: ``(n, k / block, type size)``
    bytes, a row's blocks along k (GGUF's layout of an ``(n, k)`` tensor)."""
    t = _ggml_type(fmt)
    if k < 1 or n < 1 or k % t.block_size:
        raise ValueError(f"{fmt} (GGUF {t.name}) takes k a positive multiple of its "
                         f"{t.block_size}-row blocks and n >= 1, not k = {k}, n = {n}")
    nb = k // t.block_size
    blocks = rng.integers(0, 256, (n, nb, t.type_size), dtype=np.uint8)
    for at in FP16_FIELDS[t.name]:
        half = (rng.uniform(1.0, 2.0, (n, nb)) * 2.0**-11).astype(np.float16)
        blocks[:, :, at:at + 2] = half.view(np.uint8).reshape(n, nb, 2)
    return blocks


# ---- the systems ----------------------------------------------------------------------

# the packages behind the peers, whose versions the first line gives
KERNEL_PEERS = ("numpy", "torch", "ml_dtypes")


@dataclass
class Case:
    """One (system, format) on one shape: build its weight copies, call it."""

    system: str
    format: str
    weight_bytes: int
    call: Callable[[int], np.ndarray]  # call(i) uses copy i % copies
    tol: float  # relative error allowed against the exact result (narrowmm: bit-exact)
    isa: str | None
    ref_format: str  # whose exact weight values this system multiplies
    # narrowmm at m == 1: probe(i) reads buffer i of a rotation like the weights' (about as
    # many bytes) with the C core's read probe, returning seconds; probe_bytes per read
    probe: Callable[[int], float] | None = None
    probe_bytes: int = 0


def _read_probe(nbytes: int, copies: int) -> tuple[Callable[[int], float] | None, int]:
    """A read probe over ``copies`` float32 buffers of about ``nbytes`` each, used in turn,
    on the current thread count and ISA row; (None, 0) when the buffer would be empty.

    Timed between a system's calls, it gives the read bandwidth of the same moment and the
    same cache state: on a shared machine the bandwidth drifts by tens of percent within
    minutes, more than the start and end probes can tell."""
    n = nbytes // 4 // 64 * 64  # whole 64-float chunks, as probe_read splits them
    if n == 0:
        return None, 0
    bufs = [aligned_empty(n, np.float32) for _ in range(copies)]
    for b in bufs:
        b.fill(1.0)  # touch every page before timing
    c = core()

    def probe(i: int) -> float:
        # the probe splits whole 64-float chunks evenly over the threads: read the longest
        # such prefix (the same aligned start) and scale the time to all n floats
        t = get_num_threads()
        usable = n // (64 * t) * (64 * t)
        if usable == 0:
            t, usable = 1, n
        return c.probe_read(t, bufs[i % len(bufs)][:usable]) * n / usable

    return probe, n * 4


def _for_row(packed: dict[str, list[PackedWeights]], i: int) -> PackedWeights:
    """Copy i of the weights packed for the ISA row in use."""
    copies = packed[core().isa()]
    return copies[i % len(copies)]


def _set_sizes(m: int, exact: dict[str, Weights], cfg: Config, torch: Any,
               ml_dtypes: Any) -> list[int]:
    """The bytes of one copy of every set of arrays _systems rotates through."""
    sizes: list[int] = []
    for fmt in cfg.formats:
        sizes.append(exact[fmt].nbytes)  # the row-major copies (packed ones start from them)
        if "packed" in cfg.layouts:
            sizes += [exact[fmt].nbytes] * len(cfg.isas)
    if m == 1:  # read probes, one set per distinct size
        sizes += sorted({exact[fmt].nbytes for fmt in cfg.formats})
    if cfg.peers:
        k, n = exact[cfg.formats[0]].shape
        sizes.append(4 * k * n)  # numpy-f32
        for fmt in cfg.formats:
            if fmt in ("fp16", "bf16"):
                sizes.append(exact[fmt].nbytes)  # numpy-upcast (ml_dtypes bf16 shares it)
            if fmt in FP8_FORMATS and ml_dtypes is not None:
                sizes.append(exact[fmt].nbytes)
        if torch is not None:
            sizes += [4 * k * n, 2 * k * n, 2 * k * n]
    return sizes


def _prepare(w: Weights | PackedWeights) -> Weights | PackedWeights:
    """Make what a matrix's first native call makes once (the kernels' form of its
    scales, the look at its codes for NaN/Inf), so that the timed calls are the steady
    state a loaded model runs in: a fresh copy per call would otherwise time that
    preparation too (20-30 ms for the ffn_up shape, once per matrix, against a 4 ms call)."""
    if w.scales is not None:
        w.kernel_scales()
    return w


def _systems(name: str, k: int, n: int, m: int, x: np.ndarray, exact: dict[str, Weights],
             plan: ColdPlan, cfg: Config, torch: Any, ml_dtypes: Any) -> list[Case]:
    """The cases for one shape and batch; weight copies are built here, freed after."""
    cases: list[Case] = []
    out = np.empty((m, n), np.float32)
    isa = core().isa()
    probes: dict[int, tuple[Callable[[int], float] | None, int]] = {}
    for fmt in cfg.formats:
        w = exact[fmt]
        copies = [w] + [Weights.from_bits(w.bits.copy(), w.format, w.scales, w.offsets)
                        for _ in range(plan.copies(w.nbytes) - 1)]
        for c in copies:
            _prepare(c)
        probe, probe_bytes = None, 0
        if m == 1:  # fp16 and bf16 share one set of buffers
            if w.nbytes not in probes:
                probes[w.nbytes] = _read_probe(w.nbytes, len(copies))
            probe, probe_bytes = probes[w.nbytes]
        if "rows" in cfg.layouts:
            cases.append(Case("narrowmm", fmt, w.nbytes,
                              lambda i, c=copies: matmul(x, c[i % len(c)], out=out), 0.0, isa,
                              fmt, probe, probe_bytes))
        if "packed" in cfg.layouts:  # packed for each row timed, as a user packs at load
            packed: dict[str, list[PackedWeights]] = {}
            for row in cfg.isas:
                with use_isa(row):
                    packed[row] = [_prepare(c.pack()) for c in copies]
            cases.append(Case("narrowmm-packed", fmt, w.nbytes,
                              lambda i, p=packed: matmul(x, _for_row(p, i), out=out), 0.0, isa,
                              fmt, probe, probe_bytes))
    if not cfg.peers:
        return cases
    base_fmt = cfg.formats[0]
    w32 = exact[base_fmt].decode()
    blas = next((b.get("architecture") for b in blas_info()), None)
    copies32 = [w32] + [w32.copy() for _ in range(plan.copies(w32.nbytes) - 1)]
    cases.append(Case("numpy-f32", "f32", w32.nbytes,
                      lambda i, c=copies32: np.matmul(x, c[i % len(c)]), 1e-4, blas, base_fmt))
    for fmt in (f for f in cfg.formats if f in ("fp16", "bf16")):
        bits = [exact[fmt].bits] + [exact[fmt].bits.copy()
                                    for _ in range(plan.copies(exact[fmt].nbytes) - 1)]
        if fmt == "fp16":
            def up(i, c=bits):
                return np.matmul(x, c[i % len(c)].view(np.float16).astype(np.float32))
        else:
            def up(i, c=bits):
                return np.matmul(x, (c[i % len(c)].astype(np.uint32) << 16).view(np.float32))
        cases.append(Case("numpy-upcast", fmt, exact[fmt].nbytes, up, 1e-4, blas, fmt))
        if fmt == "bf16" and ml_dtypes is not None:
            xb = x.astype(ml_dtypes.bfloat16)
            cases.append(Case("ml_dtypes", "bf16", exact[fmt].nbytes,
                              lambda i, c=bits, xb=xb: np.matmul(
                                  xb, c[i % len(c)].view(ml_dtypes.bfloat16)), 3e-2, None,
                              "bf16"))
    for fmt in (f for f in cfg.formats if f in FP8_FORMATS and ml_dtypes is not None):
        # the NumPy way to FP8 weights: ml_dtypes' upcast, the scales, float32 matmul
        w8 = exact[fmt]
        bits = [w8.bits] + [w8.bits.copy() for _ in range(plan.copies(w8.nbytes) - 1)]
        dtype = getattr(ml_dtypes, "float8_" + fmt)
        grid, _ = w8.scales.expanded(w8.shape, n)  # one row: per-column scales

        def up8(i, c=bits, dtype=dtype, s=grid[0]):
            return np.matmul(x, c[i % len(c)].view(dtype).astype(np.float32) * s)

        cases.append(Case("ml_dtypes", fmt, w8.nbytes, up8, 1e-4, blas, fmt))
    if torch is not None:
        cap = torch.backends.cpu.get_cpu_capability()
        f = torch.nn.functional
        for system, dtype, fmt, tol in (("torch-f32", torch.float32, "f32", 1e-4),
                                        ("torch-bf16", torch.bfloat16, "bf16", 3e-2),
                                        ("torch-f16", torch.float16, "fp16", 3e-2)):
            ref_fmt = fmt if fmt in exact else base_fmt
            src = exact[ref_fmt].decode()
            wt = torch.from_numpy(np.ascontiguousarray(src.T)).to(dtype)  # (n, k) as Linear
            copies_t = [wt] + [wt.clone() for _ in range(
                plan.copies(wt.numel() * wt.element_size()) - 1)]
            xt = torch.from_numpy(x).to(dtype)

            def tcall(i, c=copies_t, xt=xt):
                with torch.inference_mode():
                    return f.linear(xt, c[i % len(c)]).float().numpy()

            cases.append(Case(system, fmt, wt.numel() * wt.element_size(), tcall, tol,
                              f"torch:{cap}", ref_fmt))
    return cases


# ---- running --------------------------------------------------------------------------

def _between(case: Case, evict: Callable[[], None] | None) -> Callable[[int], float] | None:
    """What runs after each timed call of a case: the eviction read, then the paired read
    probe, whose seconds are returned (0.0 without a probe: the times are then dropped)."""
    probe = case.probe
    if evict is None:
        return None if probe is None else (lambda i: probe(i + 1))

    def between(i: int) -> float:
        evict()
        return 0.0 if probe is None else probe(i + 1)

    return between


def _optional(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        return None


def _time_case(cfg: Config, progress: Any, limits: list[Limits], name: str, k: int, n: int,
               m: int, x: np.ndarray, exact: dict[str, Weights],
               reference: dict[str, np.ndarray], cache: str, torch: Any,
               ml_dtypes: Any) -> list[Result]:
    """Build one (shape, m, cache) case's systems within the memory budget, time them on
    every ISA row and thread count, and return the results."""
    results: list[Result] = []
    plan = ColdPlan(_set_sizes(m, exact, cfg, torch, ml_dtypes), cache, cfg.memory_budget)
    cases = _systems(name, k, n, m, x, exact, plan, cfg, torch, ml_dtypes)
    evict = plan.evictor()
    if plan.capped:
        cfg.cold_notes.append(f"{name} m={m}: {plan.describe()}")
    for isa in cfg.isas:
        for t in cfg.threads:
            lim = next(li for li in limits if (li.isa, li.threads) == (isa, t))
            with use_isa(isa), all_threads(t, torch):
                # peers do not depend on narrowmm's row
                mine = [c for c in cases if c.system in NARROWMM_SYSTEMS or isa == cfg.isas[0]]
                progress.note(f"{name} m={m} {cache} {isa} t={t}: checking")
                timed = [c for c in mine
                         if _check_case(c, name, m, t, cache, isa, cfg, reference)]
                progress.note(f"{name} m={m} {cache} {isa} t={t}: timing "
                              f"{len(timed)} systems in turns")
                samples = time_interleaved(
                    [lambda i, c=c: c.call(i + 1) for c in timed], cfg.min_calls,
                    cfg.budget_s, [_between(c, evict) for c in timed])
                for c, (times, probe_ms) in zip(timed, samples, strict=True):
                    r = _result(c, name, k, n, m, t, isa, cache, lim, times,
                                probe_ms if c.probe is not None else [])
                    r.cold_fraction = plan.cold_fraction if cache == "cold" else 0.0
                    results.append(r)
                for c in mine:
                    progress.step(f"{name} m={m} {c.system} {c.format} {cache} {isa} t={t}")
    return results


def run(cfg: Config, progress: Any) -> tuple[list[Limits], list[Result]]:
    """Measure the limits, then every case; returns (limits, results)."""
    torch = _optional("torch") if cfg.peers else None
    ml_dtypes = _optional("ml_dtypes") if cfg.peers else None
    if cfg.peers and torch is None:
        cfg.skipped.append({"system": "torch-*", "reason": "PyTorch is not installed"})
    if cfg.peers and ml_dtypes is None:
        cfg.skipped.append({"system": "ml_dtypes", "reason": "ml_dtypes is not installed"})
    limits = _all_limits(cfg, progress)
    results: list[Result] = []
    for name, k, n in cfg.shapes:
        rng = np.random.default_rng(k + n)
        raw = ((rng.random((k, n), dtype=np.float32) - 0.5) * 0.1).astype(np.float32)
        # FP8 as checkpoints store it (one scale per output column), q8_0 as GGUF does
        # (one per 32 input features of a column): Weights.quantize
        # GGUF's converted types: random blocks, their own draws (x stays the same)
        exact = {fmt: Weights.quantize(raw, fmt) if fmt in QUANTIZED_FORMATS
                 else gguf_converted_weights(k, n, fmt, np.random.default_rng(
                     [k, n, list(GGUF_CONVERTED_FORMATS).index(fmt)]))
                 if fmt in GGUF_CONVERTED_FORMATS
                 else Weights.encode(raw, fmt) for fmt in cfg.formats}
        del raw
        for m in cfg.batches:
            x = ((rng.random((m, k), dtype=np.float32) - 0.5) * 0.1).astype(np.float32)
            reference = {fmt: matmul(x, w) for fmt, w in exact.items()}
            for fmt, w in exact.items():
                _verify_narrowmm(x, w, reference[fmt])
            for cache in cfg.caches:
                # one case at a time: its copies are built inside _time_case and freed
                # with its frame, before the next case builds its own
                results += _time_case(cfg, progress, limits, name, k, n, m, x, exact,
                                      reference, cache, torch, ml_dtypes)
                release_memory()
            del reference
    # Limits again at the end: on a shared machine a probe can lose its core for a moment;
    # the best of both is the machine's limit.
    for li, again in zip(limits, _all_limits(cfg, progress), strict=True):
        li.read_gbps = max(li.read_gbps, again.read_gbps)
        li.fma_gflops = max(li.fma_gflops, again.fma_gflops)
    for r in results:
        lim = next(li for li in limits if li.threads == r.threads and
                   li.isa == (r.isa if r.system in NARROWMM_SYSTEMS else cfg.isas[0]))
        r.pct_of_limit = 100.0 * (r.gbps / lim.read_gbps if r.m == 1
                                  else r.gflops / lim.fma_gflops)
    return limits, results


def _all_limits(cfg: Config, progress: Any) -> list[Limits]:
    limits = []
    for isa in cfg.isas:
        for t in cfg.threads:
            progress.note(f"measuring limits: {isa}, {t} thread(s)")
            limits.append(measure_limits(t, isa, cfg.budget_s < 0.5, cfg.memory_budget))
    return limits


def _check_case(case: Case, name: str, m: int, t: int, cache: str, isa: str, cfg: Config,
                reference: dict[str, np.ndarray]) -> bool:
    """Warm a case up and check its output (narrowmm: the exact bits); False, with a note
    in ``cfg.skipped``, when one call takes longer than SLOW_CALL_S."""
    t0 = time.perf_counter()
    y = case.call(0)  # warm-up, and the output to check
    first = time.perf_counter() - t0
    exact = reference[case.ref_format]
    if case.system in NARROWMM_SYSTEMS:
        if not same_bits(y, exact):
            raise AssertionError(f"narrowmm {case.format} on {isa} differs from the reference")
    else:
        _check_close(f"{case.system} {case.format}", y, exact, case.tol)
    if first > SLOW_CALL_S:
        cfg.skipped.append({"system": case.system, "format": case.format, "shape": name,
                            "m": m, "threads": t, "cache": cache,
                            "reason": f"one call took {first:.1f} s (limit {SLOW_CALL_S} s)"})
        return False
    return True


def _result(case: Case, name: str, k: int, n: int, m: int, t: int, isa: str, cache: str,
            lim: Limits, times: list[float], probe_ms: list[float]) -> Result:
    """The figures of one timed case: medians, rates, and the fractions of the limits."""
    med = statistics.median(times)
    gbps = case.weight_bytes / (med * 1e-3) / 1e9
    gflops = 2.0 * m * k * n / (med * 1e-3) / 1e9
    if m == 1:
        limit, pct = "read_gbps", 100.0 * gbps / lim.read_gbps
    else:
        limit, pct = "fma_gflops", 100.0 * gflops / lim.fma_gflops
    paired = pct_paired = 0.0
    if probe_ms:
        paired = case.probe_bytes / (statistics.median(probe_ms) * 1e-3) / 1e9
        pct_paired = 100.0 * gbps / paired
    return Result(case.system, case.format, name, k, n, m, t, cache,
                  isa if case.system in NARROWMM_SYSTEMS else case.isa, med, min(times),
                  max(times), len(times), case.weight_bytes, gbps, gflops, limit, pct, paired,
                  pct_paired)


# ---- the command ----------------------------------------------------------------------

def build_config(args: Any) -> Config:
    available = [name for name, ok, _ in core().isa_rows() if ok]
    if args.isa:
        isas = args.isa.split(",")
        unknown = [i for i in isas if i not in available]
        if unknown:
            raise SystemExit(f"narrowmm bench: ISA row(s) {unknown} not available here "
                             f"(available: {', '.join(available)})")
    else:
        isas = [core().isa()]
    if args.shape:
        shapes = [(f"{k}x{n}", k, n) for k, n in args.shape]
    elif args.quick:
        shapes = [LLAMA_SHAPES[1]]
    else:
        shapes = list(LLAMA_SHAPES)
    batches = args.batch or ([1, 16] if args.quick else [1, 16, 128])
    formats = args.format or list(NARROWMM_FORMATS)
    for fmt in (f for f in formats if f in GGUF_CONVERTED_FORMATS):
        t = _ggml_type(fmt)
        for name, k, _ in shapes:
            if k % t.block_size:
                raise SystemExit(f"narrowmm bench: --format {fmt} (GGUF {t.name}, blocks of "
                                 f"{t.block_size} input features) needs k a multiple of "
                                 f"{t.block_size}; shape {name} has k = {k}")
    threads = args.threads or [get_num_threads()]
    caches = args.cache or ["cold"]
    min_calls, budget = (3, 0.15) if args.quick else (5, 0.5)
    try:
        memory = (parse_size(args.memory, "--memory") if getattr(args, "memory", None)
                  else memory_budget())
        l3_bytes()  # a bad NARROWMM_BENCH_L3 fails here, before any timing
    except ValueError as exc:
        raise SystemExit(f"narrowmm bench: {exc}") from None
    return Config(shapes, batches, formats, threads, caches, isas, min_calls, budget,
                  peers=not args.no_peers, layouts=args.layout or ["rows", "packed"],
                  memory_budget=memory)


def _installed(name: str) -> bool:
    """Whether ``import name`` can work, without importing it (a None in sys.modules, as
    tests use to block a module, counts as missing)."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def check_outputs(args: Any) -> None:
    """Fail in the first second, before any timing, on what would fail after it: --plot
    without matplotlib, or a --json / --plot path whose folder does not exist."""
    if args.plot and not _installed("matplotlib"):
        raise SystemExit('narrowmm bench: --plot needs matplotlib, which is not installed; '
                         'install it with: pip install matplotlib (the plot extra: '
                         'pip install ".[plot]" in a narrowmm source tree)')
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):
                raise SystemExit(f"narrowmm bench: {flag} {path}: folder {folder} does not "
                                 "exist")


def main(args: Any) -> int:
    from .._runtime import runtime_info

    check_outputs(args)
    if core() is None:
        raise SystemExit("narrowmm bench needs the native core, which did not load")
    cfg = build_config(args)
    info = runtime_info()
    # the A limit for the slivers-outside order on packed weights (frame/matmul.c)
    outer = (f"slivers outside up to {info['sliver_outer_a_bytes'] >> 10} KiB of A"
             + (" (NARROWMM_SLIVER_OUTER_KIB)" if info["sliver_outer_forced"] else ""))
    # the packed m <= 2 walks' software prefetch (the row in use; --isa rows follow it)
    ahead = info["gemv_prefetch_bytes"]
    prefetch = ("gemv prefetch " + (f"{ahead} bytes" if ahead else "none")
                + (" (NARROWMM_GEMV_PREFETCH_BYTES)" if info["gemv_prefetch_forced"] else ""))
    # and their 4-bit decode, on the rows with a choice
    nibbles = (() if info["nibble_decode"] is None else
               (f"{info['nibble_decode']} nibble decode"
                + (" (NARROWMM_NIBBLE_DECODE)" if info["nibble_decode_forced"] else ""),))
    # and how many groups the m = 1 walks take at once, on the rows with pair walks
    streams = (() if info["gemv_streams"] is None else
               (f"{info['gemv_streams']} gemv stream{'s' * (info['gemv_streams'] > 1)}"
                + (" (NARROWMM_GEMV_STREAMS)" if info["gemv_streams_forced"] else ""),))
    print(run_line(cfg.threads, KERNEL_PEERS, isas=cfg.isas, loads=False,
                   details=(f"cache {', '.join(cfg.caches)}", f"L3 {l3_bytes() >> 20} MiB",
                            outer, prefetch, *nibbles, *streams)))
    set_vars = [v for v in BLAS_ENV if os.environ.get(v)]
    if set_vars:
        print(f"note: {', '.join(f'{v}={os.environ[v]}' for v in set_vars)} is set and slows "
              "NumPy's BLAS; for a fair baseline: env -u OPENBLAS_CORETYPE -u "
              "OPENBLAS_L2_SIZE narrowmm bench")
    for b in blas_info():
        print(f"numpy BLAS: {b.get('internal_api')} {b.get('version')}, kernel "
              f"{b.get('architecture')}, {b.get('num_threads')} threads by default")
    total = len(cfg.shapes) * len(cfg.batches) * len(cfg.caches) * len(cfg.threads) * (
        len(cfg.isas) * len(cfg.formats) * len(cfg.layouts) + (8 if cfg.peers else 0))
    progress = Progress(total)
    t0 = time.perf_counter()
    try:
        limits, results = run(cfg, progress)
    finally:
        progress.close()
    elapsed = time.perf_counter() - t0
    print(format_tables(limits, results))
    for s in cfg.skipped:
        where = " ".join(f"{k}={v}" for k, v in s.items() if k not in ("system", "reason"))
        print(f"skipped: {s['system']} {where}: {s['reason']}")
    print(f"({len(results)} measurements in {elapsed:.0f} s; peak memory "
          f"{peak_rss_bytes() >> 20} MiB, {cfg.memory_budget >> 20} MiB budget a case)")
    for note in cfg.cold_notes:
        print(f"cold cache: {note}")
    print()
    print(format_summary(results))
    if args.json:
        doc = {"schema": SCHEMA, "machine": {**info, "l3_bytes": l3_bytes(),
                                             "platform": platform.platform(),
                                             "blas": blas_info(),
                                             "env": {v: os.environ.get(v) for v in BLAS_ENV},
                                             "torch": _version("torch"),
                                             "ml_dtypes": _version("ml_dtypes")},
               "config": {"shapes": [list(s) for s in cfg.shapes], "batches": cfg.batches,
                          "formats": cfg.formats, "threads": cfg.threads,
                          "caches": cfg.caches, "isas": cfg.isas, "layouts": cfg.layouts,
                          "min_calls": cfg.min_calls, "budget_s": cfg.budget_s,
                          "memory_budget": cfg.memory_budget},
               "peak_rss_bytes": peak_rss_bytes(), "cold_notes": cfg.cold_notes,
               "limits": [asdict(li) for li in limits],
               "results": [asdict(r) for r in results],
               "skipped": cfg.skipped, "elapsed_s": elapsed}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
        print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, limits, results)
        print(f"wrote {args.plot}")
    return 0


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
