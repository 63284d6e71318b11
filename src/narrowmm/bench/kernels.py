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

import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._api import matmul
from .._check import same_bits
from .._scales import Scales
from .._threads import get_num_threads, set_num_threads
from .._weights import PackedWeights, Weights
from ..providers import use_provider
from ..providers.native import core, use_isa

SCHEMA = "narrowmm-bench/1"
# (name, k, n): k input features, n output features, as in the seed's benchmark
LLAMA_SHAPES = (
    ("q_proj 1B", 2048, 2048),
    ("q_proj 8B", 4096, 4096),
    ("ffn_up 8B", 4096, 11008),
    ("ffn_down 8B", 11008, 4096),
)
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
NARROWMM_FORMATS = ("fp16", "bf16", "f32", "e4m3fn", "e5m2")
FP8_FORMATS = ("e4m3fn", "e5m2")
# narrowmm on row-major Weights, and on Weights.pack() of the same matrix
NARROWMM_SYSTEMS = ("narrowmm", "narrowmm-packed")
SLOW_CALL_S = 4.0  # a system whose single call takes longer is skipped for that case


@dataclass
class Result:
    """One timed (system, format, shape, m, threads, cache) measurement."""

    system: str
    format: str
    shape: str
    k: int
    n: int
    m: int
    threads: int
    cache: str
    isa: str | None
    median_ms: float
    min_ms: float
    max_ms: float
    calls: int
    weight_bytes: int
    gbps: float = 0.0
    gflops: float = 0.0
    limit: str = ""
    pct_of_limit: float = 0.0
    # m == 1, narrowmm only: the read probe timed between the same calls (see Case.probe)
    paired_read_gbps: float = 0.0
    pct_of_paired_read: float = 0.0
    # cold cache: the traffic between two uses of a weight copy over the 3 x L3 wanted
    # (1.0 unless the memory budget capped the rotation: ColdPlan)
    cold_fraction: float = 0.0


@dataclass
class Limits:
    threads: int
    isa: str
    read_gbps: float
    fma_gflops: float


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


# ---- the machine ----------------------------------------------------------------------

L3_ENV = "NARROWMM_BENCH_L3"
MEMORY_ENV = "NARROWMM_BENCH_MEMORY"
MEMORY_SHARE = 0.3  # of MemAvailable at the start: the default budget for weight copies


def parse_size(text: str, what: str) -> int:
    """Bytes from ``"800M"``, ``"2G"``, ``"65536"`` or ``"512K"``; ValueError naming ``what``."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    digits = t[:-1] if scale > 1 else t
    try:
        value = float(digits)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{what}={text!r}: expected a positive size such as 800M or 2G")
    return int(value * scale)


def l3_bytes() -> int:
    """Size of the largest CPU cache (from sysfs), 32 MiB if unknown; NARROWMM_BENCH_L3
    (e.g. ``260M``) overrides it, for machines whose cache figures are wrong."""
    forced = os.environ.get(L3_ENV)
    if forced:
        return parse_size(forced, L3_ENV)
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    with contextlib.suppress(OSError):
        for entry in os.listdir(base):
            try:
                with open(f"{base}/{entry}/size", encoding="ascii") as f:
                    text = f.read().strip()
            except OSError:
                continue
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
    return best or 32 << 20


def mem_available() -> int:
    """MemAvailable from /proc/meminfo (bytes); the physical memory where it is missing."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_budget() -> int:
    """Bytes the bench may spend on one case's weight copies, read probes and eviction
    buffer: NARROWMM_BENCH_MEMORY (e.g. ``2G``), else 30 % of MemAvailable at the start."""
    forced = os.environ.get(MEMORY_ENV)
    if forced:
        return parse_size(forced, MEMORY_ENV)
    return int(MEMORY_SHARE * mem_available())


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def release_memory() -> None:
    """Hand freed heap memory back to the OS: glibc keeps freed arrays under its mmap
    threshold (up to 32 MiB) in the heap, so without this the resident set grew from one
    shape to the next of a run."""
    import gc

    gc.collect()
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def _aligned_floats(n: int) -> np.ndarray:
    raw = np.empty(n + 16, np.float32)
    off = (-raw.ctypes.data % 64) // 4
    return raw[off:off + n]


