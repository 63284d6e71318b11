"""What ``narrowmm bench`` prints and draws: progress, the tables, the summaries, the plot."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from .results import (
    BENCH_FORMATS,
    GGUF_CONVERTED_FORMATS,
    NARROWMM_SYSTEMS,
    QUANTIZED_FORMATS,
    Limits,
    Result,
)

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
        lines += _quantized_summary(rs, cache, t)
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


def _quantized_summary(rs: list[Result], cache: str, t: int) -> list[str]:
    """Per batch size: narrowmm's FP8 and GGUF formats against its bf16, the faster layout
    of each, shape by shape, in the same run."""
    def best(fmt: str, shape: str, m: int) -> Result | None:
        hits = [r for r in rs if r.system in NARROWMM_SYSTEMS and
                (r.format, r.shape, r.m) == (fmt, shape, m)]
        return min(hits, key=lambda r: r.median_ms) if hits else None

    lines: list[str] = []
    for fmt in (*QUANTIZED_FORMATS, *GGUF_CONVERTED_FORMATS):
        ms = sorted({r.m for r in rs if r.format == fmt and r.system in NARROWMM_SYSTEMS})
        rows = []
        for m in ms:
            parts = []
            for shape in sorted({r.shape for r in rs if r.m == m}):
                a, b = best(fmt, shape, m), best("bf16", shape, m)  # PyTorch's bf16: not it
                if a and b:
                    parts.append(f"{shape} {b.median_ms / a.median_ms:.2f}x")
            if parts:
                rows.append(f"  m = {m:<4} " + ", ".join(parts))
        if rows:
            lines.append(f"summary ({cache} cache, {t} thread(s)): narrowmm {fmt} against its "
                         "bf16, speed ratio per shape (faster layout of each)")
            lines += rows
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
        converted = [f for f in GGUF_CONVERTED_FORMATS if any(r.format == f for r in rs)]
        for f in converted:
            ggml, runs_as = GGUF_CONVERTED_FORMATS[f]
            lines.append(f"  {f}: GGUF {ggml} blocks (random codes and scales) as load_gguf "
                         f"loads them, exact {runs_as} weights;")
        if converted:
            lines.append("    their GB/s counts the bytes of the weights they run as.")
        systems = sorted({(r.system, r.format) for r in rs if r.system not in NARROWMM_SYSTEMS})
        nm_fmts = sorted({r.format for r in rs if r.system in NARROWMM_SYSTEMS},
                         key=BENCH_FORMATS.index)
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
    ("narrowmm", "e5m2", "#74c476"), ("narrowmm", "q8_0", "#6baed6"),
    ("narrowmm", "q4_0", "#9ecae1"), ("narrowmm", "q4_1", "#c6dbef"),
    ("narrowmm", "q5_1", "#deebf7"), ("narrowmm", "q5_0", "#4292c6"),
    ("narrowmm", "q2_k", "#c7e9c0"), ("narrowmm", "q3_k", "#a1d99b"),
    ("narrowmm", "q4_k", "#2171b5"), ("narrowmm", "q5_k", "#41ab5d"),
    ("narrowmm", "q6_k", "#084594"), ("narrowmm", "iq4_nl", "#238b45"),
    ("narrowmm", "iq4_xs", "#00441b"),
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
