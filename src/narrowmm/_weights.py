"""Weights: a (k, n) matrix stored in one of the formats, wrapped without copying."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arena import weights_empty
from ._arrays import aligned_empty, line_aligned
from ._codecs import check_codes, decode, encode
from ._environ import switch
from ._formats import FORMATS, Format, get_format
from ._interop import Bf16Bits, as_array
from ._scales import Scales, apply
from .providers.native import checked_core

_BY_DTYPE_NAME = {name: f for f in FORMATS.values() for name in f.numpy_names}


def _format_of(a: np.ndarray) -> Format | None:
    if isinstance(a, Bf16Bits):
        return FORMATS["bf16"]
    return _BY_DTYPE_NAME.get(a.dtype.name)


def checked_scales(fmt: Format, scales: Scales | None, shape: tuple[int, int],
                   what: str = "weights") -> Scales | None:
    """The scales a matrix of ``fmt`` and ``shape`` carries: None for a format without
    scales (passing some is a ValueError), 1.0 for the whole matrix when a scaled format is
    given none, else ``scales`` once checked against the shape."""
    if not fmt.scaled:
        if scales is not None:
            raise ValueError(f"format {fmt.name!r} takes no scales")
        return None
    if scales is None:
        return Scales.tensor(1.0)
    if not isinstance(scales, Scales):
        raise TypeError(f"scales must be a narrowmm.Scales, got {type(scales).__name__}")
    scales.check(shape, what)
    v = scales.values  # float32 (Scales makes it so)
    # max_scale is a power of two: below 2^128 a float32 one, compared exactly; 2^128 itself
    # is past float32, whose finite values are all below it (NaN compares False either way)
    limit = fmt.max_scale
    ok = np.abs(v) < np.float32(limit) if limit < 2.0 ** 128 else np.isfinite(v)
    if not ok.all():
        bad = v[~ok].flat[0]
        raise ValueError(f"{fmt.name} scales must be finite and below {fmt.max_scale:g} in "
                         f"magnitude, got {bad!r}")
    return scales


def checked_offsets(fmt: Format, offsets: Scales | None, scales: Scales | None,
                    shape: tuple[int, int]) -> Scales | None:
    """The offsets of a format that has them (Q4_1): required, finite, and in the scales'
    blocks; None (and refused if given) for the others."""
    if not fmt.offsets:
        if offsets is not None:
            raise ValueError(f"format {fmt.name!r} takes no offsets")
        return None
    if offsets is None:
        raise ValueError(f"{fmt.name} weights need their offsets (a Scales in the scales' "
                         "blocks): weight = fma(q, scale, offset)")
    if not isinstance(offsets, Scales):
        raise TypeError(f"offsets must be a narrowmm.Scales, got {type(offsets).__name__}")
    if scales is not None and offsets.block != scales.block:
        raise ValueError(f"offsets in blocks of {offsets.block} do not match the scales' "
                         f"{scales.block}")
    offsets.check(shape, "weights")
    if not np.isfinite(offsets.values).all():
        raise ValueError(f"{fmt.name} offsets must be finite, got "
                         f"{offsets.values[~np.isfinite(offsets.values)].flat[0]!r}")
    return offsets


def check_block_rows(fmt: Format, scales: Scales | None, k: int) -> None:
    """A 4-bit format stores two rows a byte: its scales' blocks must hold whole bytes."""
    if (fmt.kpack > 1 and scales is not None and 0 < scales.block[0] < k
            and scales.block[0] % fmt.kpack):
        raise ValueError(f"{fmt.name} stores {fmt.kpack} rows a byte: blocks of scales must "
                         f"hold a multiple of {fmt.kpack} rows, got {scales.block[0]}")