def measure_limits(threads: int, isa: str, quick: bool) -> Limits:
    """Best-of-N read bandwidth over a buffer 4x the last-level cache, and FMA peak."""
    c = core()
    n = max(min(4 * l3_bytes(), memory_budget()), 64 << 20) // 4
    n -= n % (64 * threads)
    buf = _aligned_floats(n)
    buf.fill(1.0)  # touch every page before timing
    with use_isa(isa):
        read = max(buf.nbytes / c.probe_read(threads, buf) for _ in range(3 if quick else 7))
        iters = 1 << 20
        _, secs = c.probe_fma(threads, iters)
        iters = max(1 << 16, int(iters * 0.05 / max(secs, 1e-6)))  # ~50 ms a probe
        fma = max(f / s for f, s in (c.probe_fma(threads, iters) for _ in range(3 if quick else 5)))
    return Limits(threads, isa, read / 1e9, fma / 1e9)


def blas_info() -> list[dict[str, object]]:
    """What threadpoolctl sees of NumPy's BLAS (empty if threadpoolctl is missing)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("internal_api", "version", "architecture", "num_threads", "threading_layer")
    return [{k: d.get(k) for k in keep} for d in threadpool_info() if d.get("user_api") == "blas"]


@contextlib.contextmanager
def all_threads(n: int, torch: Any) -> Iterator[None]:
    """Limit narrowmm, NumPy's BLAS and PyTorch to n threads inside the block."""
    before = get_num_threads()
    set_num_threads(n)
    torch_before = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        limits: Any = contextlib.nullcontext()
    else:
        limits = threadpool_limits(n, user_api="blas")
    try:
        with limits:
            yield
    finally:
        set_num_threads(before)
        if torch is not None:
            torch.set_num_threads(torch_before)


# ---- timing ---------------------------------------------------------------------------

def time_calls(fn: Callable[[int], object], min_calls: int, budget_s: float,
               between: Callable[[int], float] | None = None,
               max_calls: int = 500) -> tuple[list[float], list[float]]:
    """Call ``fn(i)`` (i counts calls, for rotating weight copies) until ``min_calls`` calls
    and ``budget_s`` seconds have both passed, or ``max_calls`` calls; each call's time in
    ms. With ``between``, it is called after each call too and its return values (seconds)
    are kept, in ms: the second list, empty otherwise."""
    times: list[float] = []
    others: list[float] = []
    start = time.perf_counter()
    i = 0
    while len(times) < min_calls or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1e3)
        if between is not None:
            others.append(between(i) * 1e3)
        i += 1
        if len(times) >= max_calls:
            break
    return times, others


