"""Scales: the float32 factors that a scaled format's weights (FP8) are multiplied by.

Weight ``(p, j)`` of a ``(k, n)`` matrix is ``fl32(decode(q[p, j]) * s)``, one float32
rounding, where ``s = values[p // bk, j // bn]`` and ``block = (bk, bn)``; a block size of 0
means the whole dimension. One class covers the three kinds real checkpoints carry:

* one scale for the whole tensor: ``Scales.tensor(s)``, block ``(0, 0)``;
* one per output column (per channel): ``Scales.columns(s)``, block ``(0, 1)``;
* a 2-D grid of ``bk x bn`` blocks, as DeepSeek-V3 and Qwen3-FP8 store them (128 x 128):
  ``Scales.blocks(grid, (bk, bn))``.

The C kernels see none of this: they take one float per column for each block of rows
(:meth:`Scales.expanded`), so a new kind of scale, or an integer format with scales, is
new Python here, not new kernel code.
"""

from __future__ import annotations

import numpy as np

from ._exact import fma_f32

_F32 = np.dtype(np.float32)


def _blocks(size: int, block: int) -> int:
    """How many blocks of ``block`` (0: the whole dimension) cover ``size``."""
    return 1 if block == 0 else max(1, -(-size // block))


class Scales:
    """Float32 scales of a weight matrix, as a grid of blocks.

    Args:
        values: the grid, a 2-D float32 array (other float dtypes are converted); copied,
            and read-only here.
        block: ``(rows, columns)`` of one block; 0 means the whole dimension.

    The orientation is that of the matrix the scales belong to: narrowmm's ``(k, n)`` for
    :class:`~narrowmm.Weights`, PyTorch's ``(out_features, in_features)`` for
    :class:`~narrowmm.TorchWeights`; :meth:`transpose` turns one into the other.
    """

    __slots__ = ("block", "values")

    def __init__(self, values: object, block: tuple[int, int]) -> None:
        a = np.asarray(values)
        if a.dtype.kind != "f":
            raise TypeError(f"scales must be floating point, got {a.dtype}")
        if a.ndim != 2:
            raise ValueError(f"scales must be a 2-D grid, got shape {a.shape}")
        if len(block) != 2 or any(int(b) != b or b < 0 for b in block):
            raise ValueError(f"block must be two sizes >= 0 (0: the whole dimension), "
                             f"got {block!r}")
        with np.errstate(over="ignore"):
            values = np.array(a, dtype=np.float32, order="C")  # a copy of its own
        values.flags.writeable = False  # the kernels' form is made from it once
        self.values: np.ndarray = values
        self.block: tuple[int, int] = (int(block[0]), int(block[1]))

    @classmethod
    def tensor(cls, scale: float) -> Scales:
        """One scale for the whole matrix."""
        return cls(np.full((1, 1), scale, np.float32), (0, 0))

    @classmethod
    def columns(cls, scales: object) -> Scales:
        """One scale per column (per output feature) of a ``(k, n)`` matrix: shape ``(n,)``."""
        a = np.asarray(scales)
        if a.ndim != 1:
            raise ValueError(f"per-column scales must be 1-D (n,), got shape {a.shape}")
        return cls(a[None, :], (0, 1))

    @classmethod
    def blocks(cls, grid: object, block: tuple[int, int]) -> Scales:
        """A ``(ceil(rows / bk), ceil(cols / bn))`` grid of scales for ``(bk, bn)`` blocks."""
        if any(b <= 0 for b in block):
            raise ValueError(f"block sizes must be positive, got {block!r}")
        return cls(grid, block)

    @property
    def kind(self) -> str:
        """``"tensor"``, ``"columns"``, ``"rows"`` or ``"blocks"``."""
        bk, bn = self.block
        if bk == 0 and bn == 0:
            return "tensor"
        if bk == 0 and bn == 1:
            return "columns"
        if bk == 1 and bn == 0:
            return "rows"
        return "blocks"

    def grid_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        """The grid these scales must have for a matrix of ``shape``."""
        return _blocks(shape[0], self.block[0]), _blocks(shape[1], self.block[1])

    def check(self, shape: tuple[int, int], what: str = "weights") -> None:
        """Raise ValueError unless the grid covers a matrix of ``shape`` exactly."""
        want = self.grid_shape(shape)
        if self.values.shape != want:
            raise ValueError(
                f"scales of shape {self.values.shape} in blocks of {self.block} do not fit "
                f"{what} of shape {tuple(shape)}: expected a grid of shape {want}")

    def take_rows(self, lo: int, hi: int) -> Scales:
        """The scales of rows ``[lo, hi)`` of the matrix, for that sub-matrix: a block of
        rows that the range cuts becomes one row of scales per matrix row (the values are
        the same, only their bookkeeping changes)."""
        bk, bn = self.block
        if bk == 0:
            return Scales(self.values, self.block)
        return Scales(self.values[np.arange(lo, hi) // bk], (1, bn))

    def take_columns(self, lo: int, hi: int) -> Scales:
        """The scales of columns ``[lo, hi)``, for that sub-matrix (as :meth:`take_rows`)."""
        return self.transpose().take_rows(lo, hi).transpose()

    def transpose(self) -> Scales:
        """The same scales for the transposed matrix."""
        return Scales(self.values.T, (self.block[1], self.block[0]))

    def expanded(self, shape: tuple[int, int], ld: int) -> tuple[np.ndarray, int]:
        """The form the kernels take: ``(array, bk)`` with ``array[r, j]`` the scale of
        column j in rows ``[r * bk, (r + 1) * bk)``, ``ld >= n`` columns, the ones past n
        set to 1.0 (packed weights read them with their zero padding)."""
        k, n = shape
        bk = self.block[0] if self.block[0] else max(k, 1)
        bn = self.block[1]
        cols = np.zeros(n, np.intp) if bn == 0 else np.arange(n) // bn
        out = np.ones((_blocks(k, self.block[0]), ld), np.float32)
        out[:, :n] = self.values[:, cols]
        return out, bk

    def __repr__(self) -> str:
        return f"Scales({self.kind}, grid={self.values.shape}, block={self.block})"


# Elements of one slice of rows that apply() scales at a time: its temporaries (a float32
# grid of the slice, float64 products with offsets) stay a few tens of MB however large the
# matrix (a Llama-3 embedding table is 525 million weights).
_APPLY_CHUNK = 1 << 20


def _slice_grid(scales: Scales, r0: int, r1: int, n: int) -> np.ndarray:
    """The scale of every element of rows ``[r0, r1)`` of an ``n``-column matrix, as an
    array that broadcasts against those rows (one column when a scale spans all columns)."""
    bk, bn = scales.block
    rows = np.zeros(r1 - r0, np.intp) if bk == 0 else np.arange(r0, r1) // bk
    grid = scales.values[rows]
    if bn == 0:
        return grid[:, :1]
    return grid if bn == 1 else np.repeat(grid, bn, axis=1)[:, :n]


def _fma_slice(q: np.ndarray, s: np.ndarray, o: np.ndarray) -> np.ndarray:
    """float32 ``fma(q, s, o)`` of one slice: ``q * s`` rounded, plus ``o``, where every
    product is exact in float32 (GGUF's: a small integer times a binary16 number, or a K
    type's exact ``d * sc``), so the one rounding is the sum's; else fma_f32."""
    with np.errstate(all="ignore"):
        prod = q.astype(np.float64) * s  # exact: 24 + 24 significant bits
        prod32 = prod.astype(np.float32)
        if np.array_equal(prod32, prod):  # no product rounded (nor overflowed)
            return prod32 + o
    return fma_f32(q, s, o)


def apply(decoded: np.ndarray, scales: Scales, offsets: Scales | None = None) -> np.ndarray:
    """``fl32(decoded * scale)`` element by element for a ``(k, n)`` float32 matrix, or
    ``fma(decoded, scale, offset)`` with offsets: the weights a scaled format stands for
    (one float32 rounding each). Computed in place, ``decoded`` (a fresh array of the
    caller's) is returned, a slice of rows at a time: the memory it takes beyond the matrix
    stays bounded."""
    k, n = decoded.shape
    if decoded.size == 0:  # nothing to scale; k may still be huge (2^62 x 0 in a file)
        return decoded
    step = max(1, _APPLY_CHUNK // n)
    for r0 in range(0, k, step):
        r1 = min(k, r0 + step)
        part = decoded[r0:r1]
        grid = _slice_grid(scales, r0, r1, n)
        if offsets is None:
            with np.errstate(all="ignore"):
                np.multiply(part, grid, out=part)
        else:
            part[...] = _fma_slice(part, grid, _slice_grid(offsets, r0, r1, n))
    return decoded
