"""A token embedding table kept in its narrow format (:class:`Embedding`): the rows looked
up are decoded exactly, so a model gets the values of the whole table decoded to float32
without holding that table."""

from __future__ import annotations

import numpy as np
import torch

from .._formats import Format
from .._scales import Scales
from .._weights import TorchWeights, factored_values
from ._layer import _BY_CODE, Linear, _eager, _numpy_bits, buffer_grid, numpy_grid


def _row_grid(scales: Scales, rows: int, cols: int) -> tuple[np.ndarray, int]:
    """``scales`` of a ``(rows, cols)`` matrix as one grid row per matrix row and a scale per
    ``block`` columns: ``(grid (rows, ceil(cols / block)) float32, block)``, a new array."""
    br, bc = scales.block
    index = np.zeros(rows, np.intp) if br == 0 else np.arange(rows) // br
    grid = np.array(scales.values[index], dtype=np.float32)  # its own, writable
    return grid, (cols if bc == 0 else bc)


_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _flat_ids(ids: np.ndarray, count: int) -> np.ndarray:
    """``ids`` (integers in ``[0, count)``, any shape) as a flat intp array."""
    if ids.dtype.kind not in "iu":
        raise TypeError(f"embedding ids must be integers, got {ids.dtype}")
    flat = ids.reshape(-1).astype(np.intp, copy=False)
    bad = (flat < 0) | (flat >= count)
    if bad.any():
        raise IndexError(f"embedding id {int(flat[bad][0])} is outside [0, {count})")
    return flat


def _decoded(codes: np.ndarray, fmt: Format, rows: int, dim: int, scales: np.ndarray | None,
             offsets: np.ndarray | None, block: int) -> np.ndarray:
    """``rows`` table rows from their codes (``(rows, dim / kpack)``) and grid rows of scales
    and offsets (a scale per ``block`` values): float32 ``(rows, dim)``, as
    :meth:`TorchWeights.decode` decodes those rows."""
    if rows == 0:  # no row: nothing to decode (a grid of no rows does not fit Scales)
        return np.empty((0, dim), np.float32)

    def grid(values: np.ndarray | None) -> Scales | None:
        return None if values is None else Scales(values, (1, block))

    weights = TorchWeights(np.ascontiguousarray(codes), fmt, grid(scales), grid(offsets))
    return weights.decode().reshape(rows, dim)


def _rows(ids: np.ndarray, bits: np.ndarray, scales: np.ndarray | None,
          offsets: np.ndarray | None, fmt: Format, block: int, dim: int) -> np.ndarray:
    """Rows ``ids`` of a narrow table (codes ``bits``, one grid row of scales and offsets per
    table row, a scale per ``block`` values), decoded: ``ids.shape + (dim,)`` float32."""
    flat = _flat_ids(ids, bits.shape[0])
    values = _decoded(bits[flat], fmt, len(flat), dim,
                      None if scales is None else scales[flat],
                      None if offsets is None else offsets[flat], block)
    return values.reshape(*ids.shape, dim)


