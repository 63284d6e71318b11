"""The machine the bench runs on: its cache and memory, the limits its probes measure,
the BLAS and thread settings, and how a case makes the cache cold within the memory budget."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._arena import placement
from .._arrays import aligned_empty
from .._threads import get_num_threads, set_num_threads
from ..providers.native import core, use_isa
from .results import Limits

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


def package_versions(names: tuple[str, ...]) -> str:
    """``"torch 2.13.0+cpu, llama-cpp-python not installed"``: the installed versions of the
    peers a bench may time, read from their metadata (nothing is imported)."""
    from importlib import metadata

    parts = []
    for name in names:
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} not installed")
    return ", ".join(parts)


def run_line(threads: list[int], peers: tuple[str, ...] = (),
             isas: list[str] | None = None, details: tuple[str, ...] = (),
             loads: bool = True) -> str:
    """The first line of every bench: what ran. narrowmm's version, the CPU (with its
    family and model on x86) and its features, the ISA rows timed (by default the row in
    use, marked when NARROWMM_ISA forced it), the thread counts timed, with ``loads`` (the
    benches that load models) where a load's packed weights live (narrowmm._arena), the
    bench's own ``details``, and the versions of the peers."""
    from .._runtime import runtime_info

    info = runtime_info()
    if isas is None:
        isas = [(info["isa"] or "none (the native core did not load)")
                + (" (NARROWMM_ISA)" if info["isa_forced"] else "")]
    parts = [f"narrowmm {info['version']} on {info['cpu']} ({', '.join(info['cpu_features'])})",
             f"isa {', '.join(isas)}", f"threads {', '.join(map(str, threads))}",
             *([f"a load's packed weights {placement(info['huge_pages'])}"] if loads else []),
             *details]
    return "; ".join(parts + ([package_versions(peers)] if peers else []))


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


def measure_limits(threads: int, isa: str, quick: bool, budget: int) -> Limits:
    """Best-of-N read bandwidth over a buffer 4x the last-level cache (at most ``budget``
    bytes, the run's memory budget), and FMA peak."""
    c = core()
    n = max(min(4 * l3_bytes(), budget), 64 << 20) // 4  # the run's memory budget
    n -= n % (64 * threads)
    buf = aligned_empty(n, np.float32)
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
            self._evict_buf = aligned_empty(self.evict_bytes // 4, np.float32)
            self._evict_buf.fill(1.0)
        buf, c = self._evict_buf, core()
        return lambda: c.probe_read(1, buf)

    def describe(self) -> str:
        if not self.capped:
            return "full rotation"
        return (f"rotation capped by the memory budget ({self.budget >> 20} MiB), "
                f"{self.evict_bytes >> 20} MiB read between calls: "
                f"{100 * self.cold_fraction:.0f} % of the 3 x L3 traffic wanted")
