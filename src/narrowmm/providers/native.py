"""The native provider: the C core through the ``narrowmm._core`` extension."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from .. import _environ
from .._formats import Format
from ._base import Kernel, Provider

try:
    from .. import _core
except ImportError as exc:  # the extension was not built or cannot load here
    _core = None
    _IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = None


def core():
    """The loaded ``_core`` module, or None."""
    return _core


def apply_isa_environment() -> None:
    """Switch to the row ``NARROWMM_ISA`` names, if set. A name this build lacks or this CPU
    cannot run is recorded (see :mod:`narrowmm._environ`), never raised: the import works and
    the native core's first use raises it."""
    _environ.forget("NARROWMM_ISA")
    name = os.environ.get("NARROWMM_ISA", "").strip()
    if _core is None or not name:
        return
    rows = _core.isa_rows()
    built = ", ".join(r for r, _, _ in rows)
    runnable = ", ".join(r for r, ok, _ in rows if ok)
    by_name = {r: missing for r, ok, missing in rows}
    if name not in by_name:
        problem = f"is not an ISA row of this build (valid values: {built})"
    elif by_name[name]:
        problem = (f"names a row this CPU cannot run (it lacks {' '.join(by_name[name])}); "
                   f"this CPU runs: {runnable}")
    else:
        _core.set_isa(name)
        return
    _environ.record("NARROWMM_ISA", f"NARROWMM_ISA={name!r} {problem}; unset it to let "
                                    f"narrowmm choose the best row")


SLIVER_OUTER_MAX_KIB = 1 << 20


def _environment_size(name: str, most: int, unit: str, default: str) -> int | None:
    """The integer in 0..most that environment variable ``name`` holds; None when it is
    unset or bad, a bad value recorded (like a bad ``NARROWMM_ISA``) with what ``unit``
    counts and what ``default`` the core keeps instead."""
    _environ.forget(name)
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= most:
        _environ.record(name, f"{name}={value!r} must be an integer in 0..{most} ({unit}); "
                              f"unset it for {default}")
        return None
    return number


def apply_sliver_outer_environment() -> None:
    """Apply ``NARROWMM_SLIVER_OUTER_KIB``, if set: the most KiB of packed A with which the
    tiled path walks packed weights' slivers outside the k blocks (0: never; unset: the
    core's L2 within 512 KiB..1 MiB). The order changes the time, never a bit: tests and
    benchmarks force it."""
    if _core is None:
        return
    kib = _environment_size("NARROWMM_SLIVER_OUTER_KIB", SLIVER_OUTER_MAX_KIB,
                            "KiB of packed A", f"the default, "
                            f"{_core.sliver_outer_a_default() >> 10} KiB here")
    if kib is not None:  # else the core takes its default (the L2) when a call needs it
        _core.set_sliver_outer_a_bytes(kib << 10)


GEMV_PREFETCH_MAX_BYTES = 1 << 20


def apply_gemv_prefetch_environment() -> None:
    """Apply ``NARROWMM_GEMV_PREFETCH_BYTES``, if set: how many bytes down their stream of
    weights the packed m = 1 and m = 2 walks prefetch, on the rows built with that hint
    (avx2, avx512; 0: none; unset: the row's default for this CPU, which ``narrowmm info``
    shows). The distance changes the time, never a bit: benchmarks force it."""
    if _core is None:
        return
    nbytes = _environment_size("NARROWMM_GEMV_PREFETCH_BYTES", GEMV_PREFETCH_MAX_BYTES,
                               "bytes ahead", "the row's default")
    _core.set_packed_gemv_ahead(nbytes)  # None: the row's own


def _chosen_value(name: str, choices: tuple[str, ...]) -> str | None:
    """``name``'s value if it is one of ``choices``; None if unset, or if bad, which is then
    recorded for info and the first call (the row's default applies meanwhile)."""
    _environ.forget(name)
    value = os.environ.get(name, "").strip()
    if value and value not in choices:
        _environ.record(name, f"{name}={value!r} must be one of {', '.join(choices)}; "
                              "unset it for the row's default")
        return None
    return value or None


NIBBLE_DECODES = ("in-place", "permute")


def apply_nibble_decode_environment() -> None:
    """Apply ``NARROWMM_NIBBLE_DECODE``, if set: how the packed m = 1 and m = 2 walks
    decode the 4-bit formats' codes on the rows with a choice (avx512): ``in-place`` (Q4_1's
    and the K types' codes masked and converted where they sit, when a block's scales allow)
    or ``permute`` (every code through a table permute); unset: the row's default for this
    CPU, which ``narrowmm info`` shows. The decode changes the time, never a bit: tests and
    benchmarks force it."""
    if _core is not None:
        _core.set_nibble_decode(_chosen_value("NARROWMM_NIBBLE_DECODE", NIBBLE_DECODES))


GEMV_STREAMS = ("1", "2")


def apply_gemv_streams_environment() -> None:
    """Apply ``NARROWMM_GEMV_STREAMS``, if set: how many groups of packed weights the m = 1
    walks take at once on the rows with pair walks (avx512: Q8_0, which GGUF's Q5_0 loads
    as, Q4_0, Q5_1 and the K types' q8_0 form): ``1``, a group at a time, or ``2``, two
    groups' streams read side by side; unset: the row's default for this CPU, which
    ``narrowmm info`` shows. The count changes the time, never a bit: tests and benchmarks
    force it."""
    if _core is not None:
        value = _chosen_value("NARROWMM_GEMV_STREAMS", GEMV_STREAMS)
        _core.set_gemv_streams(None if value is None else int(value))