def stored_shape(fmt: Format, shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    """The matrix shape of bits of ``shape`` whose ``axis`` holds ``fmt.kpack`` rows of the
    matrix per stored element (axis 0 for narrowmm's (k, n), 1 for PyTorch's (out, in))."""
    if fmt.kpack == 1:  # every format but the 4-bit ones: the bits' own shape (matmul's path)
        return shape  # type: ignore[return-value]
    out = list(shape)
    out[axis] *= fmt.kpack
    return out[0], out[1]


def expand_pairs(values: np.ndarray, axis: int) -> np.ndarray:
    """A 4-bit format's decoded pairs (bits' shape + (2,), low nibble first) as the matrix:
    each element's two values become two consecutive rows along ``axis``."""
    rows, cols, pair = values.shape
    if axis == 0:  # (k/2, n, 2) -> (k/2, 2, n) -> (k, n)
        return np.ascontiguousarray(values.transpose(0, 2, 1)).reshape(rows * pair, cols)
    return values.reshape(rows, cols * pair)  # (out, in/2, 2) -> (out, in)


def half_grid(grid: np.ndarray) -> np.ndarray:
    """``grid`` (float32) as float16 if every value is a binary16 number, else itself."""
    with np.errstate(over="ignore"):  # a value past binary16's range stays float32
        half = grid.astype(np.float16)
    return half if np.array_equal(half.astype(np.float32), grid) else grid


# GGUF's K types keep one d (and dmin) per super-block of this many rows, under 6- or 8-bit
# sub-scales per block of 16 or 32 rows: the factors of a factored grid (factored_grid).
SUPER_BLOCK_ROWS = 256


def factored_scales_enabled() -> bool:
    """Whether packed weights keep the K types' scales factored (:func:`factored_grid`):
    ``NARROWMM_FACTORED_SCALES`` 1 (the default) or 0, for float32 grids instead, a quarter
    more bytes for Q4_K weights and faster where the kernels, not memory, set the pace
    (docs/kernels.md has both measured). Read each time a grid is made.

    Raises:
        EnvironmentVariableError: another value.
    """
    return switch("NARROWMM_FACTORED_SCALES", "factored K-type scales", "float32 grids")


def super_blocks_of(bk: int) -> int:
    """Blocks of ``bk`` rows to a factored grid's super-block (:data:`SUPER_BLOCK_ROWS`
    rows), or 0 when ``bk`` does not divide it into several."""
    return SUPER_BLOCK_ROWS // bk if 0 < bk < SUPER_BLOCK_ROWS and SUPER_BLOCK_ROWS % bk == 0 else 0


def factored_grid(grid: np.ndarray, grids: int, per_super: int) -> np.ndarray | None:
    """A float32 kernels' grid ``(grids * blocks, ld)`` (row-major; the scales, then the
    offsets) as a factored one, when each of its values is exactly, bit for bit, a float32
    factor of its column's super-block of ``per_super`` blocks times an int8 code: GGUF's K
    types (``d * sc`` with a 6-bit sc, 17 significant bits: no binary16 number). The int8
    array nm_scales.c8 describes, ``(grids * (4 * supers + blocks), ld)``: each grid's
    factors (``supers`` float32 rows, four int8 rows each), then each grid's codes; a new
    array on a cache line. None when some value has no such form (a code past 127, a
    super-block holding both zeros' signs, ``blocks`` no multiple of ``per_super``)."""
    rows, ld = grid.shape
    blocks = rows // grids
    if per_super < 2 or blocks == 0 or blocks % per_super or not np.isfinite(grid).all():
        return None
    supers = blocks // per_super
    v = grid.reshape(grids, supers, per_super, ld)
    out = aligned_empty((grids * (4 * supers + blocks), ld), np.int8)
    factors = out[:grids * 4 * supers].view(np.float32).reshape(grids, supers, ld)
    codes = out[grids * 4 * supers:].reshape(grids, supers, per_super, ld)
    step = max(1, (1 << 16) // (grids * blocks))  # columns a pass: small temporaries
    for j in range(0, ld, step):
        part = _factor_columns(v[..., j:j + step])
        if part is None:
            return None
        factors[..., j:j + step], codes[..., j:j + step] = part
    return out


def _factor_columns(v: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """factored_grid's work on ``v`` (grids, supers, per_super, columns): the factors
    (grids, supers, columns) and codes, or None."""
    bits = v.view(np.int32) & 0x7FFFFFFF
    exponent, fraction = bits >> 23, bits & 0x7FFFFF
    significand = np.where(exponent > 0, fraction | 0x800000, fraction)  # |v| = M * 2^E
    power = np.where(exponent > 0, exponent - 150, -149)
    nonzero = significand != 0
    # strip trailing zero bits, |v| = odd * 2^low (the lowest set bit, a power of two, read
    # from its float32 exponent)
    lowest = np.where(nonzero, significand & -significand, 1).astype(np.float32)
    trailing = (lowest.view(np.int32) >> 23) - 127
    odd, low = significand >> trailing, power + trailing
    # the smallest power a super-block's nonzero values share, and their multiples of it
    floor = np.min(np.where(nonzero, low, 1 << 20), axis=2, keepdims=True)
    shift = np.where(nonzero, low - floor, 0)
    if (shift > 7).any():  # a code would need more than 8 bits beside the common factor
        return None
    multiple = odd << shift  # below 2^31
    g = np.gcd.reduce(multiple, axis=2, keepdims=True)
    empty = g == 0  # an all-zero super-block
    g = np.where(empty, 1, g)
    floor = np.where(empty, 0, floor)
    negative = np.signbit(v)
    codes = np.where(negative, -(multiple // g), multiple // g)  # for a positive factor
    zero_sign = ~nonzero & negative  # a -0 needs a negative factor (its code is 0)
    if (zero_sign.any(axis=2) & (~nonzero & ~negative).any(axis=2)).any():
        return None
    # a negative factor for a -0, or for a code of 128 (Q6_K's largest sub-scale is -128)
    flip = (zero_sign.any(axis=2, keepdims=True)
            | (codes.max(axis=2, keepdims=True) > 127))
    signed = np.where(flip, -codes, codes)
    if (signed > 127).any() or (signed < -128).any():
        return None
    factor = np.ldexp(g.astype(np.float64), floor).astype(np.float32)
    factor = np.where(flip, -factor, factor)
    signed = signed.astype(np.int8)
    with np.errstate(all="ignore"):
        back = factor * signed.astype(np.float32)
    if not np.array_equal(back.view(np.int32), v.view(np.int32)):  # bit for bit, or none
        return None
    return factor[:, :, 0], signed


def factored_sliver_major(grid: np.ndarray, grids: int, blocks: int,
                          width: int) -> np.ndarray:
    """A row-major factored grid (:func:`factored_grid`) as packed weights give it to the
    kernels: ``(grids * slivers, 4 * supers + blocks, width)``, each sliver's factors then its
    codes (nm_scales.lsl), as :func:`sliver_major` orders a float grid; a new array on a
    cache line."""
    factors, codes = _factored_parts(grid, grids, blocks)
    supers, slivers = factors.shape[1], factors.shape[2] // width
    out = weights_empty((grids * slivers, 4 * supers + blocks, width), np.int8)
    four = out.reshape(grids, slivers, 4 * supers + blocks, width)
    slab = four[:, :, :4 * supers].reshape(grids, slivers, 4 * supers * width)  # a view
    slab.view(np.float32).reshape(grids, slivers, supers, width)[...] = (
        factors.reshape(grids, supers, slivers, width).transpose(0, 2, 1, 3))
    four[:, :, 4 * supers:] = codes.reshape(grids, blocks, slivers, width).transpose(0, 2, 1, 3)
    return out


def _factored_parts(grid: np.ndarray, grids: int, blocks: int,
                    columns: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A factored grid's factors ``(grids, supers, columns)`` float32 and codes ``(grids,
    blocks, columns)`` int8, from either layout, all its columns or ``columns`` only."""
    if grid.ndim == 3:  # (grids * slivers, 4 * supers + blocks, width)
        count, rows, width = grid.shape
        slivers, supers = count // grids, (rows - blocks) // 4
        four = grid.reshape(grids, slivers, rows, width)
        factors = (four[:, :, :4 * supers].reshape(grids, slivers, 4 * supers * width)
                   .view(np.float32).reshape(grids, slivers, supers, width))
        codes = four[:, :, 4 * supers:]
        if columns is not None:  # (columns, grids, rows) by the indexing rules: moved back
            at, within = columns // width, columns % width
            return (factors[:, at, :, within].transpose(1, 2, 0),
                    codes[:, at, :, within].transpose(1, 2, 0))
        return (factors.transpose(0, 2, 1, 3).reshape(grids, supers, slivers * width),
                codes.transpose(0, 2, 1, 3).reshape(grids, blocks, slivers * width))
    rows, ld = grid.shape
    supers = (rows // grids - blocks) // 4
    factors = grid[:grids * 4 * supers].view(np.float32).reshape(grids, supers, ld)
    codes = grid[grids * 4 * supers:].reshape(grids, blocks, ld)
    if columns is not None:
        factors, codes = factors[..., columns], codes[..., columns]
    return factors, codes


def factored_values(grid: np.ndarray, grids: int, blocks: int,
                    columns: np.ndarray | None = None) -> np.ndarray:
    """The float32 grid ``(grids * blocks, columns)`` of a factored one (:func:`factored_grid`,
    row-major or :func:`factored_sliver_major`), or of its ``columns`` only: each code times
    its super-block's factor, as the kernels multiply them."""
    factors, codes = _factored_parts(grid, grids, blocks, columns)
    supers = factors.shape[1]
    codes = codes.reshape(grids, supers, blocks // supers, -1)
    return (factors[:, :, None] * codes.astype(np.float32)).reshape(grids * blocks, -1)


def sliver_major(grid: np.ndarray, grids: int, width: int) -> np.ndarray:
    """A kernels' grid ``(grids * blocks, slivers * width)`` (the scales, then the offsets
    below them) as packed weights give it to the kernels: ``(grids * slivers, blocks,
    width)``, each sliver's blocks one after another, as its codes are (nm_scales.lsl); a
    new array, starting on a cache line."""
    rows, cols = grid.shape
    blocks, slivers = rows // grids, cols // width
    out = weights_empty((grids * slivers, blocks, width), grid.dtype)
    out.reshape(grids, slivers, blocks, width)[...] = (
        grid.reshape(grids, blocks, slivers, width).transpose(0, 2, 1, 3))
    return out


def row_major(grid: np.ndarray, grids: int) -> np.ndarray:
    """The row-major grid ``(grids * blocks, slivers * width)`` of a sliver-major one."""
    count, blocks, width = grid.shape
    slivers = count // grids
    four = grid.reshape(grids, slivers, blocks, width).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(four).reshape(grids * blocks, slivers * width)


class GridScales(Scales):
    """Scales (or offsets) read from a kernels' grid (:meth:`Weights.kernel_scales`' form,
    row-major or sliver-major, float16, float32 or factored, times ``2**scale_exponent``)
    each time ``values`` is asked for, never kept: what a layer that stores only that grid
    (``narrowmm.torch.Linear``) hands the weights it computes with, and what weights made
    from a checkpoint's ``TorchWeights`` hold (:meth:`_ScaledMatrix.keep_kernel_scales_only`).
    The native kernels read the grid itself; the float32 grid the checks, the NumPy and
    reference providers and :meth:`decode` read is made for them and dropped, so the weights
    do not hold a second, float32 copy of their scales beside the kernels' (a third of a
    4-bit GGUF file's bytes).

    Args:
        grid: the kernels' grid, ``parts`` grids stacked (the scales, then the offsets).
        part: which of them (0: the scales, 1: the offsets).
        n: the matrix's columns (the grid may have more: whole slivers).
        bk: rows a block of scales covers.
        scale_exponent: r, undone on the scales (exact), not on the offsets.
        k: the matrix's rows: required for a factored grid (int8), whose blocks it counts.
    """

    __slots__ = ("_blocks", "_grid", "_n", "_part", "_parts", "_scale_exponent")

    def __init__(self, grid: np.ndarray, part: int, parts: int, n: int, bk: int,
                 scale_exponent: int = 0, k: int | None = None) -> None:
        if grid.ndim not in (2, 3) or grid.shape[0] % parts:
            raise ValueError(f"a kernels' grid of {parts} parts must be 2-D or 3-D with a "
                             f"multiple of {parts} leading rows, got shape {grid.shape}")
        if grid.dtype == np.int8 and k is None:
            raise ValueError("a factored (int8) kernels' grid needs the matrix's rows k to "
                             f"count its blocks, got shape {grid.shape}")
        self._grid, self._part, self._parts, self._n = grid, part, parts, n
        self._scale_exponent = scale_exponent
        self._blocks = -(-k // bk) if grid.dtype == np.int8 and k else 0
        self.block = (bk, 1)

    @property
    def values(self) -> np.ndarray:  # type: ignore[override]  # a new, read-only array
        grid, part, parts, n = self._grid, self._part, self._parts, self._n
        if grid.dtype == np.int8:  # factored: multiplied out as the kernels do (row-major)
            grid = factored_values(grid, parts, self._blocks)
        count = grid.shape[0] // parts
        mine = grid[part * count:(part + 1) * count]
        if grid.ndim == 3:  # sliver-major (slivers, blocks, width)
            mine = row_major(mine, 1)
        out = np.array(mine[:, :n], dtype=np.float32)  # float16 grids: exact
        if part == 0 and self._scale_exponent:
            out *= np.float32(2.0 ** -self._scale_exponent)  # exact
        out.flags.writeable = False
        return out

    def __repr__(self) -> str:
        grid = self._grid
        blocks = (self._blocks if grid.dtype == np.int8 else grid.shape[1] if grid.ndim == 3
                  else grid.shape[0] // self._parts)
        return f"Scales({self.kind}, grid={(blocks, self._n)}, block={self.block})"


class _KernelScales:
    """The native kernels' form of a matrix's scales (nm_scales: expanded, times 2^r), made
    once per row width, and whether the weights hold no NaN/Inf code (looked at once). With
    ``half``, the grid is float16 for a format with ``half_scales`` whose every scale and
    offset is a binary16 number (GGUF's d and m are), else float32: the same values either
    way. With ``width`` (packed weights), it is sliver-major (:func:`sliver_major`), or, for
    values that are no binary16 numbers but factor exactly per super-block (the K types'
    ``d * sc``), a factored int8 grid (:func:`factored_grid`), sliver-major as well
    (:func:`factored_sliver_major`)."""

    __slots__ = ("_by_ld", "_finite")

    def __init__(self) -> None:
        self._by_ld: dict[int, tuple[np.ndarray, int]] = {}
        self._finite: bool | None = None

    def get(self, scales: Scales, fmt: Format, bits: np.ndarray, shape: tuple[int, int],
            ld: int, offsets: Scales | None = None, half: bool = False,
            width: int = 0) -> tuple[np.ndarray, int, bool]:
        if ld not in self._by_ld:  # made once: the checks and the work below, not per call
            if width and ld != padded_columns(shape[1], width):
                raise ValueError(f"packed weights' scales are {padded_columns(shape[1], width)} "
                                 f"columns wide (whole {width}-column slivers), not ld={ld}")
            grid, bk = scales.expanded(shape, ld)
            grid *= np.float32(2.0 ** fmt.scale_exponent)  # exact: checked_scales' bound
            if offsets is not None:  # below the scales, as many rows (the binding splits it)
                ogrid, _ = offsets.expanded(shape, ld)
                ogrid[:, shape[1]:] = 0.0
                grid = np.ascontiguousarray(np.concatenate([grid, ogrid]))
            parts = 2 if offsets is not None else 1
            if half and fmt.half_scales:
                grid = half_grid(grid)
                factored = (factored_grid(grid, parts, super_blocks_of(bk))
                            if grid.dtype == np.float32 and width and factored_scales_enabled()
                            else None)
                grid = grid if factored is None else factored  # GGUF's K types: d * sc
            if width and grid.dtype == np.int8:  # a new array on a line, as below
                grid = factored_sliver_major(grid, parts, -(-shape[0] // bk), width)
            elif width:  # sliver_major's copy starts on a line: line_aligned keeps it
                grid = sliver_major(grid, parts, width)
            self._by_ld[ld] = line_aligned(grid), bk
        if self._finite is None:  # special_bits: the magnitude bits all NaN/Inf codes share
            special = np.uint8(fmt.special_bits)
            self._finite = not special or not bool(np.any((bits & special) == special))
        return (*self._by_ld[ld], self._finite)

    def preset(self, grid: np.ndarray, bk: int, finite: bool, ld: int) -> None:
        """Take a kernels' form made before (for ``ld`` columns) as it is."""
        self._by_ld[ld] = grid, bk
        self._finite = finite


def check_layout(a: np.ndarray, what: str) -> None:
    """Raise unless ``a`` is 2-D with contiguous rows and a non-negative row stride."""
    if a.ndim != 2:
        raise ValueError(f"{what} must be 2-D (k, n), got shape {a.shape}")
    if not a.dtype.isnative:
        raise TypeError(f"{what} has non-native byte order {a.dtype.str}; convert it first")
    if a.size == 0:
        return  # no element is ever addressed
    if a.shape[1] > 1 and a.strides[1] != a.itemsize:
        raise ValueError(
            f"{what} must have contiguous rows (inner stride {a.strides[1]} bytes, "
            f"item size {a.itemsize}); pass numpy.ascontiguousarray(...)"
        )
    if a.shape[0] > 1 and a.strides[0] < 0:
        raise ValueError(f"{what} has a negative row stride; pass numpy.ascontiguousarray(...)")


def bits_array(bits: object, fmt: Format) -> np.ndarray:
    """``bits`` as ``fmt``'s storage dtype, once its dtype and layout are checked."""
    a = as_array(bits, "bits").view(np.ndarray)
    if fmt.itemsize in (1, 2) and not (a.dtype.kind in "ui" and a.dtype.itemsize == fmt.itemsize):
        kind = "uint16 or int16" if fmt.itemsize == 2 else "uint8 or int8"
        raise TypeError(f"{fmt.name} bits must be {kind}, got {a.dtype}")
    if fmt.itemsize == 4 and a.dtype not in (np.dtype(np.uint32), np.dtype(np.float32)):
        raise TypeError(f"f32 bits must be uint32 or float32, got {a.dtype}")
    check_layout(a, "bits")
    check_codes(a, fmt)
    return a.view(fmt.storage)


class _ScaledMatrix:
    """What Weights and PackedWeights share about scales (both have ``scales``,
    ``format``, ``bits``, ``shape`` and a ``_KernelScales``)."""

    __slots__ = ()

    # Whether the kernels' grid may be float16 (Format.half_scales): for packed weights,
    # whose m <= 2 walks read it as it is; row-major gemvs would have it widened by the frame
    # first, which measured slower for the 4-bit formats (docs/kernels.md).
    _half_grids = False
    # The sliver width of a sliver-major grid (packed weights: the m <= 2 walks read each
    # sliver's scales as one stream beside its codes; the C core calls these slivers the
    # packed layout's groups), or 0: row-major.
    _grid_width = 0

    def kernel_scales(self, ld: int | None = None) -> tuple[np.ndarray, int, bool] | None:
        """The scales in the native kernels' form: ``(grid, bk, finite)``, the grid
        :meth:`Scales.expanded` to ``ld`` columns times ``2**format.scale_exponent`` (for
        packed weights of a format with ``half_scales``, float16 when every value is a
        binary16 number; else float32; offsets below the scales; for packed weights
        sliver-major, :func:`sliver_major`), and whether no weight is a NaN/Inf code. Made
        once per ``ld``, by default n (packed weights: whole slivers, the only width their
        grid takes); None without scales."""
        if self.scales is None:
            return None
        width = self._grid_width
        if ld is None:
            n = self.shape[1]
            ld = padded_columns(n, width) if width else n
        return self._kernel_scales.get(self.scales, self.format, self.bits, self.shape, ld,
                                       self.offsets, self._half_grids, width)

    def preset_kernel_scales(self, grid: np.ndarray, bk: int, finite: bool) -> None:
        """Hand over the kernels' form of the scales, made before from these same scales
        and bits (narrowmm.torch.Linear stores it): ``kernel_scales`` then returns it
        without making it again or looking at the codes."""
        grids = 2 if self.format.offsets else 1
        ld = grid.shape[1] if grid.ndim == 2 else grid.shape[0] // grids * grid.shape[2]
        self._kernel_scales.preset(grid, bk, finite, ld)

    def keep_kernel_scales_only(self) -> None:
        """Make the kernels' form of the scales now (:meth:`kernel_scales`) and read the
        Scales from it from then on (:class:`GridScales`), dropping the float32 ones: for
        weights that hold a copy of their own (``TorchWeights.transpose`` and ``pack``
        transpose the caller's), so that they keep one copy, the kernels'. Only for blocks
        of rows one column wide (GGUF's, block ``(bk, 1)``), whose kernels' grid holds the
        same values (times 2^r; float16 when exact, for packed weights), nothing more."""
        if self.scales is None or self.scales.block[0] == 0 or self.scales.block[1] != 1:
            return
        grid, bk, _ = self.kernel_scales()
        parts = 2 if self.offsets is not None else 1
        (k, n), r = self.shape, self.format.scale_exponent
        self.scales = GridScales(grid, 0, parts, n, bk, r, k)
        if self.offsets is not None:
            self.offsets = GridScales(grid, 1, parts, n, bk, k=k)

    def provider_scales(self) -> tuple[np.ndarray, int] | None:
        """The scales as the NumPy and reference providers take them: the grid
        :meth:`Scales.expanded` to n columns, and bk; None without scales."""
        return None if self.scales is None else self.scales.expanded(self.shape, self.shape[1])

    def raw_rows(self, decoded: np.ndarray) -> np.ndarray:
        """The (k, n) raw values (before scales) of these row-major bits as a codec decodes
        them: for a 4-bit format (bits' shape + (2,)), each stored row's pairs as two rows."""
        return expand_pairs(decoded, 0) if self.format.kpack > 1 else decoded

    def provider_offsets(self) -> np.ndarray | None:
        """The offsets in the same form (the grid only: its bk is the scales'), or None."""
        return (None if self.offsets is None
                else self.offsets.expanded(self.shape, self.shape[1])[0])


class Weights(_ScaledMatrix):
    """A weight matrix B of shape (k, n) in a storage format (``"f32"``, ``"fp16"``,
    ``"bf16"``, ``"e4m3fn"``, ``"e5m2"``, and GGUF's ``"q8_0"``, ``"q4_0"``, ``"q4_1"``,
    ``"q5_1"``).

    ``Weights(array)`` wraps without copying: a NumPy float16 array is fp16, an ml_dtypes
    bfloat16 array is bf16, an ml_dtypes float8_e4m3fn / float8_e5m2 array is e4m3fn /
    e5m2, a float32 array is f32; any object with ``__dlpack__`` (a PyTorch float16 /
    bfloat16 / float32 tensor, say) is imported zero-copy first. Raw bit patterns go
    through :meth:`from_bits`; float32 values to be rounded go through :meth:`encode` or,
    with scales computed from the values, :meth:`quantize`.

    The FP8 formats and GGUF's ``q8_0`` (int8 codes) carry :class:`~narrowmm.Scales` (1.0
    for the whole matrix unless given): weight (p, j) is ``fl32(decode(q[p, j]) * scale)``,
    and every provider, ISA and thread count computes the same chains on those weights.
    The GGUF formats' weights come from :meth:`quantize` (GGUF's own rule, bit for bit) or
    a GGUF file (:func:`narrowmm.load_gguf`); any float32 scales are accepted. The 4-bit
    ones hold two rows a byte (:meth:`from_bits`), ``q5_1`` a 5-bit code a byte, and
    ``q4_1`` and ``q5_1`` an ``offsets`` grid beside their scales: weight =
    fma(decode(q), scale, offset). FP8 codes are looked
    at once, at the first native call, for NaN/Inf codes (weights without any take faster
    kernels): write into ``bits`` afterwards and build new Weights.

    The array must be 2-D with contiguous rows; row strides may be larger than a row
    (a sub-block of a bigger matrix) and the data need not be aligned.

    Attributes:
        format: the :class:`~narrowmm.Format`.
        bits: the stored elements as a NumPy array of ``format.storage`` dtype (uint16 or
            uint8 bit patterns, or float32 for f32), sharing memory with what was wrapped.
        scales: the :class:`~narrowmm.Scales` of a scaled format, else None.
    """

    __slots__ = ("_kernel_scales", "bits", "format", "offsets", "scales")
    packed = False  # row-major (PackedWeights: True)

    def __init__(self, array: object, format: str | Format | None = None,
                 scales: Scales | None = None) -> None:
        if isinstance(array, TorchWeights):
            raise TypeError(f"{array!r} is in PyTorch's (out_features, in_features) layout; "
                            "narrowmm's Weights are (in_features, out_features): use "
                            "w.transpose() to get them, or nm.Linear(w) for x @ W.T")
        a = as_array(array, "weights")
        fmt = _format_of(a)
        if fmt is None:
            if a.dtype.kind in "ui" and a.dtype.itemsize in (1, 2):
                raise TypeError(
                    f"weights of dtype {a.dtype} are raw bits: use "
                    "Weights.from_bits(bits, format) and name the format"
                )
            raise TypeError(
                f"weights of dtype {a.dtype} cannot be wrapped; expected float16, "
                "ml_dtypes bfloat16 / float8_e4m3fn / float8_e5m2 or float32 (use "
                "Weights.encode to round float32 values)"
            )
        if format is not None and get_format(format) is not fmt:
            wanted = get_format(format).name
            raise ValueError(f"array of dtype {a.dtype} is {fmt.name}, not {wanted}")
        check_layout(a, "weights")
        self.format: Format = fmt
        self.bits: np.ndarray = a.view(np.ndarray).view(fmt.storage)
        self.scales: Scales | None = checked_scales(fmt, scales, self.bits.shape)
        self.offsets: Scales | None = None
        self._kernel_scales = _KernelScales()

    @classmethod
    def from_bits(cls, bits: object, format: str | Format,
                  scales: Scales | None = None, offsets: Scales | None = None) -> Weights:
        """Wrap raw bit patterns: uint16 (or int16) for fp16/bf16, uint8 (or int8) for
        e4m3fn/e5m2/q8_0 (with their ``scales``, 1.0 if None), float32 or uint32 for f32.
        The 4-bit formats (q4_0, q4_1) hold two rows a byte: ``(k / 2, n)`` uint8 bits,
        byte ``(r, j)`` the codes of rows 2r (low nibble) and 2r + 1 (high nibble) of
        column j; q5_1 one code (0 to 31) a byte. q4_1 and q5_1 also take their ``offsets``
        (a Scales in the scales' blocks)."""
        fmt = get_format(format)
        self = cls.__new__(cls)
        self.format = fmt
        self.bits = bits_array(bits, fmt)
        shape = stored_shape(fmt, self.bits.shape, 0)
        self.scales = checked_scales(fmt, scales, shape)
        self.offsets = checked_offsets(fmt, offsets, self.scales, shape)
        check_block_rows(fmt, self.scales, shape[0])
        self._kernel_scales = _KernelScales()
        return self

    @classmethod
    def encode(cls, values: object, format: str | Format, *,
               saturate: bool = False) -> Weights:
        """Round float32 ``values`` (k, n) to ``format`` (nearest even) into new storage.

        For an FP8 format the values are stored as they are, with a scale of 1.0 (see
        :meth:`quantize` for scales fitted to the values); ``saturate=True`` clamps what
        overflows to the largest finite value instead of NaN (e4m3fn) or Inf (e5m2)."""

        fmt = get_format(format)
        a = as_array(values, "values")
        if a.ndim != 2:
            raise ValueError(f"values must be 2-D (k, n), got shape {a.shape}")
        if fmt.name == "f32":
            if a.dtype != np.float32:
                raise TypeError(f"values must be float32, got {a.dtype}")
            return cls.from_bits(np.array(a, dtype=np.float32, order="C"), fmt)
        return cls.from_bits(encode(a, fmt, saturate=saturate), fmt)

    @classmethod
    def quantize(cls, values: object, format: str | Format = "e4m3fn",
                 block: str | tuple[int, int] | None = None) -> Weights:
        """Scaled weights for float32 ``values`` (k, n).

        FP8: each block's scale is its largest magnitude over the format's largest finite
        value (1.0 for an all-zero block), and ``q = encode(values / scale, saturate=True)``.

        The GGUF formats: GGUF's quantizers (``ggml-quants.c``, ``gguf.quants.quantize``),
        bit for bit, all in float32, 0 for ``1 / d`` where d is 0, and the scales (and
        offsets) stored rounded to fp16, as a GGUF file stores them (a block whose fp16
        scale would overflow raises ValueError):

        - ``q8_0``: ``d = amax / 127``, ``q = roundf(x * (1 / d))``;
        - ``q4_0``: ``d = max / -8`` (max: the value of largest magnitude, the first of
          equals), ``q = min(15, trunc(x * (1 / d) + 8.5))``, standing for ``q - 8``;
        - ``q4_1``: ``d = (max - min) / 15``, offset ``min``,
          ``q = min(15, trunc((x - min) * (1 / d) + 0.5))``;
        - ``q5_1``: the same over 31 steps, ``q = min(31, ...)``.

        The 4-bit formats need an even k (two rows a byte).

        Args:
            values: float32 (k, n), finite.
            format: ``"e4m3fn"``, ``"e5m2"`` or a GGUF format (``"q8_0"``, ``"q4_0"``,
                ``"q4_1"``, ``"q5_1"``).
            block: ``"columns"`` (one scale per output column; FP8's default),
                ``"tensor"`` (one scale), or ``(bk, bn)`` blocks (e.g. ``(128, 128)``;
                ``q8_0``'s default is GGUF's ``(32, 1)``: 32 input features of a column).
        """
        fmt = get_format(format)
        if not fmt.scaled:
            raise ValueError(f"quantize makes scaled weights; {fmt.name!r} has no scales")
        a = as_array(values, "values")
        if a.ndim != 2 or a.dtype != np.float32:
            raise TypeError(f"values must be 2-D float32, got {a.dtype} of shape {a.shape}")
        if not np.isfinite(a).all():
            raise ValueError("values to quantize must be finite")
        k, n = a.shape
        if block is None:
            block = (fmt.gguf_block, 1) if fmt.gguf_block else "columns"
        if block == "columns":
            bk, bn = 0, 1
        elif block == "tensor":
            bk, bn = 0, 0
        elif isinstance(block, tuple) and len(block) == 2 and all(
                isinstance(b, int) and b > 0 for b in block):
            bk, bn = block
        else:
            raise ValueError(f"block must be 'columns', 'tensor' or (bk, bn) positive "
                             f"sizes, got {block!r}")
        rows_b = k if bk == 0 else bk
        cols_b = n if bn == 0 else bn
        kb, nb = max(1, -(-k // rows_b)), max(1, -(-n // cols_b))
        mag = np.zeros((kb * rows_b, nb * cols_b), np.float32)
        mag[:k, :n] = np.abs(a)
        amax = mag.reshape(kb, rows_b, nb, cols_b).max(axis=(1, 3))
        if fmt.kpack > 1 or fmt.offsets:
            return _quantize_gguf_blocks(cls, a, fmt, (bk, bn), (kb, rows_b, nb, cols_b))
        if fmt.integer:
            return _quantize_gguf_symmetric(cls, a, fmt, amax, (bk, bn))
        grid = np.where(amax > 0, amax / np.float32(fmt.max_finite), np.float32(1))
        scales = Scales(grid.astype(np.float32), (bk, bn))
        expanded, step = scales.expanded((k, n), n)
        with np.errstate(all="ignore"):
            scaled = a / expanded[np.arange(k) // step]

        return cls.from_bits(encode(np.ascontiguousarray(scaled), fmt, saturate=True), fmt,
                             scales)

    @property
    def shape(self) -> tuple[int, int]:
        """(k, n): input features by output features."""
        return stored_shape(self.format, self.bits.shape, 0)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored elements."""
        return self.bits.size * self.format.itemsize

    def decode(self) -> np.ndarray:
        """The exact float32 weights as a new (k, n) array (with their scales applied:
        ``fl32(decode(q) * scale)`` for a scaled format, ``fma(decode(q), scale, offset)``
        with offsets)."""

        if self.format.name == "f32":
            return np.array(self.bits, dtype=np.float32)
        values = self.raw_rows(decode(self.bits, self.format))
        return values if self.scales is None else apply(values, self.scales, self.offsets)

    def pack(self) -> PackedWeights:
        """A copy in the native ISA row's packed layout, for faster calls with the same bits.

        The matrix is stored as slivers of the row's packed width for the format
        (``PackedWeights.width``), each sliver's k rows contiguous: for the formats of a
        byte or less a weight four of the row's microkernel slivers side by side (96
        columns on avx2, 128 on avx512, 32 on neon; two, 16, on scalar), for the 16- and
        32-bit ones one (24, 32, 8, 8). The batch-1 kernel then reads one long contiguous
        stream for a few slivers instead of k short rows, which is faster at small batches
        (``docs/kernels.md`` has the measurements).
        Pack once, when the model loads; the copy takes about the same memory as these
        weights (the last sliver padded with zero columns), and starts on a 64-byte cache
        line, as do the kernels' grids of scales.

        Raises:
            RuntimeError: the native core is not loaded (there is no row to pack for).
            EnvironmentVariableError: ``NARROWMM_ISA`` names a row that cannot be used.
        """

        c = checked_core()
        return PackedWeights(pack_slivers(self.bits, int(c.pack_width(self.format.code)),
                                          self.format.packed_xor, c),
                             self.shape[1],
                             self.format, c.isa(), self.scales, self.offsets)

    def __repr__(self) -> str:
        k, n = self.shape
        extra = "" if self.scales is None else f", scales={self.scales!r}"
        return f"Weights(k={k}, n={n}, format={self.format.name!r}{extra})"


def roundf(x: np.ndarray) -> np.ndarray:
    """C's ``roundf`` on float32: to the nearest integer, halves away from zero (exact:
    ``|x| - floor(|x|)`` is the fraction, with no rounding)."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= np.float32(0.5)), x).astype(np.float32)


def _quantize_gguf_symmetric(cls: type[Weights], a: np.ndarray, fmt: Format,
                             amax: np.ndarray, block: tuple[int, int]) -> Weights:
    """Weights.quantize for GGUF's symmetric integer type (Q8_0): the float32 scale
    ``d = amax / max_code`` sets the codes, its fp16 rounding is what is stored."""
    k, n = a.shape
    with np.errstate(all="ignore"):
        d = (amax / np.float32(fmt.max_finite)).astype(np.float32)
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        d16 = d.astype(np.float16)
    if not np.isfinite(d16).all():
        bad = float(amax[~np.isfinite(d16)].flat[0])
        raise ValueError(f"{fmt.name}: a block's largest magnitude {bad!r} makes a scale "
                         f"past fp16's range (65504 * {fmt.max_finite:g})")
    rows = np.arange(k) // (block[0] or max(k, 1))
    cols = np.zeros(n, np.intp) if block[1] == 0 else np.arange(n) // block[1]
    with np.errstate(all="ignore"):
        codes = roundf(a * inv[rows][:, cols])
    # C order whatever the input's: a transposed view makes the product column-major
    bits = codes.astype(np.int8, order="C").view(np.uint8)
    return cls.from_bits(bits, fmt, Scales(d16.astype(np.float32), block))


def _quantize_gguf_blocks(cls: type[Weights], a: np.ndarray, fmt: Format,
                          block: tuple[int, int], grid: tuple[int, int, int, int]) -> Weights:
    """Weights.quantize for GGUF's 4-bit types and those with offsets (Q4_0, Q4_1, Q5_1):
    per block, the float32 scale (and offset) set the codes; their fp16 roundings are what
    is stored."""
    k, n = a.shape
    if k % fmt.kpack:
        raise ValueError(f"{fmt.name} stores {fmt.kpack} rows a byte: k must be even, got {k}")
    kb, rows_b, nb, cols_b = grid
    shape4 = (kb, rows_b, nb, cols_b)

    def blocks_of(fill: float) -> np.ndarray:
        """a in the (kb, bk, nb, bn) grid, the cells past the matrix set to ``fill``."""
        out = np.full((kb * rows_b, nb * cols_b), fill, np.float32)
        out[:k, :n] = a
        return out.reshape(shape4)

    with np.errstate(all="ignore"):
        if fmt.offsets:  # Q4_1, Q5_1: from the block's minimum over 15 (31) steps
            hi = blocks_of(-np.inf).max(axis=(1, 3))
            lo = blocks_of(np.inf).min(axis=(1, 3))
            d = ((hi - lo) / np.float32(fmt.max_finite)).astype(np.float32)
        else:  # Q4_0: the value of largest magnitude (the first of equals) is -8 steps
            cells = blocks_of(0.0).transpose(0, 2, 1, 3).reshape(kb, nb, rows_b * cols_b)
            first = np.abs(cells).argmax(axis=2)
            d = (np.take_along_axis(cells, first[..., None], 2)[..., 0]
                 / np.float32(-8)).astype(np.float32)
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        d16 = d.astype(np.float16)
    if not np.isfinite(d16).all():
        raise ValueError(f"{fmt.name}: a block's range makes a scale past fp16's range "
                         f"({float(d[~np.isfinite(d16)].flat[0])!r})")
    rows = np.arange(k) // (block[0] or max(k, 1))
    cols = np.zeros(n, np.intp) if block[1] == 0 else np.arange(n) // block[1]
    with np.errstate(all="ignore"):
        base = a - lo[rows][:, cols] if fmt.offsets else a
        raw = (base * inv[rows][:, cols]).astype(np.float32)  # what the codes round
    if fmt.kpack > 1:  # two rows a byte: the values in pairs along a last axis
        raw = np.ascontiguousarray(raw.reshape(k // 2, 2, n).transpose(0, 2, 1))
    bits = encode(np.ascontiguousarray(raw), fmt, saturate=True)  # GGUF clamps the codes
    offsets = Scales(lo.astype(np.float16).astype(np.float32), block) if fmt.offsets else None
    return cls.from_bits(bits, fmt, Scales(d16.astype(np.float32), block), offsets)


# The packed layout, written once on this side (narrowmm.h's nm_packed_offset is the C side,
# which calls these slivers groups: each is a few of the microkernel's NR-column slivers side
# by side): sliver s holds columns [s * width, (s + 1) * width) as k rows of width weights,
# the columns past n zero; ceil(n / width) slivers one after another; every byte XOR-ed with
# the format's packed_xor (Q4_0's 0x88: its nibbles q - 8 in two's complement).

def padded_columns(n: int, width: int) -> int:
    """Columns of ``n`` padded to whole slivers of ``width``."""
    return -(-n // width) * width


def pack_slivers(bits: np.ndarray, width: int, xor: int = 0, core: Any = None) -> np.ndarray:
    """(k, n) ``bits`` (any strides: a transposed view too) as ``(ceil(n / width), k,
    width)`` slivers, zero-padded, every byte XOR-ed with ``xor`` (a format's
    ``packed_xor``); one new array, starting on a cache line (in the load's huge-page
    arena while one is open: ``narrowmm._arena``). With ``core`` (the native
    module), its ``pack_slivers`` copies (``nm_pack_slivers``: a GGUF tensor's transposed
    codes 3-5x faster, docs/results/load-gguf-zen3-2026-12-06.txt); else NumPy, a sliver
    at a time. The same bytes either way."""
    k, n = bits.shape
    slivers = padded_columns(n, width) // width
    out = weights_empty((slivers, k, width), bits.dtype)
    if core is not None and bits.dtype.itemsize in (1, 2, 4) and min(bits.strides) >= 0:
        core.pack_slivers(bits, width, xor, out)
        return out
    for s in range(slivers):
        cols = bits[:, s * width:(s + 1) * width]
        out[s, :, :cols.shape[1]] = cols
        out[s, :, cols.shape[1]:] = 0
        if xor:
            np.bitwise_xor(out[s], np.uint8(xor), out=out[s])
    return out


def unpack_slivers(slivers: np.ndarray, n: int, xor: int = 0) -> np.ndarray:
    """The (k, n) row-major bits of ``(slivers, k, width)`` packed ones (a new array), each
    byte XOR-ed back with ``xor`` (the format's ``packed_xor``)."""
    count, k, width = slivers.shape
    bits = np.ascontiguousarray(slivers.transpose(1, 0, 2).reshape(k, count * width)[:, :n])
    if xor:
        np.bitwise_xor(bits, np.uint8(xor), out=bits)
    return bits


class PackedWeights(_ScaledMatrix):
    """A weight matrix in a native ISA row's packed layout; made by :meth:`Weights.pack`.

    ``matmul`` accepts it wherever it accepts :class:`Weights` and gives the same bits. The
    layout belongs to the row that packed it (``isa``): under a row with another sliver
    width (``NARROWMM_ISA`` forcing another row, say) ``matmul`` raises ``ValueError``;
    pack again there. Providers other than the native one compute on :meth:`unpack`.

    Attributes:
        format: the :class:`~narrowmm.Format`.
        width: columns per sliver.
        isa: the ISA row it was packed for.
        bits: the slivers, shape ``(ceil(n / width), k, width)``, columns past n zero, each
            byte XOR-ed with the format's ``packed_xor`` (Q4_0's 0x88; :meth:`unpack` gives
            the codes back).
        sliver_rows: the same memory as ``(slivers * k, width)``, as the C core takes it.
    """

    __slots__ = ("_kernel_scales", "_n", "bits", "format", "isa", "offsets", "scales",
                 "sliver_rows", "width")
    packed = True
    _half_grids = True  # the m <= 2 packed walks stream the grid: binary16 halves it

    @property
    def _grid_width(self) -> int:  # the kernels read each sliver's scales as one stream
        return self.width

    def __init__(self, bits: np.ndarray, n: int, format: Format, isa: str,
                 scales: Scales | None = None, offsets: Scales | None = None) -> None:
        self.bits: np.ndarray = bits
        # the view the native binding takes, made once, not per call
        self.sliver_rows: np.ndarray = bits.reshape(-1, bits.shape[2])
        self._n = n
        self.format: Format = format
        self.width: int = bits.shape[2]
        self.isa: str = isa
        self.scales: Scales | None = checked_scales(format, scales, self.shape)
        self.offsets: Scales | None = checked_offsets(format, offsets, self.scales, self.shape)
        self._kernel_scales = _KernelScales()

    @property
    def shape(self) -> tuple[int, int]:
        """(k, n): input features by output features."""
        return self.bits.shape[1] * self.format.kpack, self._n

    @property
    def nbytes(self) -> int:
        """Bytes of the stored slivers (with the last sliver's padding)."""
        return self.bits.size * self.format.itemsize

    def unpack(self) -> Weights:
        """The row-major :class:`Weights` again (a new array)."""
        return Weights.from_bits(unpack_slivers(self.bits, self._n, self.format.packed_xor),
                                 self.format, self.scales, self.offsets)

    def decode(self) -> np.ndarray:
        """The exact float32 values as a new (k, n) array."""
        return self.unpack().decode()

    def __repr__(self) -> str:
        k, n = self.shape
        extra = "" if self.scales is None else f", scales={self.scales!r}"
        return (f"PackedWeights(k={k}, n={n}, format={self.format.name!r}, "
                f"width={self.width}, isa={self.isa!r}{extra})")


class TorchWeights:
    """A weight matrix in PyTorch's layout: ``(out_features, in_features)``, as
    ``torch.nn.Linear`` and checkpoints store it. :meth:`narrowmm.SafetensorsFile.__getitem__`
    returns this type for 2-D tensors.

    It is deliberately *not* a :class:`Weights` (narrowmm's ``(in_features, out_features)``
    = ``(k, n)`` layout): ``nm.matmul`` and ``Weights(...)`` refuse it, so a square matrix is
    never silently used the wrong way round. Turn it into something that computes with
    :class:`narrowmm.Linear` (``x @ W.T``), with :meth:`transpose` (narrowmm's layout, a
    copy), or with :meth:`pack` (the packed layout, straight from this one).

    Attributes:
        format: the :class:`~narrowmm.Format`.
        bits: ``(out_features, in_features)`` stored elements (uint16 / uint8 bits, or
            float32), sharing memory with what was wrapped (a memory-mapped file, say).
        scales: a scaled format's :class:`~narrowmm.Scales`, in this ``(out_features,
            in_features)`` orientation; None for the others.
    """

    __slots__ = ("bits", "format", "offsets", "scales")

    def __init__(self, bits: np.ndarray, format: str | Format,
                 scales: Scales | None = None, offsets: Scales | None = None) -> None:
        fmt = get_format(format)
        self.bits: np.ndarray = bits_array(bits, fmt)  # a 4-bit format: pairs along `in`
        self.format: Format = fmt
        shape = stored_shape(fmt, self.bits.shape, 1)
        self.scales: Scales | None = checked_scales(fmt, scales, shape)
        self.offsets: Scales | None = checked_offsets(fmt, offsets, self.scales, shape)
        check_block_rows(fmt, None if self.scales is None else self.scales.transpose(),
                         shape[1])

    @classmethod
    def wrap(cls, array: object) -> TorchWeights:
        """Wrap an ``(out_features, in_features)`` float16 / bfloat16 / float32 array or
        tensor without copying (the format is read from the dtype)."""
        w = Weights(array)
        return cls(w.bits, w.format)

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features)."""
        return stored_shape(self.format, self.bits.shape, 1)

    @property
    def out_features(self) -> int:
        return self.bits.shape[0]

    @property
    def in_features(self) -> int:
        return self.bits.shape[1] * self.format.kpack

    @property
    def nbytes(self) -> int:
        """Bytes of the stored elements."""
        return self.bits.size * self.format.itemsize

    def _kn_scales(self) -> Scales | None:
        return None if self.scales is None else self.scales.transpose()

    def _kn_offsets(self) -> Scales | None:
        return None if self.offsets is None else self.offsets.transpose()

    def transpose(self) -> Weights:
        """narrowmm's ``(in_features, out_features)`` :class:`Weights`: a transposed copy
        (GGUF's scales: held once, in the kernels' form, read as :class:`GridScales`)."""
        w = Weights.from_bits(np.ascontiguousarray(self.bits.T), self.format,
                              self._kn_scales(), self._kn_offsets())
        w.keep_kernel_scales_only()
        return w

    def pack(self) -> PackedWeights:
        """The native ISA row's packed layout (:meth:`Weights.pack`), built straight from
        this layout: no intermediate transposed copy (GGUF's scales: held once, in the
        kernels' form, read as :class:`GridScales`)."""

        c = checked_core()
        w = PackedWeights(pack_slivers(self.bits.T, int(c.pack_width(self.format.code)),
                                       self.format.packed_xor, c),
                          self.out_features, self.format, c.isa(), self._kn_scales(),
                          self._kn_offsets())
        w.keep_kernel_scales_only()
        return w

    def decode(self) -> np.ndarray:
        """The exact float32 weights as a new ``(out_features, in_features)`` array (scales,
        and offsets, applied)."""
        if self.format.kpack > 1:  # the pairs run along in_features here
            values = expand_pairs(decode(self.bits, self.format), 1)
            return values if self.scales is None else apply(values, self.scales, self.offsets)
        return Weights.from_bits(self.bits, self.format, self.scales, self.offsets).decode()

    def __repr__(self) -> str:
        extra = "" if self.scales is None else f", scales={self.scales!r}"
        return (f"TorchWeights(out_features={self.out_features}, "
                f"in_features={self.in_features}, format={self.format.name!r}{extra})")
