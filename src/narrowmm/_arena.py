"""Memory for a loaded model's packed weights: one arena on transparent huge pages.

A model's layers are many arrays, most of them a few MiB or less. NumPy asks for huge pages
only from 4 MiB up, so the small ones sit on 4 KiB pages, where walking a layer once a token
costs a page-table walk every 4 KiB (under a hypervisor, a two-level one). :func:`weight_arena`
puts the packed copies that ``narrowmm.torch.from_gguf``, ``convert``, ``shard`` and
``load_sharded`` make side by side in a few large mappings that the kernel is asked to back
with 2 MiB pages (``madvise(MADV_HUGEPAGE)``), so a layer costs a walk every 2 MiB.
``Weights.pack`` alone (outside an arena) keeps NumPy's memory. The bits are
the same; only where they live changes (docs/kernels.md, "Huge pages for packed weights").

``NARROWMM_HUGE_PAGES=0`` turns it off (each array then comes from NumPy as before).
"""

from __future__ import annotations

import contextlib
import contextvars
import mmap
import threading
from collections.abc import Iterator

import numpy as np

from ._arrays import CACHE_LINE, aligned_empty, array_bytes
from ._environ import switch

HUGE_PAGE = 2 << 20  # x86-64's and AArch64's (4 KiB granule) transparent huge page
# A mapping holds this much at most, so that the partly used huge page at its end (all a
# mapping wastes: the pages past it are never touched, so never backed) stays a small part.
ARENA_CHUNK = 64 << 20
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_enabled() -> bool:
    """Whether loads put packed weights in a huge-page arena (:func:`weight_arena`):
    ``NARROWMM_HUGE_PAGES`` 1 (the default) or 0. Read each time an arena is opened.

    Raises:
        EnvironmentVariableError: another value.
    """
    return switch("NARROWMM_HUGE_PAGES", "packed weights of a load on transparent huge pages",
                  "NumPy's memory")