def checked_core():
    """The loaded ``_core`` module, after checking the environment that configures it.

    Raises:
        RuntimeError: the extension did not load.
        EnvironmentVariableError: ``NARROWMM_ISA``, ``NARROWMM_NUM_THREADS``,
            ``NARROWMM_SLIVER_OUTER_KIB``, ``NARROWMM_GEMV_PREFETCH_BYTES``,
            ``NARROWMM_NIBBLE_DECODE`` or ``NARROWMM_GEMV_STREAMS`` is invalid.
    """
    if _core is None:
        raise RuntimeError(f"the native core is unavailable: {_IMPORT_ERROR}")
    _environ.check("NARROWMM_ISA", "NARROWMM_NUM_THREADS", "NARROWMM_SLIVER_OUTER_KIB",
                   "NARROWMM_GEMV_PREFETCH_BYTES", "NARROWMM_NIBBLE_DECODE",
                   "NARROWMM_GEMV_STREAMS")
    return _core


def check_pack_width(w) -> None:
    """Raise unless packed weights ``w`` were packed for the sliver width of the row in
    use (a width the binding would reject with less to say)."""
    width = _core.pack_width(w.format.code)
    if w.width != width:
        raise ValueError(f"these weights were packed for the {w.isa} row "
                         f"({w.width}-column slivers); the {_core.isa()} row in use "
                         f"reads {width}: pack them again under it")


def _matmul(fmt: Format):
    code = fmt.code

    def run(x: np.ndarray, w, out: np.ndarray, accumulate: bool,
            bias: np.ndarray | None = None) -> None:
        """The binding on the weights' own layout, their scales in the kernels' form
        (``kernel_scales``); the C parts write the bias into their blocks of ``out``."""
        n = w.shape[1]
        if w.packed:
            check_pack_width(w)
            scales = w.kernel_scales(w.bits.shape[0] * w.width)  # whole slivers
            _core.matmul_packed(code, x, w.sliver_rows, n, out, accumulate,
                                *(scales or ()), bias=bias)
        else:
            _core.matmul(code, x, w.bits, out, accumulate, *(w.kernel_scales(n) or ()),
                         bias=bias)

    return run


def _codec(op: str, out_dtype: type | None):
    """Builder of the encode or decode kernel: allocate the result, let C fill it. An
    encoder's output dtype is the format's storage (out_dtype None)."""

    def build(fmt: Format):
        call = getattr(_core, op)
        code = fmt.code
        dtype = fmt.storage if out_dtype is None else out_dtype

        # a stored element holds kpack values (the 4-bit formats: two codes a byte)
        size = ((lambda n: n // fmt.kpack) if op == "encode"
                else (lambda n: n * fmt.kpack))

        if op == "encode" and fmt.itemsize == 1:
            def run8(src: np.ndarray, saturate: bool = False) -> np.ndarray:
                out = np.empty(size(src.size), dtype)
                call(code, src, out, None, saturate)
                return out
            return run8

        def run(src: np.ndarray) -> np.ndarray:
            out = np.empty(size(src.size), dtype)
            call(code, src, out)
            return out

        return run

    return build


class NativeProvider(Provider):
    """The C core, priority 100."""

    name = "native"
    priority = 100
    checks_overlap = True
    _builders: ClassVar[dict] = {"matmul": _matmul, "encode": _codec("encode", None),
                                 "decode": _codec("decode", np.float32)}

    def available(self) -> bool:
        return _core is not None

    def unavailable_reason(self) -> str | None:
        return _IMPORT_ERROR

    def kernel_names(self, op: str, fmt: Format) -> list[str]:
        """C names of the kernels that serve ``(op, fmt)`` in the current ISA row."""
        return list(_core.kernel_names(op, fmt.code)) if _core is not None else []

    def lookup(self, op: str, fmt: Format) -> Kernel | None:
        checked_core()
        names = self.kernel_names(op, fmt)
        if not names:
            return None
        return Kernel(describe_kernels(op, names), self._builders[op](fmt))


def supported_isas() -> list[str]:
    """Names of the ISA rows this build has and this CPU can run, best first."""
    return [name for name, ok, _ in _core.isa_rows() if ok] if _core is not None else []


@contextlib.contextmanager
def use_isa(name: str) -> Iterator[None]:
    """Run the native core on ISA row ``name`` inside the block (process-wide: a test and
    benchmark hook, not for use while other threads compute)."""
    checked_core()
    previous = _core.isa()
    _core.set_isa(name)
    try:
        yield
    finally:
        _core.set_isa(previous)


def describe_kernels(op: str, names: list[str], packed: list[str] | None = None) -> str:
    """One string naming the C kernels of ``kernel_names(op, fmt)``: for matmul, the m == 1
    and m == 2 gemvs, then the m > 2 path (the tile that decodes a sliver, the tile that
    reuses it, and the pack of a narrow last one). ``packed`` is
    ``kernel_names("matmul_packed", fmt)``, whose two gemvs are named next to them."""
    if op == "matmul" and len(names) == 5:
        gemv, gemv2, tiles = names[0], names[1], names[2:]
        if packed and len(packed) == 5:
            gemv, gemv2 = f"{gemv}, {packed[0]} packed", f"{gemv2}, {packed[1]} packed"
        return (f"{gemv} (m=1); {gemv2} (m=2); {tiles[0]} + {tiles[1]}, {tiles[2]} for edges "
                f"(m>2)")
    return " + ".join(names)


apply_isa_environment()
apply_sliver_outer_environment()
apply_gemv_prefetch_environment()
apply_nibble_decode_environment()
apply_gemv_streams_environment()
