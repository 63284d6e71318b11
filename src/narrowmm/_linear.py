"""nm.Linear: a fully connected layer in PyTorch's convention, narrow weights kept narrow."""

from __future__ import annotations

import os

import numpy as np

from ._api import matmul
from ._interop import as_array
from ._safetensors import load_safetensors
from ._weights import PackedWeights, Weights


class Linear:
    """``y = x @ weight.T + bias`` with ``weight`` of shape ``(out_features, in_features)``.

    ``weight`` may be a NumPy float16 / float32 array, an ml_dtypes bfloat16 array, a
    PyTorch tensor (or any DLPack producer) in that layout, or :class:`Weights` (or
    :class:`PackedWeights`) already in narrowmm's ``(in_features, out_features)`` layout.
    The weights stay in their narrow format: an ``(out, in)`` array is transposed once, at
    construction, into a narrow copy of the same size; no float32 copy is ever made.
    :meth:`pack` packs them for the CPU (same outputs, faster at batch 1).

    Each output starts its fma chain from the bias: ``y[i, j]`` is
    ``fma(x[i, p], w[p, j], c)`` over p ascending from ``c = bias[j]`` (or +0.0), so a layer
    with a bias is one fused chain, as exact as the rest of the library.

    Args:
        weight: the weight matrix, ``(out_features, in_features)``, or ``Weights`` /
            ``PackedWeights``.
        bias: optional ``(out_features,)`` vector, float32 (or float16 / bfloat16, converted
            exactly).
    """

    __slots__ = ("bias", "weights")

    def __init__(self, weight: object, bias: object = None) -> None:
        if isinstance(weight, Weights | PackedWeights):
            self.weights = weight
        else:
            w = Weights(as_array(weight, "weight"))  # validates dtype and rank, no copy
            transposed = np.ascontiguousarray(w.bits.T)  # (in, out): narrowmm's layout
            self.weights = Weights.from_bits(transposed, w.format)
        self.bias = None if bias is None else self._bias(bias)

    def _bias(self, bias: object) -> np.ndarray:
        b = as_array(bias, "bias")
        if b.ndim != 1 or b.shape[0] != self.out_features:
            raise ValueError(f"bias must have shape ({self.out_features},), got {b.shape}")
        if b.dtype == np.float32:
            return np.array(b, dtype=np.float32)
        fmt = Weights(b[None, :])  # float16 / bfloat16: decode exactly
        return fmt.decode()[0]

    @property
    def in_features(self) -> int:
        return self.weights.shape[0]

    @property
    def out_features(self) -> int:
        return self.weights.shape[1]

    def __call__(self, x: object, out: np.ndarray | None = None) -> np.ndarray:
        """Apply the layer to float32 ``x`` of shape ``(m, in_features)`` or
        ``(in_features,)``; returns float32 ``(m, out_features)`` (or ``(out_features,)``),
        written into ``out`` if given."""
        return matmul(x, self.weights, out=out, bias=self.bias)

    @classmethod
    def from_safetensors(cls, path: str | os.PathLike[str], name: str,
                         bias: str | None = None) -> Linear:
        """The layer stored under ``name`` (a ``(out, in)`` weight) in a safetensors file.

        ``bias`` names the bias tensor; by default ``name`` with ``.weight`` replaced by
        ``.bias`` is used when the file has it.
        """
        f = load_safetensors(path)
        if bias is None and name.endswith(".weight"):
            guess = name[: -len("weight")] + "bias"
            bias = guess if guess in f.info else None
        weight = f[name]  # zero-copy view of the file, (out, in)
        b = None if bias is None else f.array(bias)
        if b is not None and f.info[bias].dtype == "BF16":
            b = Weights.from_bits(b[None, :], "bf16").decode()[0]
        layer = cls.__new__(cls)
        layer.weights = Weights.from_bits(np.ascontiguousarray(weight.bits.T), weight.format)
        layer.bias = None if b is None else layer._bias(b)
        return layer

    def pack(self) -> Linear:
        """Pack the weights for the native ISA row in use (:meth:`Weights.pack`): the same
        outputs, faster at batch 1. Returns the layer."""
        if isinstance(self.weights, Weights):
            self.weights = self.weights.pack()
        return self

    def __repr__(self) -> str:
        return (f"Linear(in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.weights.format.name!r}, bias={self.bias is not None})")
