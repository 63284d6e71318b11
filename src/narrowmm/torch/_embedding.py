"""A token embedding table kept in its narrow format (:class:`Embedding`): the rows looked
up are decoded exactly, so a model gets the values of the whole table decoded to float32
without holding that table."""

from __future__ import annotations

import numpy as np
import torch

from .._codecs import decode
from .._formats import Format
from .._scales import Scales, apply
from .._weights import TorchWeights
from ._layer import _BY_CODE, _eager


def _row_grid(scales: Scales, rows: int, cols: int) -> tuple[np.ndarray, int]:
    """``scales`` of a ``(rows, cols)`` matrix as one grid row per matrix row and a scale per
    ``block`` columns: ``(grid (rows, ceil(cols / block)) float32, block)``, a new array."""
    br, bc = scales.block
    index = np.zeros(rows, np.intp) if br == 0 else np.arange(rows) // br
    grid = np.array(scales.values[index], dtype=np.float32)  # its own, writable
    return grid, (cols if bc == 0 else bc)


_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _rows(ids: np.ndarray, bits: np.ndarray, scales: np.ndarray | None,
          offsets: np.ndarray | None, fmt: Format, block: int, dim: int) -> np.ndarray:
    """Rows ``ids`` of a narrow table (codes ``bits``, one grid row of scales and offsets per
    table row, a scale per ``block`` values), decoded: ``ids.shape + (dim,)`` float32."""
    if ids.dtype.kind not in "iu":
        raise TypeError(f"embedding ids must be integers, got {ids.dtype}")
    flat = ids.reshape(-1).astype(np.intp, copy=False)
    bad = (flat < 0) | (flat >= bits.shape[0])
    if bad.any():
        raise IndexError(f"embedding id {int(flat[bad][0])} is outside [0, {bits.shape[0]})")
    codes = bits[flat]
    if fmt.name == "f32":
        values = np.array(codes.view(np.float32))
    else:
        values = decode(codes, fmt).reshape(len(flat), dim)
    if scales is not None:
        apply(values, Scales(scales[flat], (1, block)),
              None if offsets is None else Scales(offsets[flat], (1, block)))
    return values.reshape(*ids.shape, dim)


@torch.library.custom_op("narrowmm::embedding", mutates_args=(), device_types="cpu")
def _embedding_op(ids: torch.Tensor, bits: torch.Tensor, scales: torch.Tensor | None,
                  offsets: torch.Tensor | None, format_code: int, scale_block: int,
                  dim: int) -> torch.Tensor:
    """Rows ``ids`` of a narrow table, float32 ``ids.shape + (dim,)``: ``bits`` the codes a
    row (16-bit formats as int16), ``scales`` and ``offsets`` float32, a grid row per table
    row and a scale per ``scale_block`` values (:class:`Embedding`)."""
    fmt = _BY_CODE[format_code]
    b = bits.numpy()
    return torch.from_numpy(_rows(ids.numpy(), b.view(np.uint16) if fmt.itemsize == 2 else b,
                                  None if scales is None else scales.numpy(),
                                  None if offsets is None else offsets.numpy(), fmt,
                                  scale_block, dim))


@_embedding_op.register_fake
def _embedding_fake(ids, bits, scales, offsets, format_code, scale_block, dim):
    return ids.new_empty((*ids.shape, dim), dtype=torch.float32)


class Embedding(torch.nn.Module):
    """``nn.Embedding``'s lookup on a table kept in a narrow format (a GGUF file's blocks,
    bf16, ...): the row of each id is the exact float32 decode of that row, the value the
    whole table decoded (:meth:`narrowmm.TorchWeights.decode`) holds, bit for bit; the
    table itself is never made unless :attr:`weight` is read.

    The codes (``weight_bits``), and the scales and offsets of a scaled format as one grid
    row per token (``weight_scales``, ``weight_offsets``, a scale per ``scale_block``
    values), are non-persistent buffers, as :class:`Linear`'s. Inference only. Build one with
    :meth:`from_weights`.
    """

    def __init__(self, weights: TorchWeights) -> None:
        super().__init__()
        if not isinstance(weights, TorchWeights):
            raise TypeError(f"Embedding takes narrowmm.TorchWeights, got "
                            f"{type(weights).__name__}")
        self.num_embeddings, self.embedding_dim = weights.out_features, weights.in_features
        self.format: Format = weights.format
        bits = np.ascontiguousarray(weights.bits)
        if not bits.flags.writeable:  # torch wants a writable array; nothing writes it
            bits = bits.copy()
        bits = bits.view(np.int16) if self.format.itemsize == 2 else bits
        self.register_buffer("weight_bits", torch.from_numpy(bits), persistent=False)
        shape = (self.num_embeddings, self.embedding_dim)
        self.scale_block = 0
        scales = offsets = None
        if weights.scales is not None:
            scales, self.scale_block = _row_grid(weights.scales, *shape)
            if weights.offsets is not None:
                offsets, block = _row_grid(weights.offsets, *shape)
                if block != self.scale_block:
                    raise ValueError(f"the offsets' blocks of {block} values differ from the "
                                     f"scales' {self.scale_block}")
        self.register_buffer("weight_scales", None if scales is None
                             else torch.from_numpy(scales), persistent=False)
        self.register_buffer("weight_offsets", None if offsets is None
                             else torch.from_numpy(offsets), persistent=False)

    @classmethod
    def from_weights(cls, weights: TorchWeights) -> Embedding:
        """The embedding of a checkpoint tensor in PyTorch's ``(num_embeddings,
        embedding_dim)`` reading (``narrowmm.load_gguf(path)["token_embd.weight"]``)."""
        return cls(weights)

    def _bits(self) -> np.ndarray:
        bits = self.weight_bits.numpy()
        return bits.view(np.uint16) if self.format.itemsize == 2 else bits

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The float32 rows of ``ids`` (integers in ``[0, num_embeddings)``, any shape):
        ``ids.shape + (embedding_dim,)``."""
        def array(t: torch.Tensor | None) -> np.ndarray | None:
            return None if t is None else t.numpy()
        return _rows(np.asarray(ids), self._bits(), array(self.weight_scales),
                     array(self.weight_offsets), self.format, self.scale_block,
                     self.embedding_dim)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in _ID_DTYPES:
            raise TypeError(f"narrowmm.torch.Embedding takes integer ids, got {input.dtype}")
        if _eager(input):
            return torch.from_numpy(self.rows(input.numpy()))
        # traced: the registered operator, which torch.compile and export see
        return torch.ops.narrowmm.embedding(input, self.weight_bits, self.weight_scales,
                                            self.weight_offsets, self.format.code,
                                            self.scale_block, self.embedding_dim)

    @property
    def weight(self) -> torch.Tensor:
        """The whole table decoded to float32, ``(num_embeddings, embedding_dim)``: a new
        tensor at each read (it takes four bytes a value), for code that wants the table
        itself; the lookup never makes it."""
        return torch.from_numpy(self.rows(np.arange(self.num_embeddings)))

    def spec(self) -> tuple:
        """What :class:`Decoder`'s C plan takes for this table: ``(format code, bits,
        scales or None, offsets or None, scale_block)``."""
        def array(t: torch.Tensor | None) -> np.ndarray | None:
            return None if t is None else t.numpy()
        return (self.format.code, self._bits(), array(self.weight_scales),
                array(self.weight_offsets), self.scale_block)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, format={self.format.name!r}"
                + (f", scale_block={self.scale_block}" if self.scale_block else ""))