def time_interleaved(calls: list[Callable[[int], object]], min_calls: int, budget_s: float,
                     between: list[Callable[[int], float] | None] | None = None,
                     ) -> list[tuple[list[float], list[float]]]:
    """Time several systems on the same case in turns, as :func:`time_calls` times one.

    There are ``min_calls`` rounds; in each, every system runs for at least one call and
    ``budget_s / min_calls`` seconds, starting one system further along the list each round.
    So every system gets at least ``min_calls`` calls and ``budget_s`` seconds, as with
    :func:`time_calls`, but spread over the same stretch of time as the others': on a
    shared machine the memory bandwidth drifts by tens of percent within a minute, and
    systems timed one after another would see different machines. ``calls[s](i)`` gets
    i = 0, 1, 2, ... per system, for rotating weight copies. At most 500 calls a system, as
    there. Returns, per system, the call times and the ``between`` times in ms, as
    :func:`time_calls` does."""
    rounds = max(1, min_calls)
    between = between if between is not None else [None] * len(calls)
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in calls]
    for r in range(rounds):
        for j in range(len(calls)):
            s = (r + j) % len(calls)
            times, others = out[s]
            start = len(times)
            more, more_others = time_calls(lambda i, s=s, start=start: calls[s](start + i), 1,
                                           budget_s / rounds,
                                           None if between[s] is None else
                                           (lambda i, s=s, start=start: between[s](start + i)),
                                           max_calls=max(1, 500 // rounds))
            times.extend(more)
            others.extend(more_others)
    return out


def _copies(weight_bytes: int, cache: str) -> int:
    """Weight copies to rotate through: enough that a copy is out of the last-level cache
    (three cache sizes of other weights) by the time it is used again; at most 1024, so a
    tiny matrix is only out of the inner caches. ColdPlan caps it to the memory budget."""
    if cache == "warm":
        return 1
    return min(1024, max(2, math.ceil(3 * l3_bytes() / max(weight_bytes, 1)) + 1))


class ColdPlan:
    """How one case makes the cache cold within the memory budget.

    Every set of arrays a case rotates through (a system's weight copies, each ISA row's
    packed copies, a read probe's buffers) gets an equal share of the budget. A set that
    fits keeps the full rotation of :func:`_copies`; one that does not keeps as many copies
    as its share holds (at least 2), and an eviction buffer, read between calls (untimed),
    makes up the traffic its rotation lacks, as far as the rest of the budget allows.
    ``cold_fraction`` is the traffic between two uses of a copy over the 3 x L3 wanted."""

    def __init__(self, set_bytes: list[int], cache: str, budget: int) -> None:
        self.cache = cache
        self.budget = budget
        self.share = budget // max(1, len(set_bytes))
        self.capped = False
        worst = 1.0
        spent = 0
        target = 3 * l3_bytes()
        for nbytes in set_bytes:
            c = self.copies(nbytes)
            spent += c * nbytes
            if cache == "cold" and c < _copies(nbytes, cache):
                worst = min(worst, (c - 1) * nbytes / target)
        shortfall = 0 if worst >= 1.0 else int((1.0 - worst) * target)
        self.evict_bytes = max(0, min(shortfall, budget - spent)) // 256 * 256
        self.cold_fraction = min(1.0, worst + self.evict_bytes / target)
        self._evict_buf: np.ndarray | None = None

    def copies(self, nbytes: int) -> int:
        """Copies of a set of ``nbytes`` arrays to make: the full rotation if it fits."""
        want = _copies(nbytes, self.cache)
        if want * nbytes <= self.share:
            return want
        got = max(2, self.share // max(1, nbytes))
        self.capped = self.capped or got < want
        return min(want, got)

    def evictor(self) -> Callable[[], None] | None:
        """A call that reads the eviction buffer once (None without one)."""
        if self.evict_bytes == 0:
            return None
        if self._evict_buf is None:
            self._evict_buf = _aligned_floats(self.evict_bytes // 4)
            self._evict_buf.fill(1.0)
        buf, c = self._evict_buf, core()
        return lambda: c.probe_read(1, buf)

    def describe(self) -> str:
        if not self.capped:
            return "full rotation"
        return (f"rotation capped by the memory budget ({self.budget >> 20} MiB), "
                f"{self.evict_bytes >> 20} MiB read between calls: "
                f"{100 * self.cold_fraction:.0f} % of the 3 x L3 traffic wanted")


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
    scales = None
    if w.scales is not None:  # the same columns' scales, one per column per block of rows
        grid, bk = w.scales.expanded(w.shape, n)
        scales = Scales(grid[:, cols], (bk, 1))
    sub = Weights.from_bits(np.ascontiguousarray(w.bits[:, cols]), w.format, scales)
    with use_provider("numpy"):
        want = matmul(x, sub)
    if not same_bits(y[:, cols], want):
        raise AssertionError(f"narrowmm {w.format.name} result is wrong for {w.shape}")


# ---- the systems ----------------------------------------------------------------------

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
    bufs = [_aligned_floats(n) for _ in range(copies)]
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


def _systems(name: str, k: int, n: int, m: int, x: np.ndarray, exact: dict[str, Weights],
             plan: ColdPlan, cfg: Config, torch: Any, ml_dtypes: Any) -> list[Case]:
    """The cases for one shape and batch; weight copies are built here, freed after."""
    cases: list[Case] = []
    out = np.empty((m, n), np.float32)
    isa = core().isa()
    probes: dict[int, tuple[Callable[[int], float] | None, int]] = {}
    for fmt in cfg.formats:
        w = exact[fmt]
        copies = [w] + [Weights.from_bits(w.bits.copy(), fmt, w.scales)
                        for _ in range(plan.copies(w.nbytes) - 1)]
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
                    packed[row] = [c.pack() for c in copies]
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
        # FP8 as checkpoints store it: one scale per output column (Weights.quantize)
        exact = {fmt: Weights.quantize(raw, fmt) if fmt in FP8_FORMATS
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
            limits.append(measure_limits(t, isa, cfg.budget_s < 0.5))
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


# ---- output ---------------------------------------------------------------------------

class Progress:
    """A progress bar (rich, else tqdm, else plain lines)."""

    def __init__(self, total: int) -> None:
        self._bar: Any = None
        self._rich: Any = None
        self._total = total
        self._done = 0
        self._plain = not sys.stdout.isatty()
        if self._plain:  # a log or a pipe: one line per finished case, no bar
            return
        try:
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(transient=True)
            self._rich.start()
            self._task = self._rich.add_task("bench", total=total)
        except ImportError:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, leave=False)
            except ImportError:
                pass

    def note(self, text: str) -> None:
        if self._plain:
            return
        if self._rich is not None:
            self._rich.update(self._task, description=text)
        elif self._bar is not None:
            self._bar.set_description(text)
        else:
            print(f"  {text}", flush=True)

    def step(self, text: str) -> None:
        self._done += 1
        if self._plain:
            print(f"[{self._done}/{self._total}] {text}", flush=True)
            return
        self.note(text)
        if self._rich is not None:
            self._rich.advance(self._task)
        elif self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
        elif self._bar is not None:
            self._bar.close()


def _ms(v: float, width: int) -> str:
    """Milliseconds with three decimals, or four significant digits below 0.1 ms."""
    return f"{v:>{width}.3f}" if v >= 0.1 else f"{v:>{width}.4g}"


LIMITS_EXPLAINED = [
    "  read: one contiguous stream per thread of vector loads over 4x the last-level cache;",
    "        kernels reading several streams at once (packed slivers) can beat it: > 100 %",
    "        of it is the hardware prefetchers at work, not a timing error.",
    "  FMA:  independent float32 vector FMA chains in registers, no memory traffic.",
]
COLUMNS_EXPLAINED = [
    "  m: batch rows; layout: rows = Weights (row-major), packed = Weights.pack();",
    "  ms: median per call; GB/s: weight bytes per second; GFLOP/s: 2*m*k*n per second;",
    "  % limit: m = 1, GB/s over the read limit; m > 1, GFLOP/s over the FMA limit;",
    "  % read now: m = 1, GB/s over the read probe timed between the same calls;",
    "  vs numpy: NumPy float32 matmul's time over narrowmm's (higher: narrowmm faster).",
]


def system_label(r: Result) -> str:
    """A system's name with its format where the name alone does not say it."""
    if r.system in NARROWMM_SYSTEMS or r.system in ("numpy-upcast", "ml_dtypes"):
        return f"{r.system} {r.format}"
    return r.system


def format_summary(results: list[Result]) -> str:
    """A few closing lines: per thread count, cache state and batch size, narrowmm's
    faster layout of its 16-bit formats against the fastest peer of each shape."""
    lines: list[str] = []
    for cache, t in sorted({(r.cache, r.threads) for r in results}):
        rs = [r for r in results if (r.cache, r.threads) == (cache, t)]
        peers = [r for r in rs if r.system not in NARROWMM_SYSTEMS]
        mine = [r for r in rs if r.system in NARROWMM_SYSTEMS and r.format in ("fp16", "bf16")]
        lines += _fp8_summary(rs, cache, t)
        if not mine:
            continue
        lines.append(f"summary ({cache} cache, {t} thread(s)): narrowmm's faster layout of "
                     "fp16/bf16, per shape, against the fastest peer")
        for m in sorted({r.m for r in mine}):
            ratios, shares, names = [], [], []
            for shape in sorted({r.shape for r in mine if r.m == m}):
                best = min((r for r in mine if (r.shape, r.m) == (shape, m)),
                           key=lambda r: r.median_ms)
                shares.append(best.pct_of_limit)
                rivals = [r for r in peers if (r.shape, r.m) == (shape, m)]
                if rivals:
                    peer = min(rivals, key=lambda r: r.median_ms)
                    ratios.append(peer.median_ms / best.median_ms)
                    names.append(system_label(peer))
            limit = "read" if m == 1 else "FMA"
            share = f"{min(shares):.0f}-{max(shares):.0f} % of the {limit} limit"
            if ratios:
                common = max(set(names), key=names.count)
                lines.append(f"  m = {m:<4} {min(ratios):.2f}x-{max(ratios):.2f}x the fastest "
                             f"peer's speed (mostly {common}); {share}")
            else:
                lines.append(f"  m = {m:<4} no peers timed; {share}")
    return "\n".join(lines)


def _fp8_summary(rs: list[Result], cache: str, t: int) -> list[str]:
    """Per batch size: narrowmm's FP8 formats against its bf16, the faster layout of each,
    shape by shape, in the same run."""
    def best(fmt: str, shape: str, m: int) -> Result | None:
        hits = [r for r in rs if r.system in NARROWMM_SYSTEMS and
                (r.format, r.shape, r.m) == (fmt, shape, m)]
        return min(hits, key=lambda r: r.median_ms) if hits else None

    lines: list[str] = []
    for fmt in FP8_FORMATS:
        ms = sorted({r.m for r in rs if r.format == fmt and r.system in NARROWMM_SYSTEMS})
        if not ms or not any(r.format == "bf16" for r in rs):
            continue
        lines.append(f"summary ({cache} cache, {t} thread(s)): narrowmm {fmt} against its "
                     "bf16, speed ratio per shape (faster layout of each)")
        for m in ms:
            parts = []
            for shape in sorted({r.shape for r in rs if r.m == m}):
                a, b = best(fmt, shape, m), best("bf16", shape, m)
                if a and b:
                    parts.append(f"{shape} {b.median_ms / a.median_ms:.2f}x")
            lines.append(f"  m = {m:<4} " + ", ".join(parts))
    return lines


def format_tables(limits: list[Limits], results: list[Result]) -> str:
    """Human tables: narrowmm against the limits and NumPy, then every system's time."""
    lines: list[str] = []
    for li in limits:
        lines.append(f"limits ({li.isa}, {li.threads} thread(s)): read {li.read_gbps:.1f} GB/s, "
                     f"float32 FMA {li.fma_gflops:.1f} GFLOP/s")
    lines += LIMITS_EXPLAINED
    groups = sorted({(r.cache, r.threads) for r in results})
    for cache, t in groups:
        rs = [r for r in results if (r.cache, r.threads) == (cache, t)]
        numpy = {(r.shape, r.m): r for r in rs if r.system == "numpy-f32"}
        lines.append("")
        lines.append(f"narrowmm, {cache} cache, {t} thread(s)")
        head = (f"{'shape':<12}{'m':>4} {'isa':<7}{'layout':<7}{'fmt':<7}{'ms':>9}{'GB/s':>8}"
                f"{'GFLOP/s':>9}{'% limit':>9}{'% read now':>11}{'vs numpy':>10}")
        lines += [head, "-" * len(head)]
        for r in sorted((r for r in rs if r.system in NARROWMM_SYSTEMS),
                        key=lambda r: (r.k * r.n, r.k, r.m, r.isa or "", r.format, r.system)):
            base = numpy.get((r.shape, r.m))
            ratio = f"{base.median_ms / r.median_ms:.2f}x" if base else "-"
            now = f"{r.pct_of_paired_read:>10.0f}%" if r.paired_read_gbps else f"{'-':>11}"
            layout = "packed" if r.system == "narrowmm-packed" else "rows"
            lines.append(f"{r.shape:<12}{r.m:>4} {r.isa or '-':<7}{layout:<7}{r.format:<7}"
                         f"{_ms(r.median_ms, 9)}{r.gbps:>8.1f}{r.gflops:>9.1f}"
                         f"{r.pct_of_limit:>8.0f}%{now}{ratio:>10}")
        lines += COLUMNS_EXPLAINED
        systems = sorted({(r.system, r.format) for r in rs if r.system not in NARROWMM_SYSTEMS})
        nm_fmts = sorted({r.format for r in rs if r.system in NARROWMM_SYSTEMS},
                         key=NARROWMM_FORMATS.index)
        cols = [(s, f) for s in NARROWMM_SYSTEMS for f in nm_fmts
                if any((r.system, r.format) == (s, f) for r in rs)] + systems
        lines.append("")
        lines.append(f"median ms per call, every system ({cache} cache, {t} thread(s))")
        short = {"narrowmm": "nm", "narrowmm-packed": "nm-pk", "numpy-f32": "numpy",
                 "numpy-upcast": "upcast",
                 "ml_dtypes": "ml_dtypes", "torch-f32": "torch", "torch-bf16": "torch",
                 "torch-f16": "torch"}
        head = f"{'shape':<12}{'m':>4}" + "".join(
            f"{short.get(s, s) + ' ' + f:>17}" for s, f in cols)
        lines += [head, "-" * len(head)]
        for shape, _k, _n, m in sorted({(r.shape, r.k, r.n, r.m) for r in rs},
                                       key=lambda v: (v[1] * v[2], v[1], v[3])):
            row = f"{shape:<12}{m:>4}"
            for s, f in cols:
                hit = [r.median_ms for r in rs
                       if (r.system, r.format, r.shape, r.m) == (s, f, shape, m)]
                row += _ms(min(hit), 17) if hit else f"{'-':>17}"
            lines.append(row)
    return "\n".join(lines)


# Plot series in family order, each with its own colour (narrowmm blues and greens, NumPy
# greys, ml_dtypes purple, PyTorch oranges and reds) and a marker for the rows layout.
PLOT_SERIES = (
    ("narrowmm", "bf16", "#08519c"), ("narrowmm", "fp16", "#3182bd"),
    ("narrowmm", "f32", "#31a354"), ("narrowmm", "e4m3fn", "#006d2c"),
    ("narrowmm", "e5m2", "#74c476"),
    ("numpy-f32", "f32", "#525252"), ("numpy-upcast", "bf16", "#969696"),
    ("numpy-upcast", "fp16", "#bdbdbd"),
    ("ml_dtypes", "bf16", "#756bb1"), ("ml_dtypes", "e4m3fn", "#9e9ac8"),
    ("ml_dtypes", "e5m2", "#cbc9e2"),
    ("torch-f32", "f32", "#d94801"), ("torch-bf16", "bf16", "#fd8d3c"),
    ("torch-f16", "fp16", "#a50f15"),
)


def write_plot(path: str, limits: list[Limits], results: list[Result]) -> None:
    """Speed as a share of the machine's limit (higher is faster): the time a call would
    take at the limit over the system's time, the same limit for every system of a case
    (16-bit weights at the read bandwidth for m = 1, so a float32 system that reads twice
    the bytes shows at half its bandwidth share), one panel per batch size, shapes grouped,
    one colour per system; narrowmm's bar is its packed layout and a black tick marks its
    row-major layout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cache, t = min((r.cache, r.threads) for r in results)
    rs = [r for r in results if (r.cache, r.threads) == (cache, t)]
    lim = next(li for li in limits if li.threads == t)
    shapes = sorted({(r.shape, r.k, r.n) for r in rs}, key=lambda v: (v[1] * v[2], v[1]))
    batches = sorted({r.m for r in rs})

    def floor_ms(k: int, n: int, m: int) -> float:
        """The fastest a call could be: 16-bit weights read at the read limit (m = 1), or
        the multiply-adds at the FMA limit; the same for every system of a case."""
        if m == 1:
            return 2 * k * n / (lim.read_gbps * 1e9) * 1e3
        return 2 * m * k * n / (lim.fma_gflops * 1e9) * 1e3

    def pct(system: str, fmt: str, shape: str, m: int) -> float:
        hit = [r for r in rs if (r.system, r.format, r.shape, r.m) == (system, fmt, shape, m)]
        if not hit:
            return float("nan")
        best = min(hit, key=lambda r: r.median_ms)
        return 100.0 * floor_ms(best.k, best.n, m) / best.median_ms

    series = [(s, f, colour) for s, f, colour in PLOT_SERIES
              if any((r.system, r.format) == (s, f) or
                     (s == "narrowmm" and r.system == "narrowmm-packed" and r.format == f)
                     for r in rs)]
    # inches: the title, the legend (series and the row-major tick), then the panels
    columns = min(6, len(series) + 1)
    title_in, legend_in = 0.4, 0.3 * -(-(len(series) + 1) // columns) + 0.15
    panels_in = 1.0 + 0.3 * len(shapes) * len(series)
    fig_h = title_in + legend_in + panels_in
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches) + 1.5, fig_h),
                             squeeze=False, sharey=True)
    height = 0.8 / max(len(series), 1)
    for ax, m in zip(axes[0], batches, strict=True):
        ys = np.arange(len(shapes))[::-1].astype(float)
        for si, (system, fmt, colour) in enumerate(series):
            offset = 0.4 - (si + 0.5) * height
            names = [sh for sh, _, _ in shapes]
            if system == "narrowmm":
                packed = [pct("narrowmm-packed", fmt, sh, m) for sh in names]
                rows = [pct("narrowmm", fmt, sh, m) for sh in names]
                bars = [p if not math.isnan(p) else r for p, r in zip(packed, rows, strict=True)]
                ax.barh(ys + offset, bars, height, color=colour, label=f"narrowmm {fmt}")
                ax.plot(rows, ys + offset, "|", color="black", markersize=7, mew=1.5)
            else:
                label = (f"{system} {fmt}" if system in ("numpy-upcast", "ml_dtypes") else system)
                ax.barh(ys + offset, [pct(system, fmt, sh, m) for sh in names], height,
                        color=colour, label=label)
        ax.axvline(100, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(ys, [sh if sh == f"{k}x{n}" else f"{sh}\n{k}x{n}" for sh, k, n in shapes])
        limit = (f"16-bit weights read at {lim.read_gbps:.0f} GB/s" if m == 1
                 else f"the FMA peak, {lim.fma_gflops:.0f} GFLOP/s")
        ax.set_title(f"m = {m}: speed, % of {limit}", fontsize=10)
        ax.set_xlabel("% of the limit's speed (higher is faster)")
        ax.grid(axis="x", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(matplotlib.lines.Line2D([], [], color="black", marker="|", linestyle="",
                                           markersize=9, mew=1.5))
    labels.append("narrowmm row-major (bars: packed)")
    fig.suptitle(f"narrowmm bench, {cache} cache, {t} thread(s): dashed line = the measured "
                 "limit", fontsize=12, y=1 - 0.1 / fig_h, va="top")
    fig.legend(handles, labels, loc="upper center", ncol=columns, fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, 1 - title_in / fig_h))
    fig.tight_layout(rect=(0, 0, 1, 1 - (title_in + legend_in) / fig_h))
    fig.savefig(path, dpi=100)


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
    print(f"narrowmm {info['version']} on {info['cpu']} ({', '.join(info['cpu_features'])}); "
          f"isa {', '.join(cfg.isas)}; threads {', '.join(map(str, cfg.threads))}; "
          f"cache {', '.join(cfg.caches)}; L3 {l3_bytes() >> 20} MiB")
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