def _tied_rows(ids: np.ndarray, bits: np.ndarray, grid: np.ndarray | None, fmt: Format,
               count: int, block: int, dim: int) -> np.ndarray:
    """Rows ``ids`` of a table tied to a :class:`Linear` (``count`` output features of
    ``dim`` inputs): row t is the layer's output feature t, its codes and scales read where
    the kernels read them, row-major ``(dim / kpack, n)`` or packed ``(groups, dim / kpack,
    width)`` bits, a kernels' grid (``Weights.kernel_scales``: the scales, then the offsets;
    2-D, or sliver-major 3-D for packed weights; float16, float32 or factored) of ``block``
    rows."""
    flat = _flat_ids(ids, count)
    if bits.ndim == 3:  # packed: column t in group t // width, at t % width
        width = bits.shape[2]
        codes = bits[flat // width, :, flat % width]
        if fmt.packed_xor:  # the packed bytes as the codes they hold
            codes = codes ^ np.uint8(fmt.packed_xor)
    else:
        codes = bits[:, flat].T
    scales = offsets = None
    if grid is not None:
        parts = 2 if fmt.offsets else 1
        if grid.dtype == np.int8:  # factored: these columns multiplied out as the kernels do
            values = factored_values(grid, parts, -(-dim // block), flat)
            blocks = values.shape[0] // parts
            scales = values[:blocks].T
            if fmt.offsets:
                offsets = values[blocks:].T
        elif grid.ndim == 3:
            width, slivers = grid.shape[2], grid.shape[0] // parts
            scales = grid[flat // width, :, flat % width]
            if fmt.offsets:
                offsets = grid[slivers + flat // width, :, flat % width]
        else:
            blocks = grid.shape[0] // parts
            scales = grid[:blocks, flat].T
            if fmt.offsets:
                offsets = grid[blocks:, flat].T
        scales = scales.astype(np.float32)  # float16 grids: exact
        offsets = None if offsets is None else offsets.astype(np.float32)
    values = _decoded(codes, fmt, len(flat), dim, scales, offsets, block)
    return values.reshape(*ids.shape, dim)


def _numpy_grid(grid: torch.Tensor | None) -> np.ndarray | None:
    return None if grid is None else numpy_grid(grid)


@torch.library.custom_op("narrowmm::embedding", mutates_args=(), device_types="cpu")
def _embedding_op(ids: torch.Tensor, bits: torch.Tensor, scales: torch.Tensor | None,
                  offsets: torch.Tensor | None, format_code: int, scale_block: int,
                  dim: int) -> torch.Tensor:
    """Rows ``ids`` of a narrow table, float32 ``ids.shape + (dim,)``: ``bits`` the codes a
    row (16-bit formats as int16), ``scales`` and ``offsets`` float32, a grid row per table
    row and a scale per ``scale_block`` values (:class:`Embedding`)."""
    fmt = _BY_CODE[format_code]
    return torch.from_numpy(_rows(ids.numpy(), _numpy_bits(bits, fmt), _numpy_grid(scales),
                                  _numpy_grid(offsets), fmt, scale_block, dim))


@_embedding_op.register_fake
def _embedding_fake(ids, bits, scales, offsets, format_code, scale_block, dim):
    return ids.new_empty((*ids.shape, dim), dtype=torch.float32)


@torch.library.custom_op("narrowmm::tied_embedding", mutates_args=(), device_types="cpu")
def _tied_embedding_op(ids: torch.Tensor, bits: torch.Tensor, scales: torch.Tensor | None,
                       format_code: int, count: int, scale_block: int,
                       dim: int) -> torch.Tensor:
    """Rows ``ids`` of a table tied to a narrowmm Linear of ``count`` output features: the
    layer's ``weight_bits`` and ``weight_scales`` as it holds them (:class:`Embedding`)."""
    fmt = _BY_CODE[format_code]
    return torch.from_numpy(_tied_rows(ids.numpy(), _numpy_bits(bits, fmt),
                                       _numpy_grid(scales), fmt, count, scale_block, dim))


@_tied_embedding_op.register_fake
def _tied_embedding_fake(ids, bits, scales, format_code, count, scale_block, dim):
    return ids.new_empty((*ids.shape, dim), dtype=torch.float32)


class Embedding(torch.nn.Module):
    """``nn.Embedding``'s lookup on a table kept in a narrow format (a GGUF file's blocks,
    bf16, ...): the row of each id is the exact float32 decode of that row, the value the
    whole table decoded (:meth:`narrowmm.TorchWeights.decode`) holds, bit for bit; the
    table itself is never made unless :attr:`weight` is read.

    From a table (:meth:`from_weights`), the codes (``weight_bits``), and the scales and
    offsets of a scaled format as one grid row per token (``weight_scales``,
    ``weight_offsets``, a scale per ``scale_block`` values, stored as their int32 bits so
    that ``model.half()`` leaves them alone), are non-persistent buffers, as
    :class:`Linear`'s. Tied to an output layer (:meth:`tied_to`, a tied model's table), it
    holds nothing of its own: row t is the layer's output feature t, read from the layer's
    buffers. Inference only.
    """

    def __init__(self, weights: TorchWeights | Linear) -> None:
        super().__init__()
        self.scale_block = 0
        scales = offsets = bits = None
        self._tied: tuple[Linear, ...] = ()  # a tuple: not a second child module
        if isinstance(weights, Linear):
            fmt = weights.format
            if fmt.scaled and fmt.scale_exponent:
                raise ValueError(f"an embedding cannot be tied to a {fmt.name} layer (its "
                                 f"kernels hold its scales times 2^{fmt.scale_exponent})")
            self._tied = (weights,)
            self.num_embeddings, self.embedding_dim = weights.out_features, weights.in_features
            self.format: Format = fmt
            self.scale_block = weights.scale_block
        elif isinstance(weights, TorchWeights):
            self.num_embeddings, self.embedding_dim = weights.out_features, weights.in_features
            self.format = weights.format
            bits = np.ascontiguousarray(weights.bits)
            if not bits.flags.writeable:  # torch wants a writable array; nothing writes it
                bits = bits.copy()
            bits = torch.from_numpy(bits.view(np.int16) if self.format.itemsize == 2 else bits)
            shape = (self.num_embeddings, self.embedding_dim)
            if weights.scales is not None:
                scales, self.scale_block = _row_grid(weights.scales, *shape)
                if weights.offsets is not None:
                    offsets, block = _row_grid(weights.offsets, *shape)
                    if block != self.scale_block:
                        raise ValueError(f"the offsets' blocks of {block} values differ from "
                                         f"the scales' {self.scale_block}")
        else:
            raise TypeError(f"Embedding takes narrowmm.TorchWeights or a narrowmm Linear, got "
                            f"{type(weights).__name__}")
        self.register_buffer("weight_bits", bits, persistent=False)
        # as their int32 bits, as Linear's grids: dtype casts of the model keep them
        self.register_buffer("weight_scales", None if scales is None
                             else buffer_grid(scales), persistent=False)
        self.register_buffer("weight_offsets", None if offsets is None
                             else buffer_grid(offsets), persistent=False)

    @classmethod
    def from_weights(cls, weights: TorchWeights) -> Embedding:
        """The embedding of a checkpoint tensor in PyTorch's ``(num_embeddings,
        embedding_dim)`` reading (``narrowmm.load_gguf(path)["token_embd.weight"]``)."""
        return cls(weights)

    @classmethod
    def tied_to(cls, layer: Linear) -> Embedding:
        """The embedding whose table is ``layer``'s weights, ``(out_features, in_features)``
        (a model with tied input and output embeddings): no copy of them. Not for FP8 layers,
        whose kernels hold their scales scaled."""
        return cls(layer)

    @property
    def tied(self) -> Linear | None:
        """The output layer this table is tied to, or None."""
        return self._tied[0] if self._tied else None

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The float32 rows of ``ids`` (integers in ``[0, num_embeddings)``, any shape):
        ``ids.shape + (embedding_dim,)``."""
        ids = np.asarray(ids)
        if self._tied:
            layer = self._tied[0]
            return _tied_rows(ids, _numpy_bits(layer.weight_bits, self.format),
                              _numpy_grid(layer.weight_scales), self.format,
                              self.num_embeddings, self.scale_block, self.embedding_dim)
        return _rows(ids, _numpy_bits(self.weight_bits, self.format),
                     _numpy_grid(self.weight_scales), _numpy_grid(self.weight_offsets),
                     self.format, self.scale_block, self.embedding_dim)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in _ID_DTYPES:
            raise TypeError(f"narrowmm.torch.Embedding takes integer ids, got {input.dtype}")
        if _eager(input):
            return torch.from_numpy(self.rows(input.numpy()))
        # traced: the registered operators, which torch.compile and export see
        if self._tied:
            layer = self._tied[0]
            return torch.ops.narrowmm.tied_embedding(
                input, layer.weight_bits, layer.weight_scales, self.format.code,
                self.num_embeddings, self.scale_block, self.embedding_dim)
        return torch.ops.narrowmm.embedding(input, self.weight_bits, self.weight_scales,
                                            self.weight_offsets, self.format.code,
                                            self.scale_block, self.embedding_dim)

    @property
    def weight(self) -> torch.Tensor:
        """The whole table decoded to float32, ``(num_embeddings, embedding_dim)``: a new
        tensor at each read (it takes four bytes a value), for code that wants the table
        itself; the lookup never makes it."""
        return torch.from_numpy(self.rows(np.arange(self.num_embeddings)))

    def spec(self) -> tuple | None:
        """What :class:`Decoder`'s C plan takes for this table: ``(format code, bits,
        scales or None, offsets or None, scale_block)``, or None when it is tied to the
        output layer (the plan reads that layer's weights)."""
        if self._tied:
            return None
        return (self.format.code, _numpy_bits(self.weight_bits, self.format),
                _numpy_grid(self.weight_scales), _numpy_grid(self.weight_offsets),
                self.scale_block)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, format={self.format.name!r}"
                + (f", scale_block={self.scale_block}" if self.scale_block else "")
                + (", tied to the output layer" if self._tied else ""))