def transparent_huge_pages() -> str | None:
    """The kernel's transparent huge page mode (``"always"``, ``"madvise"`` or ``"never"``:
    the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled), or None where there
    is no such file (not Linux, or a kernel without them)."""
    try:
        with open(_THP_SETTING, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def placement(huge: dict) -> str:
    """Where a load's packed weights go, in words, from runtime_info's ``huge_pages``
    (``enabled``: NARROWMM_HUGE_PAGES read, None for a bad value; ``transparent_huge_pages``:
    the kernel's mode)."""
    thp = huge["transparent_huge_pages"]
    if huge["enabled"] is None:
        return "unknown (NARROWMM_HUGE_PAGES is invalid)"
    if not huge["enabled"]:
        return "in NumPy's memory (NARROWMM_HUGE_PAGES=0)"
    if thp not in ("always", "madvise"):
        return f"in NumPy's memory (transparent huge pages: {thp or 'none'})"
    return f"in an arena on huge pages ({thp})"


class WeightArena:
    """A bump allocator over anonymous private mappings advised for huge pages.

    :meth:`empty` hands out arrays that start on a cache line, one after another in the
    current mapping of ``chunk`` bytes (a new one when the request does not fit; a request
    over half a chunk gets a mapping of its own). Each mapping starts on a 2 MiB boundary and
    lives as long as some array in it does. Safe to call from several threads.
    """

    def __init__(self, chunk: int = ARENA_CHUNK) -> None:
        if chunk < HUGE_PAGE or chunk % HUGE_PAGE:
            raise ValueError(f"chunk must be a positive multiple of {HUGE_PAGE} bytes, "
                             f"got {chunk}")
        self.chunk = chunk
        self._lock = threading.Lock()
        self._current: np.ndarray | None = None  # the mapping being filled (its 2 MiB part)
        self._used = 0  # bytes of it handed out, with the alignment's gaps
        self.mapped = 0  # bytes of every mapping made, 2 MiB-aligned parts
        self.handed_out = 0  # bytes of every array made
        self._spans: list[tuple[int, int]] = []  # each mapping's [start, end) address

    def holds(self, a: np.ndarray) -> bool:
        """Whether all of ``a``'s memory lies in one of this arena's mappings."""
        start = a.__array_interface__["data"][0]
        return any(lo <= start and start + a.nbytes <= hi for lo, hi in self._spans)

    def _map(self, nbytes: int) -> np.ndarray:
        """``nbytes`` (a multiple of HUGE_PAGE) of fresh memory starting on a 2 MiB boundary,
        advised for huge pages where the kernel has them."""
        try:
            m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as exc:  # as NumPy says it for an array it cannot allocate
            raise MemoryError(f"narrowmm: cannot map {nbytes + HUGE_PAGE} bytes for packed "
                              f"weights ({exc.strerror}); NARROWMM_HUGE_PAGES=0 takes "
                              f"NumPy's memory instead") from exc
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if advice is not None:
            with contextlib.suppress(OSError):  # THP compiled out: 4 KiB pages, still correct
                m.madvise(advice)
        raw = np.frombuffer(m, np.uint8)  # keeps the mapping alive while a view does
        start = -raw.ctypes.data % HUGE_PAGE
        self._spans.append((raw.ctypes.data + start, raw.ctypes.data + start + nbytes))
        return raw[start:start + nbytes]

    def empty(self, shape: int | tuple[int, ...], dtype: object) -> np.ndarray:
        """An uninitialised C-contiguous array in the arena, on a cache line."""
        dims, dt, nbytes = array_bytes(shape, dtype)
        with self._lock:
            self.handed_out += nbytes
            if 2 * nbytes > self.chunk:  # a mapping of its own, the current one kept
                own = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE
                self.mapped += own
                return self._map(own)[:nbytes].view(dt).reshape(dims)
            at = -(-self._used // CACHE_LINE) * CACHE_LINE
            if self._current is None or at + nbytes > self.chunk:
                self._current, at = self._map(self.chunk), 0
                self.mapped += self.chunk
            self._used = at + nbytes
            return self._current[at:at + nbytes].view(dt).reshape(dims)


_active: contextvars.ContextVar[WeightArena | None] = contextvars.ContextVar(
    "narrowmm_weight_arena", default=None)


@contextlib.contextmanager
def weight_arena() -> Iterator[WeightArena | None]:
    """Pack weights that live as long as a model side by side on transparent huge pages.

    Within it, the packed bits and kernels' grids that :meth:`Weights.pack`,
    :meth:`PackedWeights.kernel_scales` and ``Linear(..., pack=True)`` make (through
    :func:`weights_empty`; a packed layer makes its grid at construction, bare packed
    weights at their first product or ``kernel_scales()``: call it inside for the grid to
    land here) come from one new :class:`WeightArena`, in this context and in
    contexts copied from it (``contextvars.copy_context``, as the worker threads of a load
    run them). ``narrowmm.torch.from_gguf``, ``convert``, ``shard`` and ``load_sharded``
    open one themselves; open one where layers are built one at a time::

        with nm.weight_arena():
            layers = [nm.Linear(w, pack=True) for w in weights]

    The bits, and so the products, are those of NumPy's memory; the walks miss the TLB less.
    A mapping is returned to the system when the last array in it is gone, so arrays
    outlive the ``with`` block. Yields the arena, or None where the arena is off: with
    ``NARROWMM_HUGE_PAGES=0``, or where the kernel has no transparent huge pages
    (``never``, or no such setting), where 4 KiB pages would gain nothing over NumPy's;
    then packing inside uses NumPy's memory as outside.

    Raises:
        EnvironmentVariableError: NARROWMM_HUGE_PAGES is neither 0 nor 1.
    """
    use = huge_pages_enabled() and transparent_huge_pages() in ("always", "madvise")
    arena = WeightArena() if use else None
    token = _active.set(arena)
    try:
        yield arena
    finally:
        _active.reset(token)


def weights_empty(shape: int | tuple[int, ...], dtype: object) -> np.ndarray:
    """An uninitialised array on a cache line for weights that live as long as a model: from
    the active :func:`weight_arena`, else :func:`aligned_empty`."""
    arena = _active.get()
    return arena.empty(shape, dtype) if arena is not None else aligned_empty(shape, dtype)
